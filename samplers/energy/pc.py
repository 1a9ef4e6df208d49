"""Posterior sampling for a diagonal linear inverse problem: predictor-corrector and PC-MALA.

arXiv 2605.15487 (the PC and PC-MALA samplers), on the levels of :mod:`.levels`: geometric
``sigma_0 = sigma_max > ... > sigma_end``, ``Sigma_k`` of shape ``levels`` (``"scaled"``,
(V.1a), the authors'; ``"clipped"``, (V.1), ours). Two step orders per level:

``order="predictor_first"`` (the authors' ``PC_sampler``), for ``k = 0 .. K-1`` over the
``K + 1`` levels ``sigma_0 .. sigma_K = sigma_end``:

1. the predictor ``x <- x - D_k grad U(x, Sigma_k) + D_k^{1/2} xi``, ``D_k = Sigma_k -
   Sigma_{k+1}``, with the gradient at ``Sigma_k`` already computed;
2. evaluate ``E_{k+1}`` and its gradient at the moved position (one network gradient);
3. ``corrector_steps`` Langevin moves targeting ``p(x_{k+1} | z)`` (:mod:`.langevin`: step
   rule (M.4) with ``snr``, temperature ``T``), unadjusted (``metropolis=False``: PC) or with
   the exact MH correction (``metropolis=True``: PC-MALA); one network gradient each.

Network gradients per chain: ``1 + K (1 + corrector_steps)`` (the first evaluates ``x_0``).
The authors stop two levels early and return the last state; here every level runs and the
output is the Tweedie denoiser ``x - Sigma_K grad U`` of the last state (the gradient is
cached: no further network call).

``order="corrector_first"`` (ours), for each of the ``K`` levels ``sigma_0 .. sigma_{K-1} =
sigma_end``: evaluate ``E_k`` at the current position (one network gradient), the
``corrector_steps`` moves at ``Sigma_k``, then the predictor to ``Sigma_{k+1}`` from the last
move's cached gradient (the last level: no predictor noise; the output is Tweedie at
``Sigma_{K-1}``). Network gradients per chain: ``K (1 + corrector_steps)``.

The chains of a batch are independent (each row its own measurement and level); for many chains
per measurement, repeat the problem along the batch (:func:`repeat`) or ``jax.vmap`` the run
over keys. :class:`PCState`, :class:`PCInfo`, :func:`init`, :func:`build_kernel` follow
BlackJAX; :func:`sample` scans the kernel over the levels.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from jaxlib_ext.samplers.energy import langevin
from jaxlib_ext.samplers.energy.energy import EnergyFn
from jaxlib_ext.samplers.energy.levels import (
    check_level_shape,
    evaluate,
    geometric_sigmas,
    initial_position,
    level,
)
from jaxlib_ext.samplers.energy.problem import DiagonalProblem

__all__ = ["ORDERS", "PCInfo", "PCResult", "PCState", "build_kernel",
           "build_predictor_first_kernel", "init", "repeat", "sample"]

#: ``"predictor_first"``: the authors' order; ``"corrector_first"``: ours.
ORDERS = ("predictor_first", "corrector_first")


class PCState(NamedTuple):
    """position ``[B, ...]`` (at the noise level of the next step)."""

    position: jax.Array


class PCInfo(NamedTuple):
    """Per level: ``sigma`` (scalar), ``acceptance_rate`` ``[B]`` (mean over the corrector moves,
    1 for PC), ``step_size`` ``[B]`` (of the last move), ``energy`` ``[B]`` (``E_k`` after the
    corrector)."""

    sigma: jax.Array
    acceptance_rate: jax.Array
    step_size: jax.Array
    energy: jax.Array


class PCResult(NamedTuple):
    """``denoised`` ``[B, ...]`` (Tweedie at the last level), ``last`` (the last state),
    ``info`` (a :class:`PCInfo` stacked over levels), ``nfe`` (network gradients per chain)."""

    denoised: jax.Array
    last: jax.Array
    info: PCInfo
    nfe: int


def repeat(problem: DiagonalProblem, num_chains: int) -> DiagonalProblem:
    """Each measurement ``num_chains`` times along the batch (chain-major within a sample)."""
    return jax.tree.map(lambda a: jnp.repeat(a, num_chains, axis=0), problem)


def init(key, problem: DiagonalProblem) -> PCState:
    return PCState(initial_position(key, problem))


def _check(corrector_steps, levels):
    if corrector_steps < 0:
        raise ValueError(f"corrector_steps: expected >= 0, got {corrector_steps}")
    check_level_shape(levels)


def build_kernel(energy_fn: EnergyFn, *, corrector_steps: int = 1, snr: float = 0.15,
                 temperature: float = 1.0, metropolis: bool = False, levels: str = "scaled"):
    """The corrector-first level (ours): ``kernel(key, state, problem, sigma, sigma_next) ->
    (state, info, denoised)``; ``sigma_next = 0`` skips the predictor's noise (a plain
    denoising step)."""
    _check(corrector_steps, levels)
    move = langevin.build_kernel(metropolis=metropolis)

    def kernel(key, state: PCState, problem: DiagonalProblem, sigma, sigma_next):
        lev = level(problem, sigma ** 2, levels)
        nxt = level(problem, sigma_next ** 2, levels)
        target_fn = _target(energy_fn, problem, lev)
        x = state.position
        keys = jax.random.split(key, corrector_steps + 1)
        lstate, acc_mean, h_last = _correct(move, langevin.init(x, target_fn), target_fn,
                                            lev.precond, keys[1:], snr, temperature)
        x = lstate.position
        gu = _prior_from(lstate, problem, lev)
        d = lev.cov.diag - nxt.cov.diag                 # D_k = Sigma_k - Sigma_{k+1}
        xi = jax.random.normal(keys[0], x.shape, x.dtype)
        noise = jnp.where(sigma_next > 0, 1.0, 0.0) * lev.cov.apply_diag(xi, jnp.sqrt(d))
        x_new = x - lev.cov.apply_diag(gu, d) + noise
        denoised = x - lev.cov.apply(gu)
        info = PCInfo(jnp.asarray(sigma), acc_mean, h_last, lstate.energy)
        return PCState(x_new), info, denoised

    return kernel


def build_predictor_first_kernel(energy_fn: EnergyFn, *, corrector_steps: int = 1,
                                 snr: float = 0.15, temperature: float = 1.0,
                                 metropolis: bool = False, levels: str = "scaled"):
    """The predictor-first level (the authors' order): ``kernel(key, state, problem, sigma,
    sigma_next) -> (state, info, denoised)`` with ``state`` a
    :class:`~.langevin.LangevinState` at level ``sigma`` (its cached gradient drives the
    predictor) and the returned one at ``sigma_next > 0``; one network gradient for the moved
    position plus one per corrector move."""
    _check(corrector_steps, levels)
    move = langevin.build_kernel(metropolis=metropolis)

    def kernel(key, state: langevin.LangevinState, problem: DiagonalProblem, sigma, sigma_next):
        lev = level(problem, sigma ** 2, levels)
        nxt = level(problem, sigma_next ** 2, levels)
        keys = jax.random.split(key, corrector_steps + 1)
        gu = _prior_from(state, problem, lev)
        d = lev.cov.diag - nxt.cov.diag                 # D_k = Sigma_k - Sigma_{k+1}
        xi = jax.random.normal(keys[0], gu.shape, gu.dtype)
        x = state.position - lev.cov.apply_diag(gu, d) + lev.cov.apply_diag(xi, jnp.sqrt(d))
        target_fn = _target(energy_fn, problem, nxt)
        lstate, acc_mean, h_last = _correct(move, langevin.init(x, target_fn), target_fn,
                                            nxt.precond, keys[1:], snr, temperature)
        denoised = lstate.position - nxt.cov.apply(_prior_from(lstate, problem, nxt))
        info = PCInfo(jnp.asarray(sigma_next), acc_mean, h_last, lstate.energy)
        return lstate, info, denoised

    return kernel


def _correct(move, lstate, target_fn, precond, keys, snr, temperature):
    """The corrector moves, one per key: ``(state, mean acceptance [B], last step size [B])``
    (acceptance 1 and step 0 without moves)."""
    x = lstate.position
    if keys.shape[0] == 0:
        return lstate, jnp.ones(x.shape[:1], x.dtype), jnp.zeros(x.shape[:1], x.dtype)

    def corr(ls, k):
        ls2, info = move(k, ls, target_fn, precond, snr=snr, temperature=temperature)
        return ls2, (info.acceptance_rate, info.step_size)

    lstate, (acc, hs) = jax.lax.scan(corr, lstate, keys)
    return lstate, acc.mean(0), hs[-1]


def _target(energy_fn, problem, lev):
    def target_fn(x):
        ev = evaluate(energy_fn, problem, lev, x)
        return ev.energy, ev.grad

    return target_fn


def _prior_from(ls, problem, lev):
    """``grad U = grad E_k - W_k (x - z)`` from a cached ``grad E_k`` (V.2)."""
    return ls.grad - lev.cov.apply_diag(ls.position - problem.z, lev.weight)


def _level_step(kernel, problem):
    """A ``lax.scan`` body over ``(key, sigma, sigma_next)``."""
    def body(st, inp):
        k, s, sn = inp
        st2, info, den = kernel(k, st, problem, s, sn)
        return st2, (info, den)

    return body


def sample(energy_fn: EnergyFn, problem: DiagonalProblem, key, *, num_levels: int = 100,
           sigma_end: float = 0.01, corrector_steps: int = 1, snr: float = 0.15,
           temperature: float = 1.0, metropolis: bool = False, levels: str = "scaled",
           order: str = "predictor_first") -> PCResult:
    """Run PC (``metropolis=False``) or PC-MALA (``True``) from ``sigma_max`` down to
    ``sigma_end`` over ``num_levels`` levels (``order="predictor_first"``: ``num_levels``
    predictor steps, the authors'; ``"corrector_first"``: ours), on ``levels``-shaped
    covariances (``"scaled"``, the authors', or ``"clipped"``, ours); see the module
    docstring. ``info`` has one entry per level step (``sigma`` the level the correctors
    targeted). Jit-able with the keyword arguments static."""
    if order not in ORDERS:
        raise ValueError(f"order: expected one of {ORDERS}, got {order!r}")
    lowest = 1 if order == "predictor_first" else 2
    if isinstance(num_levels, bool) or not isinstance(num_levels, int) or num_levels < lowest:
        raise ValueError(f"num_levels: expected an int >= {lowest} for order={order!r}, got "
                         f"{num_levels!r}")
    opts = dict(corrector_steps=corrector_steps, snr=snr, temperature=temperature,
                metropolis=metropolis, levels=levels)
    k0, key = jax.random.split(key)
    if order == "predictor_first":
        sigmas = geometric_sigmas(problem.sigma_max, sigma_end, num_levels + 1)
        kernel = build_predictor_first_kernel(energy_fn, **opts)
        x0 = initial_position(k0, problem)
        state = langevin.init(x0, _target(energy_fn, problem,
                                          level(problem, sigmas[0] ** 2, levels)))

        keys = jax.random.split(key, num_levels)
        last, (infos, dens) = jax.lax.scan(_level_step(kernel, problem), state,
                                           (keys, sigmas[:-1], sigmas[1:]))
        return PCResult(dens[-1], last.position, infos, 1 + num_levels * (1 + corrector_steps))

    sigmas = geometric_sigmas(problem.sigma_max, sigma_end, num_levels)
    nexts = jnp.concatenate([sigmas[1:], jnp.zeros((1,), sigmas.dtype)])
    kernel = build_kernel(energy_fn, **opts)
    state = init(k0, problem)
    keys = jax.random.split(key, num_levels)
    last, (infos, dens) = jax.lax.scan(_level_step(kernel, problem), state,
                                       (keys[:-1], sigmas[:-1], nexts[:-1]))
    final, info_last, den_last = kernel(keys[-1], last, problem, sigmas[-1], nexts[-1])
    infos = jax.tree.map(lambda a, b: jnp.concatenate([a, b[None]]), infos, info_last)
    return PCResult(den_last, last.position, infos, num_levels * (1 + corrector_steps))
