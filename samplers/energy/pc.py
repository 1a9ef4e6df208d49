"""Posterior sampling for a diagonal linear inverse problem: predictor-corrector and PC-MALA.

arXiv 2605.15487 (the PC and PC-MALA samplers), on the levels of :mod:`.levels`: geometric
``sigma_0 = sigma_max > ... > sigma_end``, ``Sigma_k`` of shape ``levels`` (``"scaled"``,
(V.1a), the authors'; ``"clipped"``, (V.1), ours). Two step orders per level:

``order="predictor_first"`` (the authors' ``PC_sampler``, :func:`build_kernel`), for ``k = 0
.. K-1`` over the ``K + 1`` levels ``sigma_0 .. sigma_K = sigma_end``:

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

``order="corrector_first"`` (ours, :func:`build_corrector_first_kernel`), for each of the
``K`` levels ``sigma_0 .. sigma_{K-1} = sigma_end``: evaluate ``E_k`` at the current position
(one network gradient), the ``corrector_steps`` moves at ``Sigma_k``, then the predictor to
``Sigma_{k+1}`` from the last move's cached gradient (the last level: no predictor noise; the
output is Tweedie at ``Sigma_{K-1}``). Network gradients per chain: ``K (1 + corrector_steps)``.

The level index ``k`` is part of the state, so one step is ``step(rng_key, state)``; a step
past the last level keeps running the corrector at ``sigma_end`` (``D = 0``: no predictor).
The chains of a batch are independent (each row its own measurement and level); for many chains
per measurement, repeat the problem along the batch (:func:`repeat`) or ``jax.vmap`` the run
over keys. :class:`PCState`, :class:`PCInfo`, :func:`init`, :func:`build_kernel` follow
BlackJAX; :func:`predictor_corrector` binds a problem and returns a
:class:`~jaxlib_ext.samplers.base.SamplingAlgorithm`; :func:`sample` runs it over the levels.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from jaxlib_ext.samplers.base import SamplingAlgorithm
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

__all__ = ["ORDERS", "CorrectorFirstState", "PCInfo", "PCResult", "PCState", "build_kernel",
           "build_corrector_first_kernel", "init", "init_corrector_first", "level_schedule",
           "predictor_corrector", "repeat", "sample"]

#: ``"predictor_first"``: the authors' order; ``"corrector_first"``: ours.
ORDERS = ("predictor_first", "corrector_first")


class PCState(NamedTuple):
    """The predictor-first state: chains at level ``sigmas[step]`` with ``E_k`` cached there.

    Attributes:
      position: ``x_k`` ``[B, ...]``.
      energy: ``E_k(x_k)`` of (V.2) ``[B]``.
      grad: ``grad E_k(x_k)``, ``position``'s shape (the predictor reads it).
      step: the level index ``k``, an int32 scalar.
    """

    position: jax.Array
    energy: jax.Array
    grad: jax.Array
    step: jax.Array


class CorrectorFirstState(NamedTuple):
    """The corrector-first state.

    Attributes:
      position: ``x_k`` ``[B, ...]`` at level ``sigmas[step]``.
      step: the level index ``k``, an int32 scalar.
    """

    position: jax.Array
    step: jax.Array


class PCInfo(NamedTuple):
    """Diagnostics of one level step.

    Attributes:
      sigma: the level the correctors targeted (a scalar).
      acceptance_rate: ``[B]``, the mean over the corrector moves (1 for PC).
      step_size: ``[B]``, of the last move.
      energy: ``E_k`` after the corrector ``[B]``.
      denoised: the Tweedie estimate ``x - Sigma_k grad U`` after the corrector ``[B, ...]``.
    """

    sigma: jax.Array
    acceptance_rate: jax.Array
    step_size: jax.Array
    energy: jax.Array
    denoised: jax.Array


class PCResult(NamedTuple):
    """The output of :func:`sample`.

    Attributes:
      denoised: ``[B, ...]``, Tweedie at the last level.
      last: the last position ``[B, ...]`` at ``sigma_end`` (predictor first: after the last
        corrector moves; corrector first: before the last level's moves).
      info: a :class:`PCInfo` stacked over levels.
      nfe: network gradients per chain.
    """

    denoised: jax.Array
    last: jax.Array
    info: PCInfo
    nfe: int


def repeat(problem: DiagonalProblem, num_chains: int) -> DiagonalProblem:
    """Each measurement ``num_chains`` times along the batch (chain-major within a sample).

    Args:
      problem: a :class:`~.problem.DiagonalProblem` of ``B`` measurements.
      num_chains: copies per measurement.

    Returns:
      The problem of ``B * num_chains`` rows.
    """
    return jax.tree.map(lambda a: jnp.repeat(a, num_chains, axis=0), problem)


def _target(energy_fn, problem, lev):
    def target_fn(x):
        ev = evaluate(energy_fn, problem, lev, x)
        return ev.energy, ev.grad

    return target_fn


def init(position, energy_fn: EnergyFn, problem: DiagonalProblem, sigma, *,
         levels: str = "scaled") -> PCState:
    """The predictor-first state at level ``sigma`` (index 0): one network gradient.

    Args:
      position: ``x_0`` ``[B, ...]`` (e.g. :func:`~.levels.initial_position`).
      energy_fn: ``U(y, cov) -> [B]``.
      problem: the :class:`~.problem.DiagonalProblem`.
      sigma: the level ``sigma_0`` (the schedule's first, :func:`level_schedule`).
      levels: ``"scaled"`` (V.1a) or ``"clipped"`` (V.1).

    Returns:
      A :class:`PCState` with ``E_0`` and its gradient.
    """
    check_level_shape(levels)
    e, g = _target(energy_fn, problem, level(problem, sigma ** 2, levels))(position)
    return PCState(position, e, g, jnp.zeros((), jnp.int32))


def init_corrector_first(position) -> CorrectorFirstState:
    """The corrector-first state at the schedule's first level.

    Args:
      position: ``x_0`` ``[B, ...]`` (e.g. :func:`~.levels.initial_position`).

    Returns:
      A :class:`CorrectorFirstState` with level index 0.
    """
    return CorrectorFirstState(position, jnp.zeros((), jnp.int32))


def _check(corrector_steps, snr, temperature, levels):
    if (isinstance(corrector_steps, bool) or not isinstance(corrector_steps, int)
            or corrector_steps < 0):
        raise ValueError(f"corrector_steps: expected an int >= 0, got {corrector_steps!r}")
    for name, v in (("snr", snr), ("temperature", temperature)):
        if not isinstance(v, jax.core.Tracer) and not v > 0:  # traced: its caller checks it
            raise ValueError(f"{name}: expected > 0, got {v}")
    check_level_shape(levels)


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


def _prior_from(ls, problem, lev):
    """``grad U = grad E_k - W_k (x - z)`` from a cached ``grad E_k`` (V.2)."""
    return ls.grad - lev.cov.apply_diag(ls.position - problem.z, lev.weight)


def build_kernel(energy_fn: EnergyFn, *, corrector_steps: int = 1, snr: float = 0.15,
                 temperature: float = 1.0, metropolis: bool = False, levels: str = "scaled"):
    """The predictor-first level step (the authors' order; module docstring, steps 1-3).

    Args:
      energy_fn: ``U(y, cov) -> [B]``.
      corrector_steps: Langevin moves per level (>= 0).
      snr: the corrector's step rule (M.4).
      temperature: the corrector's ``T``.
      metropolis: True for PC-MALA (the exact MH step), False for PC.
      levels: ``"scaled"`` (V.1a, the authors') or ``"clipped"`` (V.1, ours).

    Returns:
      ``kernel(rng_key, state, problem, sigmas) -> (state, info)``: ``state`` a
      :class:`PCState` at level ``sigmas[k]``, ``k = state.step``, moved to ``sigmas[k + 1]``
      (``sigmas``: the ``K + 1`` levels, :func:`level_schedule`; past the last, ``sigma_end``
      again); ``info`` a :class:`PCInfo`. One network gradient for the moved position plus
      one per corrector move.

    References:
      arXiv 2605.15487 (PC, PC-MALA); Song et al., arXiv 2011.13456 (predictor-corrector).
    """
    _check(corrector_steps, snr, temperature, levels)
    move = langevin.build_kernel(metropolis=metropolis)

    def kernel(rng_key, state: PCState, problem: DiagonalProblem, sigmas):
        last = sigmas.shape[0] - 1
        sigma = sigmas[jnp.minimum(state.step, last)]
        sigma_next = sigmas[jnp.minimum(state.step + 1, last)]
        lev = level(problem, sigma ** 2, levels)
        nxt = level(problem, sigma_next ** 2, levels)
        keys = jax.random.split(rng_key, corrector_steps + 1)
        gu = _prior_from(state, problem, lev)
        d = lev.cov.diag - nxt.cov.diag                 # D_k = Sigma_k - Sigma_{k+1}
        xi = jax.random.normal(keys[0], gu.shape, gu.dtype)
        x = state.position - lev.cov.apply_diag(gu, d) + lev.cov.apply_diag(xi, jnp.sqrt(d))
        target_fn = _target(energy_fn, problem, nxt)
        lstate, acc_mean, h_last = _correct(move, langevin.init(x, target_fn), target_fn,
                                            nxt.precond, keys[1:], snr, temperature)
        denoised = lstate.position - nxt.cov.apply(_prior_from(lstate, problem, nxt))
        info = PCInfo(sigma_next, acc_mean, h_last, lstate.energy, denoised)
        return PCState(*lstate, state.step + 1), info

    return kernel


def build_corrector_first_kernel(energy_fn: EnergyFn, *, corrector_steps: int = 1,
                                 snr: float = 0.15, temperature: float = 1.0,
                                 metropolis: bool = False, levels: str = "scaled"):
    """The corrector-first level step (ours; module docstring).

    Args:
      energy_fn: ``U(y, cov) -> [B]``.
      corrector_steps: Langevin moves per level (>= 0).
      snr: the corrector's step rule (M.4).
      temperature: the corrector's ``T``.
      metropolis: True for the exact MH step, False for ULA moves.
      levels: ``"scaled"`` (V.1a) or ``"clipped"`` (V.1).

    Returns:
      ``kernel(rng_key, state, problem, sigmas) -> (state, info)``: ``state`` a
      :class:`CorrectorFirstState` at level ``sigmas[k]``, ``k = state.step``, corrected there
      and moved to ``sigmas[k + 1]`` (``sigmas``: the ``K`` levels; after the last one the
      predictor denoises without noise, past it the corrector stays at ``sigma_end``);
      ``info`` a :class:`PCInfo`. ``1 + corrector_steps`` network gradients.

    References:
      arXiv 2605.15487; Song et al., arXiv 2011.13456.
    """
    _check(corrector_steps, snr, temperature, levels)
    move = langevin.build_kernel(metropolis=metropolis)

    def kernel(rng_key, state: CorrectorFirstState, problem: DiagonalProblem, sigmas):
        last = sigmas.shape[0] - 1
        k = state.step
        sigma = sigmas[jnp.minimum(k, last)]
        # after the last level, sigma_next = 0 (a plain denoising step); past it, sigma_end
        sigma_next = jnp.where(k < last, sigmas[jnp.minimum(k + 1, last)],
                               jnp.where(k == last, jnp.zeros((), sigmas.dtype), sigmas[last]))
        lev = level(problem, sigma ** 2, levels)
        nxt = level(problem, sigma_next ** 2, levels)
        target_fn = _target(energy_fn, problem, lev)
        x = state.position
        keys = jax.random.split(rng_key, corrector_steps + 1)
        lstate, acc_mean, h_last = _correct(move, langevin.init(x, target_fn), target_fn,
                                            lev.precond, keys[1:], snr, temperature)
        x = lstate.position
        gu = _prior_from(lstate, problem, lev)
        d = lev.cov.diag - nxt.cov.diag                 # D_k = Sigma_k - Sigma_{k+1}
        xi = jax.random.normal(keys[0], x.shape, x.dtype)
        noise = jnp.where(sigma_next > 0, 1.0, 0.0) * lev.cov.apply_diag(xi, jnp.sqrt(d))
        x_new = x - lev.cov.apply_diag(gu, d) + noise
        denoised = x - lev.cov.apply(gu)
        info = PCInfo(sigma, acc_mean, h_last, lstate.energy, denoised)
        return CorrectorFirstState(x_new, k + 1), info

    return kernel


def _check_schedule(problem, num_levels, sigma_end, order):
    if order not in ORDERS:
        raise ValueError(f"order: expected one of {ORDERS}, got {order!r}")
    lowest = 1 if order == "predictor_first" else 2
    if isinstance(num_levels, bool) or not isinstance(num_levels, int) or num_levels < lowest:
        raise ValueError(f"num_levels: expected an int >= {lowest} for order={order!r}, got "
                         f"{num_levels!r}")
    if not 0 < sigma_end < problem.sigma_max:
        raise ValueError(f"sigma_end: expected in (0, sigma_max = {problem.sigma_max}), got "
                         f"{sigma_end}")


def level_schedule(problem: DiagonalProblem, *, num_levels: int = 100,
                   sigma_end: float = 0.01, order: str = "predictor_first"):
    """The geometric levels from ``sigma_max`` down to ``sigma_end``.

    Args:
      problem: the :class:`~.problem.DiagonalProblem` (its ``sigma_max``).
      num_levels: level steps (predictor steps for ``"predictor_first"``, levels for
        ``"corrector_first"``).
      sigma_end: the last level, in ``(0, sigma_max)``.
      order: ``"predictor_first"`` (``num_levels + 1`` levels) or ``"corrector_first"``
        (``num_levels`` levels).

    Returns:
      ``sigmas``, decreasing, ``[num_levels + 1]`` or ``[num_levels]``.
    """
    _check_schedule(problem, num_levels, sigma_end, order)
    count = num_levels + 1 if order == "predictor_first" else num_levels
    return geometric_sigmas(problem.sigma_max, sigma_end, count)


def predictor_corrector(energy_fn: EnergyFn, problem: DiagonalProblem, *,
                        num_levels: int = 100, sigma_end: float = 0.01,
                        corrector_steps: int = 1, snr: float = 0.15, temperature: float = 1.0,
                        metropolis: bool = False, levels: str = "scaled",
                        order: str = "predictor_first") -> SamplingAlgorithm:
    """PC (``metropolis=False``) or PC-MALA (``True``) with the problem and schedule bound.

    Args:
      energy_fn: ``U(y, cov) -> [B]``.
      problem: the :class:`~.problem.DiagonalProblem`, one row per chain.
      num_levels: level steps (see :func:`level_schedule`).
      sigma_end: the last level.
      corrector_steps: Langevin moves per level (>= 0).
      snr: the corrector's step rule (M.4).
      temperature: the corrector's ``T``.
      metropolis: True for PC-MALA, False for PC.
      levels: ``"scaled"`` (V.1a, the authors') or ``"clipped"`` (V.1, ours).
      order: ``"predictor_first"`` (the authors') or ``"corrector_first"`` (ours).

    Returns:
      A :class:`~jaxlib_ext.samplers.base.SamplingAlgorithm`: ``init(position)`` (one network
      gradient for ``"predictor_first"``) and ``step(rng_key, state) -> (state,``
      :class:`PCInfo` ``)``, one level per step.

    References:
      arXiv 2605.15487; Song et al., arXiv 2011.13456.
    """
    sigmas = level_schedule(problem, num_levels=num_levels, sigma_end=sigma_end, order=order)
    opts = dict(corrector_steps=corrector_steps, snr=snr, temperature=temperature,
                metropolis=metropolis, levels=levels)
    if order == "predictor_first":
        kernel = build_kernel(energy_fn, **opts)

        def init_fn(position):
            return init(position, energy_fn, problem, sigmas[0], levels=levels)
    else:
        kernel = build_corrector_first_kernel(energy_fn, **opts)
        init_fn = init_corrector_first

    def step_fn(rng_key, state):
        return kernel(rng_key, state, problem, sigmas)

    return SamplingAlgorithm(init_fn, step_fn)


def sample(rng_key, energy_fn: EnergyFn, problem: DiagonalProblem, *, num_levels: int = 100,
           sigma_end: float = 0.01, corrector_steps: int = 1, snr: float = 0.15,
           temperature: float = 1.0, metropolis: bool = False, levels: str = "scaled",
           order: str = "predictor_first") -> PCResult:
    """Run PC or PC-MALA from ``sigma_max`` down to ``sigma_end`` (module docstring).

    Args:
      rng_key: a PRNG key (the start ``x_0`` and every move).
      energy_fn: ``U(y, cov) -> [B]``.
      problem: the :class:`~.problem.DiagonalProblem`, one row per chain.
      num_levels: predictor steps (``"predictor_first"``, >= 1) or levels
        (``"corrector_first"``, >= 2).
      sigma_end: the last level, in ``(0, sigma_max)``.
      corrector_steps: Langevin moves per level (>= 0).
      snr: the corrector's step rule (M.4).
      temperature: the corrector's ``T``.
      metropolis: True for PC-MALA, False for PC.
      levels: ``"scaled"`` (V.1a, the authors') or ``"clipped"`` (V.1, ours).
      order: ``"predictor_first"`` (the authors') or ``"corrector_first"`` (ours).

    Returns:
      A :class:`PCResult`; its ``info`` has one entry per level step (``sigma``: the level the
      correctors targeted). Jit-able with the keyword arguments static.

    References:
      arXiv 2605.15487; Song et al., arXiv 2011.13456.
    """
    algorithm = predictor_corrector(energy_fn, problem, num_levels=num_levels,
                                    sigma_end=sigma_end, corrector_steps=corrector_steps,
                                    snr=snr, temperature=temperature, metropolis=metropolis,
                                    levels=levels, order=order)
    k0, key = jax.random.split(rng_key)
    state = algorithm.init(initial_position(k0, problem))
    keys = jax.random.split(key, num_levels)

    def body(st, k):
        return algorithm.step(k, st)

    if order == "predictor_first":
        last, infos = jax.lax.scan(body, state, keys)
        return PCResult(infos.denoised[-1], last.position, infos,
                        1 + num_levels * (1 + corrector_steps))
    last, infos = jax.lax.scan(body, state, keys[:-1])
    _, info_last = algorithm.step(keys[-1], last)
    infos = jax.tree.map(lambda a, b: jnp.concatenate([a, b[None]]), infos, info_last)
    return PCResult(info_last.denoised, last.position, infos,
                    num_levels * (1 + corrector_steps))
