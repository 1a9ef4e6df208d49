"""Preconditioned Langevin moves with a state-dependent step and the exact MH correction.

One move on a batch of independent chains, each targeting ``pi(x) ∝ exp(-E(x) / T)``, with a
preconditioner ``S = F^* diag(p) F`` diagonal in the pixel or Fourier basis (``p >= 0``; where
``p = 0`` the coordinate does not move) and step size ``h``::

    x' = x - h S grad E(x) + sqrt(2 T h) S^{1/2} xi,            xi ~ N(0, I)            (M.1)

``metropolis=False`` is the unadjusted (ULA) corrector of the predictor-corrector sampler;
``metropolis=True`` accepts ``x'`` with probability ``min(1, a)`` (PC-MALA, arXiv 2605.15487)::

    log a = (E(x) - E(x')) / T + log q(x | x') - log q(x' | x)                             (M.2)
    log q(x' | x) = -sum_{p_k > 0} |F(x' - x + h(x) S grad E(x))_k|^2 / (4 T h(x) p_k)
                    - (r / 2) log h(x) + const,          r = #{k : p_k > 0}                (M.3)

The step size is either fixed or the signal-to-noise rule of the predictor-corrector sampler
(Song et al. 2021; arXiv 2605.15487)::

    h(x) = 2 (snr sqrt(r) / || S^{1/2} grad E(x) ||)^2                                      (M.4)

(``sqrt(r)`` = the expected norm of ``S``'s share of the noise, so ``h`` is a function of the
state alone). Because ``h`` depends on the state, the reverse density ``q(x | x')`` of (M.3) uses
``h(x')``, recomputed from ``grad E(x')``; using ``h(x)`` for both directions breaks detailed
balance. The log-normaliser ``-(r/2) log h`` then differs between the two directions and is
kept.

(M.1)-(M.3) are the shared MALA pieces of :mod:`jaxlib_ext.samplers.mala`. Layout after
BlackJAX: :class:`MALAState` (position with its energy and gradient, so one target evaluation
per move), :class:`MALAInfo`, :func:`init`, :func:`build_kernel`, and :func:`mala`, which binds
a target and returns a :class:`~jaxlib_ext.samplers.base.SamplingAlgorithm`.
``target_fn(x) -> (E [B], grad E [B, ...])`` evaluates a batch.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxlib_ext.samplers.base import SamplingAlgorithm
from jaxlib_ext.samplers.energy.covariance import Covariance
from jaxlib_ext.samplers.mala import langevin_proposal, log_proposal_density, mh_accept

__all__ = ["MALAInfo", "MALAState", "TargetFn", "build_kernel", "init", "mala",
           "snr_step_size"]

TargetFn = Callable[[jax.Array], tuple[jax.Array, jax.Array]]


class MALAState(NamedTuple):
    """A batch of chains with the target cached at their positions.

    Attributes:
      position: ``x`` ``[B, ...]``.
      energy: ``E(x)`` ``[B]``.
      grad: ``grad E(x)``, ``position``'s shape.
    """

    position: jax.Array
    energy: jax.Array
    grad: jax.Array


class MALAInfo(NamedTuple):
    """Diagnostics of one move.

    Attributes:
      acceptance_rate: ``min(1, a)`` of (M.2) ``[B]`` (1 for ULA).
      is_accepted: ``[B]`` bool (True for ULA).
      step_size: ``h(x)`` ``[B]``.
    """

    acceptance_rate: jax.Array
    is_accepted: jax.Array
    step_size: jax.Array


def init(position, target_fn: TargetFn) -> MALAState:
    """The state at ``position``: one evaluation of the target.

    Args:
      position: ``x`` ``[B, ...]``.
      target_fn: ``x -> (E(x) [B], grad E(x))``.

    Returns:
      A :class:`MALAState`.
    """
    e, g = target_fn(position)
    return MALAState(position, e, g)


def snr_step_size(grad, precond: Covariance, snr):
    """The signal-to-noise step rule (M.4), per chain.

    Args:
      grad: ``grad E(x)`` ``[B, ...]``.
      precond: ``S``, a :class:`~.covariance.Covariance` of ``grad``'s shape (``p >= 0``).
      snr: the signal-to-noise ratio, > 0.

    Returns:
      ``h = 2 (snr sqrt(r) / ||S^{1/2} grad||)^2`` ``[B]`` (1 for a chain with nothing free).

    References:
      Song et al., arXiv 2011.13456 (the predictor-corrector step rule); arXiv 2605.15487.
    """
    rest = tuple(range(1, grad.ndim))
    r = jnp.sum(precond.diag > 0, axis=rest).astype(grad.dtype)
    gnorm2 = precond.quad(grad, precond.diag)
    # a chain with nothing free (r = 0) does not move; h = 1 keeps (M.3) finite there
    return jnp.where(r > 0, 2.0 * snr ** 2 * r / jnp.maximum(gnorm2, 1e-30), 1.0)


def _check_step(step_size, snr, temperature):
    if (step_size is None) == (snr is None):
        raise ValueError("step_size, snr: give exactly one of them")
    for name, v in (("step_size", step_size), ("snr", snr), ("temperature", temperature)):
        if v is None or isinstance(v, jax.core.Tracer):  # a traced value: its caller checks it
            continue
        if not np.all(np.asarray(v) > 0):
            raise ValueError(f"{name}: expected > 0, got {v}")


def build_kernel(*, metropolis: bool = True) -> Callable:
    """One move (M.1) of every chain, MH-corrected (M.2)-(M.3) if ``metropolis``.

    Args:
      metropolis: True for PC-MALA's exact MH step, False for the unadjusted move (ULA).

    Returns:
      ``kernel(rng_key, state, target_fn, precond, *, step_size=None, snr=None,
      temperature=1.0) -> (state, info)``, with ``state`` a :class:`MALAState`, ``precond`` the
      :class:`~.covariance.Covariance` ``S``, exactly one of ``step_size`` (a scalar or ``[B]``)
      and ``snr`` (rule M.4), the temperature ``T``, and ``info`` a :class:`MALAInfo`.

    References:
      arXiv 2605.15487 (PC-MALA); Song et al., arXiv 2011.13456 (the corrector).
    """

    def kernel(rng_key, state: MALAState, target_fn: TargetFn, precond: Covariance, *,
               step_size=None, snr=None, temperature=1.0):
        _check_step(step_size, snr, temperature)
        x = state.position
        b = x.shape[0]

        def h_of(grad):
            if snr is not None:
                return snr_step_size(grad, precond, snr)
            return jnp.broadcast_to(jnp.asarray(step_size, x.dtype), (b,))

        k_xi, k_u = jax.random.split(rng_key)
        h = h_of(state.grad)
        prop = langevin_proposal(k_xi, x, state.grad, h, precond=precond,
                                 temperature=temperature)                          # (M.1)
        e1, g1 = target_fn(prop)
        if not metropolis:
            ones = jnp.ones((b,), x.dtype)
            return MALAState(prop, e1, g1), MALAInfo(ones, ones > 0, h)
        h1 = h_of(g1)  # the reverse step size, recomputed at the proposal
        log_a = ((state.energy - e1) / temperature
                 + log_proposal_density(x, prop, g1, h1, precond=precond,
                                        temperature=temperature)
                 - log_proposal_density(prop, x, state.grad, h, precond=precond,
                                        temperature=temperature))                  # (M.2)
        new, accept, prob = mh_accept(k_u, log_a, state, MALAState(prop, e1, g1))
        return new, MALAInfo(prob, accept, h)

    return kernel


def mala(target_fn: TargetFn, precond: Covariance, *, step_size=None, snr=None,
         temperature: float = 1.0, metropolis: bool = True) -> SamplingAlgorithm:
    """Preconditioned MALA (or ULA) with the target and the step rule bound.

    Args:
      target_fn: ``x -> (E(x) [B], grad E(x))`` for a batch ``x`` ``[B, ...]``.
      precond: ``S``, a :class:`~.covariance.Covariance` of the batch's shape.
      step_size: a fixed ``h`` (a scalar or ``[B]``), or None with ``snr``.
      snr: the signal-to-noise ratio of rule (M.4), or None with ``step_size``.
      temperature: ``T`` > 0.
      metropolis: True for the exact MH step (M.2), False for ULA.

    Returns:
      A :class:`~jaxlib_ext.samplers.base.SamplingAlgorithm`: ``init(position) ->``
      :class:`MALAState` and ``step(rng_key, state) -> (state,`` :class:`MALAInfo` ``)``.

    References:
      arXiv 2605.15487 (PC-MALA); Song et al., arXiv 2011.13456.
    """
    if not callable(target_fn):
        raise TypeError(f"target_fn: expected a callable x -> (E, grad E), got "
                        f"{type(target_fn).__name__}")
    if not isinstance(precond, Covariance):
        raise TypeError(f"precond: expected a Covariance, got {type(precond).__name__}")
    _check_step(step_size, snr, temperature)
    kernel = build_kernel(metropolis=metropolis)

    def init_fn(position):
        return init(position, target_fn)

    def step_fn(rng_key, state: MALAState):
        return kernel(rng_key, state, target_fn, precond, step_size=step_size, snr=snr,
                      temperature=temperature)

    return SamplingAlgorithm(init_fn, step_fn)
