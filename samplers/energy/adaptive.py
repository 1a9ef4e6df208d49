"""The energy-guided adaptive covariance schedules.

arXiv 2605.15487 updates the sampling covariance by a gradient step on the energy,
``Sigma <- Sigma - gamma Sigma (dU/dSigma) Sigma``, and moves the chain with the decrement as the
drift and noise covariance. Two forms are here.

**Per entry** (:func:`sample_per_entry`, the authors' ``adaptive_sampler``). Each entry of the
diagonal ``Sigma`` (in the problem's basis) has its own schedule; per update ``t``, from
``Sigma_0 = Sigma_y``::

    g_t     = | clip(dU/ds (x_t, Sigma_t), -c, c) |                                       (E.1)
    Delta_t = gamma Sigma_t g_t Sigma_t;  Sigma_{t+1} = max(Sigma_t - Delta_t, floor)     (E.2)
    x_t'    = x_t - Delta_t grad U(x_t, Sigma_t) + Delta_t^{1/2} xi                        (E.3)
    n inner moves:  x <- x - l Delta_t grad E(x; Sigma_{t+1}) + sqrt(2 T l) Delta_t^{1/2} xi (E.4)

with the authors' ``c = 50`` (``clamp``), ``gamma = 1.5e-2`` (``step_cov``), ``floor = 1e-9``,
``n = 3`` (``inner_steps``), ``l = 1`` (``inner_lr``), ``T = 1``. Their code takes ``sign(g)
clip(g)``, which is ``|clip(g)|``: the covariance only decreases (E.2), so it stays positive and
decreasing entry by entry. ``Delta_t`` is the unfloored decrement, as in their code. One
deviation: the inner moves (E.4) follow the level's posterior ``E`` of (V.2) (the prior energy
plus the measurement's term on free observed coefficients) where the authors' use the prior
score alone; on their noiseless inpainting the two coincide (observed entries barely move), on
a noisy or blurred measurement the prior-only move drifts away from it. Network gradients per
update: ``1 + n``; the output is the Tweedie denoiser of the last evaluation.

**Per level** (:func:`sample`, ours). Keeps the task shape of ``Sigma_k = min(Sigma_y,
sigma_k^2)`` (the covariances the network was trained on) and applies the energy gradient to
the per-chain level ``sigma_k^2`` through the mean relative noise score over the free
coefficients::

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

from jaxlib_ext.samplers.energy.covariance import Covariance
from jaxlib_ext.samplers.energy.energy import EnergyFn
from jaxlib_ext.samplers.energy.levels import (
    covariance_level,
    evaluate,
    initial_position,
    level,
)
from jaxlib_ext.samplers.energy.problem import DiagonalProblem

__all__ = ["AdaptiveInfo", "AdaptiveResult", "AdaptiveState", "PerEntryInfo", "PerEntryResult",
           "PerEntryState", "build_kernel", "build_per_entry_kernel", "init", "init_per_entry",
           "sample", "sample_per_entry"]


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
        lev = level(problem, s2, "clipped")
        ev = evaluate(energy_fn, problem, lev, x)
        rest = tuple(range(1, x.ndim))
        nfree = jnp.maximum(jnp.sum(lev.free, axis=rest), 1)
        m = jnp.sum(jnp.where(lev.free, lev.cov.diag * ev.noise_score, 0.0), axis=rest) / nfree
        log_s2 = jnp.log(s2)
        nxt = jnp.clip(log_s2 + log_g - eta * m, log_s2 + 2.0 * log_g,
                       log_s2 + 0.5 * log_g)                                       # (A.2)
        s2_next = jnp.maximum(jnp.exp(nxt), sigma_end ** 2)
        d = lev.cov.diag - level(problem, s2_next, "clipped").cov.diag
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


# ----------------------------------------------------------------------------- per entry


class PerEntryState(NamedTuple):
    """position ``[B, ...]``; cov ``Sigma_t`` (variances ``[B, ...]`` in the problem's basis)."""

    position: jax.Array
    cov: Covariance


class PerEntryInfo(NamedTuple):
    """Per update: energy ``U(x_t, Sigma_t)`` ``[B]``; mean_variance: the mean of
    ``Sigma_{t+1}`` over the free entries ``[B]``; step: the mean of ``Delta_t`` ``[B]``."""

    energy: jax.Array
    mean_variance: jax.Array
    step: jax.Array


class PerEntryResult(NamedTuple):
    denoised: jax.Array
    last: PerEntryState
    info: PerEntryInfo
    nfe: int


def init_per_entry(key, problem: DiagonalProblem) -> PerEntryState:
    """``x_0`` (:func:`~.levels.initial_position`) at ``Sigma_0 = Sigma_y``."""
    return PerEntryState(initial_position(key, problem), problem.cov)


def _check_per_entry(step_cov, inner_steps, inner_lr, temperature, clamp, floor):
    for name, v in (("step_cov", step_cov), ("inner_lr", inner_lr),
                    ("temperature", temperature), ("clamp", clamp), ("floor", floor)):
        if isinstance(v, jax.core.Tracer):  # a traced hyper-parameter: checked by its caller
            continue
        if not v > 0:
            raise ValueError(f"{name}: expected > 0, got {v}")
    if isinstance(inner_steps, bool) or not isinstance(inner_steps, int) or inner_steps < 0:
        raise ValueError(f"inner_steps: expected an int >= 0, got {inner_steps!r}")


def build_per_entry_kernel(energy_fn: EnergyFn, *, step_cov: float = 1.5e-2,
                           inner_steps: int = 3, inner_lr: float = 1.0,
                           temperature: float = 1.0, clamp: float = 50.0,
                           floor: float = 1e-9):
    """``kernel(key, state, problem) -> (state, info, denoised)``: one update (E.1)-(E.4),
    ``1 + inner_steps`` network gradients."""
    _check_per_entry(step_cov, inner_steps, inner_lr, temperature, clamp, floor)

    def kernel(key, state: PerEntryState, problem: DiagonalProblem):
        x, cov = state
        keys = jax.random.split(key, inner_steps + 1)
        lev = covariance_level(problem, cov.diag)
        ev = evaluate(energy_fn, problem, lev, x)
        g = jnp.abs(jnp.clip(ev.noise_score, -clamp, clamp))                     # (E.1)
        delta = step_cov * cov.diag * g * cov.diag                               # (E.2)
        new_cov = cov.replace(jnp.maximum(cov.diag - delta, floor))
        xi = jax.random.normal(keys[0], x.shape, x.dtype)
        x = x - cov.apply_diag(ev.prior_grad, delta) + cov.apply_diag(xi, jnp.sqrt(delta))  # E.3
        nxt = covariance_level(problem, new_cov.diag)
        u = ev.energy - 0.5 * lev.cov.quad(state.position - problem.z, lev.weight)
        denoised = state.position - cov.apply(ev.prior_grad)

        def inner(carry, k):
            xc, _ = carry
            e = evaluate(energy_fn, problem, nxt, xc)
            xi = jax.random.normal(k, xc.shape, xc.dtype)
            den = xc - new_cov.apply(e.prior_grad)
            xc = (xc - cov.apply_diag(e.grad, inner_lr * delta)
                  + cov.apply_diag(xi, jnp.sqrt(2.0 * temperature * inner_lr * delta)))  # (E.4)
            return (xc, den), None

        if inner_steps:
            (x, denoised), _ = jax.lax.scan(inner, (x, denoised), keys[1:])
        rest = tuple(range(1, x.ndim))
        nfree = jnp.maximum(jnp.sum(nxt.free, axis=rest), 1)
        mean_var = jnp.sum(jnp.where(nxt.free, new_cov.diag, 0.0), axis=rest) / nfree
        info = PerEntryInfo(u, mean_var, jnp.mean(delta, axis=rest))
        return PerEntryState(x, new_cov), info, denoised

    return kernel


def sample_per_entry(energy_fn: EnergyFn, problem: DiagonalProblem, key, *,
                     num_updates: int = 1000, step_cov: float = 1.5e-2, inner_steps: int = 3,
                     inner_lr: float = 1.0, temperature: float = 1.0, clamp: float = 50.0,
                     floor: float = 1e-9) -> PerEntryResult:
    """Run (E.1)-(E.4) for ``num_updates`` updates (``1 + inner_steps`` network gradients each;
    the authors' defaults) and return the Tweedie denoiser of the last evaluation.
    Jit-able with the keyword arguments static."""
    if isinstance(num_updates, bool) or not isinstance(num_updates, int) or num_updates < 1:
        raise ValueError(f"num_updates: expected an int >= 1, got {num_updates!r}")
    kernel = build_per_entry_kernel(energy_fn, step_cov=step_cov, inner_steps=inner_steps,
                                    inner_lr=inner_lr, temperature=temperature, clamp=clamp,
                                    floor=floor)
    k0, key = jax.random.split(key)
    state = init_per_entry(k0, problem)

    def body(st, k):
        st2, info, den = kernel(k, st, problem)
        return st2, (info, den)

    last, (infos, dens) = jax.lax.scan(body, state, jax.random.split(key, num_updates))
    return PerEntryResult(dens[-1], last, infos, num_updates * (1 + inner_steps))
