"""The noise levels of posterior sampling: the task-shaped ``Sigma_k`` and its target.

For a :class:`~.problem.DiagonalProblem` ``(z, Sigma_y)`` and a level ``sigma_k`` (one per
chain), coefficient by coefficient in the basis (arXiv 2605.15487, the task-shaped covariance),
one of two shapes::

    "scaled":  Sigma_k = (sigma_k^2 / sigma_max^2) Sigma_y                                (V.1a)
    "clipped": Sigma_k = min(Sigma_y, sigma_k^2)                                           (V.1)

(V.1a) is the authors' (their samplers scale the task covariance, ``Sigma_k = sigma_k^2
S_task``, here with ``S_task = Sigma_y / sigma_max^2`` so that ``Sigma_0 = Sigma_y``): every
coefficient shrinks by the same factor, the observed ones to variances far below the noise of
the measurement. (V.1) is ours: a coefficient keeps the measurement's variance until the level
falls below it, so the network is only asked about variances in its training range. Both
satisfy ``Sigma_{k+1} <= Sigma_k <= Sigma_y`` entry by entry, which is all that follows needs;
:func:`covariance_level` builds the same quantities for any such ``Sigma_k`` (the per-entry
adaptive schedule).

With ``x_k = x + Sigma_k^{1/2} eps`` the chain ``x -> x_{k+1} -> x_k -> z`` only adds noise
(``z = x_k + (Sigma_y - Sigma_k)^{1/2} eps'``), so

* at ``sigma_0 = sigma_max`` every coefficient has ``Sigma_0 = Sigma_y``: ``x_0 = z`` on the
  observed coefficients, ``z + sigma_max xi`` on the missing ones;
* ``p(x_{k+1} | x_k, z) = p(x_{k+1} | x_k)``: the predictor needs the prior score only,
  ``x_{k+1} = x_k - D_k grad U(x_k, Sigma_k) + D_k^{1/2} xi`` with ``D_k = Sigma_k - Sigma_{k+1}``;
* the level's posterior, the corrector's target, is ``p(x_k | z) ∝ exp(-E_k(x_k))`` with::

      E_k(x) = U(x, Sigma_k) + 1/2 <x - z, W_k (x - z)>,
      W_k = 1 / (Sigma_y - Sigma_k)   on free observed coefficients (sigma_k^2 < Sigma_y),
            0                         on missing and on clamped ones                        (V.2)

  Clamped coefficients (``Sigma_k = Sigma_y``) equal ``z`` and do not move: the corrector's
  preconditioner is ``p_k = (1/Sigma_k + W_k)^{-1} / sigma_k^2`` on free coefficients (1 on the
  missing ones, the conditional variance scale on the observed ones) and 0 on clamped ones.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from jaxlib_ext.samplers._common import expand_batch
from jaxlib_ext.samplers.energy.covariance import Covariance
from jaxlib_ext.samplers.energy.energy import EnergyFn, energy_and_grads
from jaxlib_ext.samplers.energy.problem import DiagonalProblem

__all__ = ["LEVEL_SHAPES", "Level", "Evaluation", "covariance_level", "evaluate",
           "geometric_sigmas", "initial_position", "level"]

#: ``"scaled"``: (V.1a), the authors'; ``"clipped"``: (V.1), ours.
LEVEL_SHAPES = ("scaled", "clipped")


class Level(NamedTuple):
    """One level's quantities, in the problem's basis.

    Attributes:
      cov: ``Sigma_k`` (V.1) or (V.1a).
      weight: ``W_k`` of (V.2).
      precond: the corrector's preconditioner ``p_k`` (0 on clamped coefficients).
      free: bool, the coefficients with ``Sigma_k < Sigma_y``.
    """

    cov: Covariance
    weight: jax.Array
    precond: Covariance
    free: jax.Array


class Evaluation(NamedTuple):
    """The level's target at a position, from one reverse pass.

    Attributes:
      energy: ``E_k(x)`` of (V.2) ``[B]``.
      grad: ``grad E_k(x)``.
      prior_grad: the prior score ``grad_y U(x, Sigma_k)``.
      noise_score: ``dU / d diag(Sigma_k)`` (E.4).
    """

    energy: jax.Array
    grad: jax.Array
    prior_grad: jax.Array
    noise_score: jax.Array


def geometric_sigmas(sigma_begin: float, sigma_end: float, num: int):
    """Geometrically spaced noise levels.

    Args:
      sigma_begin: the first level.
      sigma_end: the last level, in ``(0, sigma_begin)``.
      num: the number of levels (>= 2).

    Returns:
      ``[num]`` levels from ``sigma_begin`` down to ``sigma_end``.
    """
    if num < 2:
        raise ValueError(f"num_levels: expected >= 2, got {num}")
    if not sigma_begin > sigma_end > 0:
        raise ValueError(f"sigma_begin, sigma_end: expected begin > end > 0, got {sigma_begin}, "
                         f"{sigma_end}")
    return jnp.geomspace(sigma_begin, sigma_end, num)


def check_level_shape(shape: str) -> str:
    """Check a level shape's name.

    Args:
      shape: ``"scaled"`` (V.1a) or ``"clipped"`` (V.1).

    Returns:
      ``shape``.

    Raises:
      ValueError: another name (the error names the ``levels`` argument).
    """
    if shape not in LEVEL_SHAPES:
        raise ValueError(f"levels: expected one of {LEVEL_SHAPES}, got {shape!r}")
    return shape


def level(problem: DiagonalProblem, sigma2, shape: str = "scaled") -> Level:
    """The task-shaped level (V.1a) or (V.1) with its target (V.2).

    Args:
      problem: the :class:`~.problem.DiagonalProblem`.
      sigma2: ``sigma_k^2``, per chain ``[B]`` or a scalar.
      shape: ``"scaled"`` (V.1a, the authors') or ``"clipped"`` (V.1, ours).

    Returns:
      The :class:`Level`.

    References:
      arXiv 2605.15487 (the task-shaped covariance).
    """
    check_level_shape(shape)
    sy = problem.cov.diag
    s2 = jnp.broadcast_to(expand_batch(jnp.asarray(sigma2, sy.dtype), sy), sy.shape)
    if shape == "scaled":
        cov_k = jnp.minimum(sy * (s2 / problem.sigma_max ** 2), sy)                 # (V.1a)
    else:
        cov_k = jnp.minimum(sy, s2)                                                  # (V.1)
    return _level_of(problem, cov_k, s2)


def covariance_level(problem: DiagonalProblem, cov_diag) -> Level:
    """The target (V.2) of any level ``Sigma_k = diag(cov_diag) <= Sigma_y``.

    The preconditioner is relative to each entry's own variance (1 on missing coefficients).

    Args:
      problem: the :class:`~.problem.DiagonalProblem`.
      cov_diag: ``Sigma_k``'s variances in the problem's basis, ``z``'s shape (clipped to
        ``Sigma_y``).

    Returns:
      The :class:`Level`.
    """
    cov_k = jnp.minimum(jnp.asarray(cov_diag, problem.cov.diag.dtype), problem.cov.diag)
    return _level_of(problem, cov_k, cov_k)


def _level_of(problem, cov_k, s2):
    sy = problem.cov.diag
    free = cov_k < sy
    obs_free = free & problem.observed
    gap = jnp.where(obs_free, sy - cov_k, 1.0)
    weight = jnp.where(obs_free, 1.0 / gap, 0.0)
    safe = jnp.where(free, cov_k, 1.0)
    p = jnp.where(free, 1.0 / (1.0 / safe + weight) / jnp.where(free, s2, 1.0), 0.0)
    basis = problem.cov.basis
    return Level(Covariance(cov_k, basis), weight, Covariance(p, basis), free)


def evaluate(energy_fn: EnergyFn, problem: DiagonalProblem, lev: Level, x) -> Evaluation:
    """The level's target ``E_k(x)`` (V.2) with its gradient, from one reverse pass through
    ``U``.

    Args:
      energy_fn: ``U(y, cov) -> [B]``.
      problem: the :class:`~.problem.DiagonalProblem`.
      lev: the :class:`Level`.
      x: positions ``[B, ...]``.

    Returns:
      The :class:`Evaluation`.
    """
    u, gu, gs = energy_and_grads(energy_fn, x, lev.cov)
    r = x - problem.z
    e = u + 0.5 * lev.cov.quad(r, lev.weight)
    g = gu + lev.cov.apply_diag(r, lev.weight)
    return Evaluation(e, g, gu, gs)


def initial_position(rng_key, problem: DiagonalProblem):
    """The start ``x_0`` at ``sigma_0 = sigma_max``.

    Args:
      rng_key: a PRNG key.
      problem: the :class:`~.problem.DiagonalProblem`.

    Returns:
      ``x_0``: ``z`` plus ``sigma_max`` noise on the missing coefficients, ``z``'s shape.
    """
    z = problem.z
    cov = problem.cov
    xi = jax.random.normal(rng_key, z.shape, z.dtype)
    noise = cov.apply_diag(xi, jnp.where(problem.observed, 0.0, problem.sigma_max))
    return z + noise
