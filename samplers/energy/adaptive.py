"""The energy-guided adaptive covariance schedules.

arXiv 2605.15487 updates the sampling covariance by a gradient step on the energy,
``Sigma <- Sigma - gamma Sigma (dU/dSigma) Sigma``, and moves the chain with the decrement as the
drift and noise covariance. Two forms are here.

**Per entry** (:func:`per_entry`, run by :func:`sample_per_entry`; the authors'
``adaptive_sampler``, the default form). Each entry of the diagonal ``Sigma`` (in the problem's
basis) has its own schedule; per update ``t``, from ``Sigma_0 = Sigma_y``::

    g_t     = | clip(dU/ds (x_t, Sigma_t), -c, c) |                                       (E.1)
    Delta_t = gamma Sigma_t g_t Sigma_t;  Sigma_{t+1} = max(Sigma_t - Delta_t, floor)     (E.2)
    x_t'    = x_t - Delta_t grad U(x_t, Sigma_t) + Delta_t^{1/2} xi                        (E.3)
    n inner moves:  x <- x - l Delta_t grad E(x; Sigma_{t+1}) + sqrt(2 T l) Delta_t^{1/2} xi (E.4)

with the authors' ``c = 50`` (``clamp``), ``gamma = 1.5e-2`` (``step_cov``), ``floor = 1e-9``,
``n = 3`` (``inner_steps``), ``l = 1`` (``inner_lr``), ``T = 1``. In the Fourier basis
``dU/ds`` is the gradient along Hermitian-symmetric spectra (the mean of each coefficient's and
its mirror's, :meth:`~.covariance.Covariance.symmetrize`): a network that reads the spectrum
gives the two different gradients, and a covariance that drifts off the symmetric spectra no
longer maps real images to real images (the per-entry updates then diverge on deblurring).
The authors' samplers move in the pixel basis, where the projection is the identity. Their code
takes ``sign(g)
clip(g)``, which is ``|clip(g)|``: the covariance only decreases (E.2), so it stays positive and
decreasing entry by entry. ``Delta_t`` is the unfloored decrement, as in their code. One
deviation: the inner moves (E.4) follow the level's posterior ``E`` of (V.2) (the prior energy
plus the measurement's term on free observed coefficients) where the authors' use the prior
score alone; on their noiseless inpainting the two coincide (observed entries barely move), on
a noisy or blurred measurement the prior-only move drifts away from it. Network gradients per
update: ``1 + n``; the output is the Tweedie denoiser of the last evaluation.

**Per level** (:func:`per_level`, run by :func:`sample`; ours). Keeps the task shape of
``Sigma_k = min(Sigma_y, sigma_k^2)`` (the covariances the network was trained on) and applies
the energy gradient to the per-chain level ``sigma_k^2`` through the mean relative noise score
over the free coefficients::

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

Both schedules keep their position in the state (the covariance, or the level ``sigma_k^2``),
so one step is ``step(rng_key, state)``; the Tweedie estimate of each step is in its info.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from jaxlib_ext.samplers.base import SamplingAlgorithm
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
           "per_entry", "per_level", "sample", "sample_per_entry"]


class AdaptiveState(NamedTuple):
    """The per-level state.

    Attributes:
      position: ``x_k`` ``[B, ...]``.
      sigma2: ``sigma_k^2`` ``[B]``, the level of ``position``.
    """

    position: jax.Array
    sigma2: jax.Array


class AdaptiveInfo(NamedTuple):
    """Diagnostics of one per-level step.

    Attributes:
      sigma: ``sigma_k`` ``[B]`` (before the step).
      energy: ``U(x_k, Sigma_k)`` ``[B]``.
      noise_score: ``m_k`` of (A.1) ``[B]``.
      denoised: the Tweedie estimate ``x_k - Sigma_k grad U(x_k, Sigma_k)`` ``[B, ...]``.
    """

    sigma: jax.Array
    energy: jax.Array
    noise_score: jax.Array
    denoised: jax.Array


class AdaptiveResult(NamedTuple):
    """The output of :func:`sample`.

    Attributes:
      denoised: ``[B, ...]``, the Tweedie estimate of the last step.
      last: the :class:`AdaptiveState` the last step started from.
      info: an :class:`AdaptiveInfo` stacked over steps.
      nfe: network gradients per chain.
    """

    denoised: jax.Array
    last: AdaptiveState
    info: AdaptiveInfo
    nfe: int


def init(position, problem: DiagonalProblem) -> AdaptiveState:
    """The per-level state at ``sigma_0 = sigma_max``.

    Args:
      position: ``x_0`` ``[B, ...]`` (e.g. :func:`~.levels.initial_position`).
      problem: the :class:`~.problem.DiagonalProblem`.

    Returns:
      An :class:`AdaptiveState`.
    """
    b = problem.z.shape[0]
    return AdaptiveState(position, jnp.full((b,), problem.sigma_max ** 2, problem.z.dtype))


def build_kernel(energy_fn: EnergyFn, *, gamma, eta: float = 1.0, sigma_end: float = 0.01):
    """One per-level step (A.1)-(A.3).

    Args:
      energy_fn: ``U(y, cov) -> [B]``.
      gamma: the geometric ratio of ``sigma_k^2`` per step, in ``(0, 1)``.
      eta: the weight of the noise score ``m_k`` in (A.2).
      sigma_end: the lowest level.

    Returns:
      ``kernel(rng_key, state, problem) -> (state, info)`` with ``state`` an
      :class:`AdaptiveState` and ``info`` an :class:`AdaptiveInfo`; one network gradient.

    References:
      arXiv 2605.15487 (the energy-guided covariance update).
    """
    log_g = jnp.log(gamma)

    def kernel(rng_key, state: AdaptiveState, problem: DiagonalProblem):
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
        xi = jax.random.normal(rng_key, x.shape, x.dtype)
        x_new = x - lev.cov.apply_diag(ev.prior_grad, d) + lev.cov.apply_diag(xi, jnp.sqrt(d))
        denoised = x - lev.cov.apply(ev.prior_grad)
        u = ev.energy - 0.5 * lev.cov.quad(x - problem.z, lev.weight)
        return AdaptiveState(x_new, s2_next), AdaptiveInfo(jnp.sqrt(s2), u, m, denoised)

    return kernel


def _check_steps(problem, num_steps, sigma_end):
    if isinstance(num_steps, bool) or not isinstance(num_steps, int) or num_steps < 2:
        raise ValueError(f"num_steps: expected an int >= 2, got {num_steps!r}")
    if not 0 < sigma_end < problem.sigma_max:
        raise ValueError(f"sigma_end: expected in (0, sigma_max), got {sigma_end}")


def per_level(energy_fn: EnergyFn, problem: DiagonalProblem, *, num_steps: int = 100,
              sigma_end: float = 0.01, eta: float = 1.0) -> SamplingAlgorithm:
    """The per-level schedule (ours) with the problem bound.

    Args:
      energy_fn: ``U(y, cov) -> [B]``.
      problem: the :class:`~.problem.DiagonalProblem`, one row per chain.
      num_steps: ``K``, the steps that reach ``sigma_end`` at the geometric rate (>= 2);
        later steps stay at ``sigma_end``.
      sigma_end: the lowest level, in ``(0, sigma_max)``.
      eta: the weight of the noise score in (A.2).

    Returns:
      A :class:`~jaxlib_ext.samplers.base.SamplingAlgorithm`: ``init(position) ->``
      :class:`AdaptiveState` and ``step(rng_key, state) -> (state,`` :class:`AdaptiveInfo`
      ``)``.

    References:
      arXiv 2605.15487.
    """
    _check_steps(problem, num_steps, sigma_end)
    gamma = (sigma_end / problem.sigma_max) ** (2.0 / (num_steps - 1))
    kernel = build_kernel(energy_fn, gamma=gamma, eta=eta, sigma_end=sigma_end)

    def init_fn(position):
        return init(position, problem)

    def step_fn(rng_key, state: AdaptiveState):
        return kernel(rng_key, state, problem)

    return SamplingAlgorithm(init_fn, step_fn)


def sample(rng_key, energy_fn: EnergyFn, problem: DiagonalProblem, *, num_steps: int = 100,
           sigma_end: float = 0.01, eta: float = 1.0) -> AdaptiveResult:
    """Run the per-level schedule (A.1)-(A.3) for ``num_steps`` steps.

    Args:
      rng_key: a PRNG key (the start ``x_0`` and every step).
      energy_fn: ``U(y, cov) -> [B]``.
      problem: the :class:`~.problem.DiagonalProblem`, one row per chain.
      num_steps: steps, one network gradient each (>= 2).
      sigma_end: the lowest level, in ``(0, sigma_max)``.
      eta: the weight of the noise score in (A.2).

    Returns:
      An :class:`AdaptiveResult` with the Tweedie estimate of the last step.

    References:
      arXiv 2605.15487.
    """
    algorithm = per_level(energy_fn, problem, num_steps=num_steps, sigma_end=sigma_end,
                          eta=eta)
    k0, key = jax.random.split(rng_key)
    state = algorithm.init(initial_position(k0, problem))

    def body(st, k):
        return algorithm.step(k, st)

    keys = jax.random.split(key, num_steps)
    last, infos = jax.lax.scan(body, state, keys[:-1])
    _, info_l = algorithm.step(keys[-1], last)
    infos = jax.tree.map(lambda a, b: jnp.concatenate([a, b[None]]), infos, info_l)
    return AdaptiveResult(info_l.denoised, last, infos, num_steps)


# ----------------------------------------------------------------------------- per entry


class PerEntryState(NamedTuple):
    """The per-entry state.

    Attributes:
      position: ``x_t`` ``[B, ...]``.
      cov: ``Sigma_t``, a :class:`~.covariance.Covariance` (variances ``[B, ...]`` in the
        problem's basis).
    """

    position: jax.Array
    cov: Covariance


class PerEntryInfo(NamedTuple):
    """Diagnostics of one per-entry update.

    Attributes:
      energy: ``U(x_t, Sigma_t)`` ``[B]``.
      mean_variance: the mean of ``Sigma_{t+1}`` over the free entries ``[B]``.
      step: the mean of ``Delta_t`` ``[B]``.
      denoised: the Tweedie estimate of the update's last evaluation ``[B, ...]``.
    """

    energy: jax.Array
    mean_variance: jax.Array
    step: jax.Array
    denoised: jax.Array


class PerEntryResult(NamedTuple):
    """The output of :func:`sample_per_entry`.

    Attributes:
      denoised: ``[B, ...]``, the Tweedie estimate of the last evaluation.
      last: the last :class:`PerEntryState`.
      info: a :class:`PerEntryInfo` stacked over updates.
      nfe: network gradients per chain.
    """

    denoised: jax.Array
    last: PerEntryState
    info: PerEntryInfo
    nfe: int


def init_per_entry(position, problem: DiagonalProblem) -> PerEntryState:
    """The per-entry state at ``Sigma_0 = Sigma_y``.

    Args:
      position: ``x_0`` ``[B, ...]`` (e.g. :func:`~.levels.initial_position`).
      problem: the :class:`~.problem.DiagonalProblem`.

    Returns:
      A :class:`PerEntryState`.
    """
    return PerEntryState(position, problem.cov)


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
    """One per-entry update (E.1)-(E.4).

    Args:
      energy_fn: ``U(y, cov) -> [B]``.
      step_cov: ``gamma`` of (E.2).
      inner_steps: ``n``, the inner moves (E.4) (>= 0).
      inner_lr: ``l`` of (E.4).
      temperature: ``T`` of (E.4).
      clamp: ``c`` of (E.1).
      floor: the smallest variance of (E.2).

    Returns:
      ``kernel(rng_key, state, problem) -> (state, info)`` with ``state`` a
      :class:`PerEntryState` and ``info`` a :class:`PerEntryInfo`; ``1 + inner_steps``
      network gradients.

    References:
      arXiv 2605.15487 (the authors' ``adaptive_sampler``).
    """
    _check_per_entry(step_cov, inner_steps, inner_lr, temperature, clamp, floor)

    def kernel(rng_key, state: PerEntryState, problem: DiagonalProblem):
        x, cov = state
        keys = jax.random.split(rng_key, inner_steps + 1)
        lev = covariance_level(problem, cov.diag)
        ev = evaluate(energy_fn, problem, lev, x)
        # the network's dU/ds is not Hermitian-symmetric in the Fourier basis: project it so
        # that Sigma_t stays a covariance of real images
        g = jnp.abs(jnp.clip(cov.symmetrize(ev.noise_score), -clamp, clamp))     # (E.1)
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
        info = PerEntryInfo(u, mean_var, jnp.mean(delta, axis=rest), denoised)
        return PerEntryState(x, new_cov), info

    return kernel


def per_entry(energy_fn: EnergyFn, problem: DiagonalProblem, *, step_cov: float = 1.5e-2,
              inner_steps: int = 3, inner_lr: float = 1.0, temperature: float = 1.0,
              clamp: float = 50.0, floor: float = 1e-9) -> SamplingAlgorithm:
    """The per-entry schedule (the authors') with the problem bound.

    Args:
      energy_fn: ``U(y, cov) -> [B]``.
      problem: the :class:`~.problem.DiagonalProblem`, one row per chain.
      step_cov: ``gamma`` of (E.2).
      inner_steps: ``n``, the inner moves (E.4) (>= 0).
      inner_lr: ``l`` of (E.4).
      temperature: ``T`` of (E.4).
      clamp: ``c`` of (E.1).
      floor: the smallest variance of (E.2).

    Returns:
      A :class:`~jaxlib_ext.samplers.base.SamplingAlgorithm`: ``init(position) ->``
      :class:`PerEntryState` and ``step(rng_key, state) -> (state,`` :class:`PerEntryInfo`
      ``)``.

    References:
      arXiv 2605.15487 (the authors' ``adaptive_sampler``).
    """
    kernel = build_per_entry_kernel(energy_fn, step_cov=step_cov, inner_steps=inner_steps,
                                    inner_lr=inner_lr, temperature=temperature, clamp=clamp,
                                    floor=floor)

    def init_fn(position):
        return init_per_entry(position, problem)

    def step_fn(rng_key, state: PerEntryState):
        return kernel(rng_key, state, problem)

    return SamplingAlgorithm(init_fn, step_fn)


def sample_per_entry(rng_key, energy_fn: EnergyFn, problem: DiagonalProblem, *,
                     num_updates: int = 1000, step_cov: float = 1.5e-2, inner_steps: int = 3,
                     inner_lr: float = 1.0, temperature: float = 1.0, clamp: float = 50.0,
                     floor: float = 1e-9) -> PerEntryResult:
    """Run the per-entry schedule (E.1)-(E.4) (the authors' defaults).

    Args:
      rng_key: a PRNG key (the start ``x_0`` and every update).
      energy_fn: ``U(y, cov) -> [B]``.
      problem: the :class:`~.problem.DiagonalProblem`, one row per chain.
      num_updates: updates, ``1 + inner_steps`` network gradients each (>= 1).
      step_cov: ``gamma`` of (E.2).
      inner_steps: ``n``, the inner moves (E.4) (>= 0).
      inner_lr: ``l`` of (E.4).
      temperature: ``T`` of (E.4).
      clamp: ``c`` of (E.1).
      floor: the smallest variance of (E.2).

    Returns:
      A :class:`PerEntryResult` with the Tweedie estimate of the last evaluation. Jit-able
      with the keyword arguments static.

    References:
      arXiv 2605.15487 (the authors' ``adaptive_sampler``).
    """
    if isinstance(num_updates, bool) or not isinstance(num_updates, int) or num_updates < 1:
        raise ValueError(f"num_updates: expected an int >= 1, got {num_updates!r}")
    algorithm = per_entry(energy_fn, problem, step_cov=step_cov, inner_steps=inner_steps,
                          inner_lr=inner_lr, temperature=temperature, clamp=clamp, floor=floor)
    k0, key = jax.random.split(rng_key)
    state = algorithm.init(initial_position(k0, problem))

    def body(st, k):
        return algorithm.step(k, st)

    last, infos = jax.lax.scan(body, state, jax.random.split(key, num_updates))
    return PerEntryResult(infos.denoised[-1], last, infos, num_updates * (1 + inner_steps))
