"""Latent-diffusion solvers for linear inverse problems, with a pluggable corrector.

Both solvers run a DDIM reverse diffusion (Song, Meng, Ermon, arXiv 2010.02502, eq. 12) over a
descending subsequence ``t_0 > t_1 > ... > t_{N-1}`` of the training indices and add a
measurement-guidance step. With ``zhat_0`` and ``eps`` of (P.3) at ``(z_{t_i}, t_i)``,
``abar = abar_{t_i}``, ``abar' = abar_{t_{i+1}}`` (``1`` after the last step)::

    sigma_i = ddim_eta sqrt((1 - abar') / (1 - abar)) sqrt(1 - abar / abar')
    z'      = sqrt(abar') zhat_0 + sqrt(1 - abar' - sigma_i^2) eps + sigma_i xi          (S.1)

* :func:`latent_dps`: diffusion posterior sampling (Chung et al., arXiv 2209.14687,
  Algorithm 1) in the latent::

      z_{t_{i+1}} = z' - step_size grad_{z_{t_i}} ||y - A D(zhat_0)||                   (S.2)

* :func:`psld`: posterior sampling with latent diffusion (Rout et al., arXiv 2307.00619,
  Algorithm 2), DPS plus the "gluing" term that asks ``zhat_0`` to be a fixed point of
  decode -> replace the measured part by ``A^T y`` -> encode::

      z_{t_{i+1}} = z' - step_size grad ||y - A D(zhat_0)||
                       - gluing_weight grad ||zhat_0 - E(A^T y + (I - A^T A) D(zhat_0))||  (S.3)

  Both terms use norms (not squared norms) as the authors' implementations do; the weights
  absorb the difference.

``corrector`` (e.g. :func:`~jaxlib_ext.samplers.mclc.mclc`) runs after every step but the last,
on ``z_{t_{i+1}}`` at level ``t_{i+1}``: ``corrector(key, z, t, problem) -> (z, info)``. One
solver step costs one network evaluation; a corrector of ``K`` steps adds ``K`` per solver step
but the last, so ``nfe = N + K (N - 1)``; compare solvers at equal ``nfe`` by giving the
uncorrected one more steps.

Everything is pure: ``jax.jit`` the call (the problem, the corrector and the integers are
static) and ``jax.vmap`` over keys for independent chains.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from jaxlib_ext.samplers.mclc.problem import (
    LatentInverseProblem,
    _residual_and_aux,
    ddim_timesteps,
    residual_and_grad,
)

__all__ = ["SolverInfo", "SolverResult", "ddim_step", "latent_dps", "psld"]


class SolverInfo(NamedTuple):
    """residual: ``(N,)`` ``r(z_{t_i}, t_i)`` of (P.5) at each solver step. final_residual:
    ``||y - A x_0||`` of the output. corrector: the corrector's info stacked over the ``N - 1``
    corrected steps (``None`` without a corrector). timesteps: ``(N,)`` the ``t_i``. nfe:
    network evaluations (int32 scalar)."""

    residual: jax.Array
    final_residual: jax.Array
    corrector: Any
    timesteps: jax.Array
    nfe: jax.Array


class SolverResult(NamedTuple):
    """z0: the final latent. x0: ``D(z0)``. info: :class:`SolverInfo`."""

    z0: jax.Array
    x0: jax.Array
    info: SolverInfo


def ddim_step(key, z0_hat, eps, alpha_bar, alpha_bar_prev, ddim_eta):
    """(S.1): the DDIM update from ``(zhat_0, eps)`` to the next level."""
    sig = ddim_eta * jnp.sqrt((1.0 - alpha_bar_prev) / (1.0 - alpha_bar)) * jnp.sqrt(
        jnp.maximum(1.0 - alpha_bar / alpha_bar_prev, 0.0))
    direction = jnp.sqrt(jnp.maximum(1.0 - alpha_bar_prev - sig ** 2, 0.0))
    xi = jax.random.normal(key, eps.shape, eps.dtype)
    return jnp.sqrt(alpha_bar_prev) * z0_hat + direction * eps + sig * xi


def _check_positive(name, value, allow_zero=False):
    if isinstance(value, jax.core.Tracer):
        return
    v = float(value)
    if not math.isfinite(v) or v < 0 or (v == 0 and not allow_zero):
        bound = ">= 0" if allow_zero else "> 0"
        raise ValueError(f"{name}: expected a finite number {bound}, got {value!r}")


def _check_common(problem, num_steps, ddim_eta, corrector, z_init, t_max):
    if not isinstance(problem, LatentInverseProblem):
        raise TypeError(f"problem: expected a LatentInverseProblem (see "
                        f"latent_inverse_problem), got {type(problem).__name__}")
    if isinstance(num_steps, bool) or not isinstance(num_steps, int):
        raise TypeError(f"num_steps: expected an int, got {num_steps!r}")
    ddim_timesteps(problem.alpha_bars.shape[0], num_steps, t_max)  # range checks
    _check_positive("ddim_eta", ddim_eta, allow_zero=True)
    if not isinstance(ddim_eta, jax.core.Tracer) and float(ddim_eta) > 1:
        raise ValueError(f"ddim_eta: expected a value in [0, 1], got {ddim_eta!r}")
    if corrector is not None and not callable(corrector):
        raise TypeError(f"corrector: expected None or a callable (key, z, t, problem) -> "
                        f"(z, info), got {type(corrector).__name__}")
    latent = tuple(problem.latent_shape)
    x = jax.eval_shape(problem.decoder, jax.ShapeDtypeStruct(latent, jnp.float32))
    y = jax.eval_shape(problem.operator.forward, x)
    if tuple(jnp.shape(problem.measurement)) != tuple(y.shape):
        raise ValueError(f"measurement: expected shape {tuple(y.shape)} (the operator applied "
                         f"to a decoded latent), got {tuple(jnp.shape(problem.measurement))}")
    if z_init is not None and tuple(jnp.shape(z_init)) != latent:
        raise ValueError(f"z_init: expected shape {latent} (latent_shape), got "
                         f"{tuple(jnp.shape(z_init))}")


def _run(key, problem: LatentInverseProblem, guided_step: Callable, num_steps: int,
         corrector, z_init, t_max) -> SolverResult:
    ts = ddim_timesteps(problem.alpha_bars.shape[0], num_steps, t_max)
    k_init, k_steps, k_last = jax.random.split(key, 3)
    z = (jax.random.normal(k_init, problem.latent_shape, jnp.float32) if z_init is None
         else jnp.asarray(z_init, jnp.float32))
    ab = problem.alpha_bars

    def body(z, xs):
        t, t_next, k = xs
        k_step, k_corr = jax.random.split(k)
        z, r = guided_step(k_step, z, t, ab[t], ab[t_next])
        info = None
        if corrector is not None:
            z, info = corrector(k_corr, z, t_next, problem)
        return z, (r, info)

    n_scan = num_steps - 1
    xs = (jnp.asarray(ts[:-1]), jnp.asarray(ts[1:]), jax.random.split(k_steps, n_scan))
    z, (res, cinfo) = jax.lax.scan(body, z, xs)
    z, r_last = guided_step(k_last, z, jnp.asarray(ts[-1]), ab[ts[-1]], jnp.ones((), ab.dtype))
    res = jnp.concatenate([res, r_last[None]])
    x0 = problem.decoder(z)
    final = jnp.sqrt(jnp.sum((problem.measurement - problem.operator.forward(x0)) ** 2))
    k_corr = 0 if cinfo is None else jax.tree.leaves(cinfo)[0].shape[-1]
    nfe = jnp.asarray(num_steps + k_corr * n_scan, jnp.int32)
    return SolverResult(z, x0, SolverInfo(res, final, cinfo, jnp.asarray(ts), nfe))


def latent_dps(key, problem: LatentInverseProblem, *, num_steps: int = 50,
               step_size: float = 1.0, ddim_eta: float = 1.0, corrector: Callable | None = None,
               z_init=None, t_max: int | None = None) -> SolverResult:
    """Latent DPS, (S.1)-(S.2): ``SolverResult(z0, x0, info)`` for one chain.

    key: PRNG key. num_steps: solver steps ``N``. step_size: the guidance weight of (S.2).
    ddim_eta: 0 (deterministic DDIM) to 1 (ancestral). corrector: ``None`` or
    ``(key, z, t, problem) -> (z, info)``. z_init: the starting ``z_{t_0}`` (default
    ``N(0, I)`` from ``key``). t_max: the first step's training index (default ``T - 1``; see
    :func:`~jaxlib_ext.samplers.mclc.ddim_timesteps`).
    """
    _check_common(problem, num_steps, ddim_eta, corrector, z_init, t_max)
    _check_positive("step_size", step_size)

    def step(k, z, t, ab, ab_prev):
        eps, z0, r, g = residual_and_grad(problem, z, t)
        z_next = ddim_step(k, z0, eps, ab, ab_prev, ddim_eta)  # (S.1)
        return z_next - step_size * g, r  # (S.2)

    return _run(key, problem, step, num_steps, corrector, z_init, t_max)


def psld(key, problem: LatentInverseProblem, *, num_steps: int = 50, step_size: float = 1.0,
         gluing_weight: float = 0.1, ddim_eta: float = 1.0, corrector: Callable | None = None,
         z_init=None, t_max: int | None = None) -> SolverResult:
    """PSLD, (S.1) and (S.3): ``SolverResult(z0, x0, info)`` for one chain; needs
    ``problem.encoder``. Arguments as :func:`latent_dps`; gluing_weight: the weight of the
    gluing term (``>= 0``)."""
    _check_common(problem, num_steps, ddim_eta, corrector, z_init, t_max)
    _check_positive("step_size", step_size)
    _check_positive("gluing_weight", gluing_weight, allow_zero=True)
    if problem.encoder is None:
        raise ValueError("problem: psld needs an encoder (latent_inverse_problem(..., "
                         "encoder=...))")
    op, y = problem.operator, problem.measurement
    aty = op.adjoint(y)

    def step(k, z, t, ab, ab_prev):
        def loss(z):
            rho, (eps, z0) = _residual_and_aux(problem, t)(z)
            r = jnp.sqrt(jnp.sum(rho ** 2) + 1e-20)
            x = problem.decoder(z0)
            glued = problem.encoder(aty + x - op.adjoint(op.forward(x)))
            glue = jnp.sqrt(jnp.sum((z0 - glued) ** 2) + 1e-20)
            return step_size * r + gluing_weight * glue, (eps, z0, r)

        g, (eps, z0, r) = jax.grad(loss, has_aux=True)(z)
        z_next = ddim_step(k, z0, eps, ab, ab_prev, ddim_eta)  # (S.1)
        return z_next - g, r  # (S.3)

    return _run(key, problem, step, num_steps, corrector, z_init, t_max)

