"""The energy-guided adaptive covariance schedule.

arXiv 2605.15487 updates the sampling covariance by a gradient step on the energy,
``Sigma <- Sigma - eta Sigma (dU/dSigma) Sigma``, and moves the chain with the decrement as the
drift and noise covariance. With the normalised energy, ``s dU/ds`` is the model's estimate of
``1/2 (1 - E[|F(y - x)|^2 | y] / s)``: positive where the current state is cleaner than the
covariance claims, negative where it is noisier. The paper's code applies the step per entry,
with clamping; what is implemented here keeps the task shape of ``Sigma_k = min(Sigma_y,
sigma_k^2)`` (the covariances the network was trained on) and applies the energy gradient to the
per-chain level ``sigma_k^2``, through the mean relative noise score over the free coefficients::

    m_k = mean_{free} s_k dU/ds_k (x_k, Sigma_k)                                          (A.1)
    log sigma_{k+1}^2 = log sigma_k^2 + log gamma - eta m_k,
                        clipped to [log sigma_k^2 + 2 log gamma, log sigma_k^2 + log(gamma) / 2]
                        and to >= log sigma_end^2                                          (A.2)
    D_k = Sigma_k - Sigma_{k+1};  x_{k+1} = x_k - D_k grad U(x_k, Sigma_k) + D_k^{1/2} xi      (A.3)

``gamma = (sigma_end / sigma_max)^{2 / (K - 1)}`` is the geometric ratio that reaches
``sigma_end`` in ``K`` steps; the energy term shortens steps (down to ``gamma^{1/2}``: the level
always decreases, so a chain cannot stall) where the chain is noisier than its level and
lengthens them (up to ``gamma^2``) where it is cleaner, per chain. (A.1) comes from the
same reverse pass as the score: one network gradient per step; the output is the Tweedie
denoiser at the last level.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from jaxlib_ext.samplers.energy.energy import EnergyFn
from jaxlib_ext.samplers.energy.levels import evaluate, initial_position, level
from jaxlib_ext.samplers.energy.problem import DiagonalProblem

__all__ = ["AdaptiveInfo", "AdaptiveResult", "AdaptiveState", "build_kernel", "init", "sample"]


class AdaptiveState(NamedTuple):
    """position ``[B, ...]``; sigma2 ``[B]`` (the level of ``position``)."""

    position: jax.Array
    sigma2: jax.Array


class AdaptiveInfo(NamedTuple):
    """Per step: sigma ``[B]`` (before the step), energy ``U(x_k, Sigma_k)`` ``[B]``,
    noise_score ``m_k`` (A.1) ``[B]``."""

    sigma: jax.Array
    energy: jax.Array
    noise_score: jax.Array


class AdaptiveResult(NamedTuple):
    denoised: jax.Array
    last: AdaptiveState
    info: AdaptiveInfo
    nfe: int


def init(key, problem: DiagonalProblem) -> AdaptiveState:
    b = problem.z.shape[0]
    return AdaptiveState(initial_position(key, problem),
                         jnp.full((b,), problem.sigma_max ** 2, problem.z.dtype))


def _b(v, x):
    return jnp.reshape(v, v.shape + (1,) * (x.ndim - v.ndim))


def build_kernel(energy_fn: EnergyFn, *, gamma, eta: float = 1.0, sigma_end: float = 0.01):
    """``kernel(key, state, problem) -> (state, info, denoised)``: (A.1)-(A.3)."""
    log_g = jnp.log(gamma)

    def kernel(key, state: AdaptiveState, problem: DiagonalProblem):
        x, s2 = state
        lev = level(problem, s2)
        ev = evaluate(energy_fn, problem, lev, x)
        rest = tuple(range(1, x.ndim))
        nfree = jnp.maximum(jnp.sum(lev.free, axis=rest), 1)
        m = jnp.sum(jnp.where(lev.free, lev.cov.diag * ev.noise_score, 0.0), axis=rest) / nfree
        log_s2 = jnp.log(s2)
        nxt = jnp.clip(log_s2 + log_g - eta * m, log_s2 + 2.0 * log_g,
                       log_s2 + 0.5 * log_g)                                       # (A.2)
        s2_next = jnp.maximum(jnp.exp(nxt), sigma_end ** 2)
        d = lev.cov.diag - level(problem, s2_next).cov.diag
        xi = jax.random.normal(key, x.shape, x.dtype)
        x_new = x - lev.cov.apply_diag(ev.prior_grad, d) + lev.cov.apply_diag(xi, jnp.sqrt(d))
        denoised = x - lev.cov.apply(ev.prior_grad)
        u = ev.energy - 0.5 * lev.cov.quad(x - problem.z, lev.weight)
        return AdaptiveState(x_new, s2_next), AdaptiveInfo(jnp.sqrt(s2), u, m), denoised

    return kernel


def sample(energy_fn: EnergyFn, problem: DiagonalProblem, key, *, num_steps: int = 100,
           sigma_end: float = 0.01, eta: float = 1.0) -> AdaptiveResult:
    """Run (A.1)-(A.3) for ``num_steps`` steps (one network gradient each) and return the
    Tweedie denoiser of the last step."""
    if num_steps < 2:
        raise ValueError(f"num_steps: expected >= 2, got {num_steps}")
    if not 0 < sigma_end < problem.sigma_max:
        raise ValueError(f"sigma_end: expected in (0, sigma_max), got {sigma_end}")
    gamma = (sigma_end / problem.sigma_max) ** (2.0 / (num_steps - 1))
    kernel = build_kernel(energy_fn, gamma=gamma, eta=eta, sigma_end=sigma_end)
    k0, key = jax.random.split(key)
    state = init(k0, problem)

    def body(st, k):
        st2, info, den = kernel(k, st, problem)
        return st2, (info, den)

    keys = jax.random.split(key, num_steps)
    last, (infos, dens) = jax.lax.scan(body, state, keys[:-1])
    _, info_l, den_l = kernel(keys[-1], last, problem)
    infos = jax.tree.map(lambda a, b: jnp.concatenate([a, b[None]]), infos, info_l)
    return AdaptiveResult(den_l, last, infos, num_steps)
