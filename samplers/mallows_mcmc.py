"""Bayesian Mallows MCMC (footrule) with leap-and-shift proposals, as a NumPyro ``MCMCKernel``.

Vitelli, Sørensen, Crispino, Frigessi, Arjas, "Probabilistic preference learning with the Mallows
rank model", JMLR 18(158), 2018 -- the baseline of Pseudo-Mallows (arXiv 2205.13911).

Model (footrule, BayesMallows' ``alpha/n`` scaling), ``N`` assessors, ``D`` as in
``rankings.footrule_data_matrix``::

    P(R_1..R_N | rho, alpha) = Z_n(alpha)^{-N} exp(-(alpha/n) sum_i D[i, rho_i - 1])      (M.1)
    rho ~ uniform,  alpha ~ Exponential(rate lambda)

**Leap-and-shift** (Vitelli et al. 2018, sec. 3.1): draw an item ``u`` uniformly and a new rank
``r*`` uniformly from ``S = {max(1, rho_u - L) .. min(n, rho_u + L)} \\ {rho_u}``; put ``u`` at
``r*`` and shift the items ranked between by one towards ``rho_u``. With
``s(x) = min(n, x + L) - max(1, x - L)`` (the size of ``S`` around rank ``x``)::

    q(rho'|rho) = 1/(n s(rho_u))                           if |r* - rho_u| > 1           (M.2)
    q(rho'|rho) = 1/(n s(rho_u)) + 1/(n s(r*))             if |r* - rho_u| = 1

(an adjacent swap is reached by moving either of the two items), so the Hastings correction is
``log q(rho|rho') - log q(rho'|rho) = log s(rho_u) - log s(r*)`` for leaps longer than one and
``0`` otherwise.

**alpha** moves on a log-normal random walk ``alpha' = alpha exp(sigma eps)`` (Hastings term
``log alpha' - log alpha``) and needs ``log Z_n(alpha)``. :func:`footrule_log_partition` computes
it exactly for every ``n`` from the distribution of footrule distances, which a dynamic programme
over "pending" items produces in O(n^4): after matching positions and values ``1..t`` the number
``k_t`` of positions still waiting for a larger value equals the number of values waiting for a
later position, and ``d_F = 2 sum_t k_t``. The importance-sampling estimate (proposal: a
pseudo-Mallows around the identity, whose log weight is its ``sum_k log C_k``) is provided as
``method="importance"`` and checked against the exact counts in the tests.

**Layout** (the kernel contract of :mod:`jaxlib_ext.samplers.base`): :func:`init` builds a
:class:`MallowsState` (what a chain carries) from ``position = {"rho", "alpha"}``,
:func:`build_kernel` returns the pure ``kernel(rng_key, state) -> (state, info)`` with a
:class:`MallowsInfo` of per-step diagnostics, and :func:`mallows_mh` binds the data and the
settings into a ``SamplingAlgorithm(init, step)``. :class:`MallowsMH` adapts the pair to
``numpyro.infer.MCMC`` (its state carries the key, as NumPyro's kernels do) and
:func:`run_mallows_mcmc` scans the vmapped adapter directly.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from numpyro.diagnostics import effective_sample_size, split_gelman_rubin
from numpyro.infer.mcmc import MCMCKernel
from numpyro.util import is_prng_key

from jaxlib_ext.samplers.base import SamplingAlgorithm
from jaxlib_ext.samplers.mallows_augment import augment_mh, check_augmentation_args
from jaxlib_ext.samplers.pseudo_mallows import pseudo_mallows_sample, v_order
from jaxlib_ext.samplers.rankings import (
    Blocks,
    footrule_data_matrix,
    validate_permutation,
    validate_rankings,
)

__all__ = [
    "FootruleLogPartition",
    "MCMCResult",
    "MallowsInfo",
    "MallowsMH",
    "MallowsMHState",
    "MallowsState",
    "build_kernel",
    "footrule_distance_log_counts",
    "footrule_log_partition",
    "init",
    "leap_and_shift",
    "leap_and_shift_move",
    "mallows_mh",
    "rank_diagnostics",
    "run_mallows_mcmc",
]


# --------------------------------------------------------------------------- partition function


def footrule_distance_log_counts(n: int) -> tuple[np.ndarray, np.ndarray]:
    """``(d, log N_n(d))`` for every even footrule distance ``d`` of ``n`` items (float64).

    ``N_n(d)`` = number of permutations at footrule distance ``d`` from the identity. DP over
    steps ``t`` with state (pending count ``k``, distance so far); per step the transitions are
    ``k -> k`` (weight ``1 + 2k``), ``k -> k - 1`` (weight ``k^2``), ``k -> k + 1`` (weight 1),
    each adding ``2 k_new`` to the distance (module docstring).

    Args:
      n: the number of items, ``>= 1``.

    Returns:
      ``(d, log_counts)``: the attained distances and ``log N_n(d)``, float64 numpy arrays of
      the same length (at most ``floor(n^2/4) + 1``).

    Raises:
      ValueError: when ``n < 1``.
    """
    if n < 1:
        raise ValueError(f"n: expected >= 1, got {n}")
    half = n * n // 4 + 1  # max footrule is 2 * floor(n^2/4); index = d/2
    lg = np.full((n + 2, half + n + 2), -np.inf)
    lg[0, 0] = 0.0
    for _ in range(n):
        new = np.full_like(lg, -np.inf)
        for k in range(n + 1):
            row = lg[k]
            if not np.isfinite(row).any():
                continue
            for k2, w in ((k, 1 + 2 * k), (k - 1, k * k), (k + 1, 1)):
                if k2 < 0 or w == 0 or k2 > n:
                    continue
                shifted = np.full_like(row, -np.inf)
                if k2 > 0:
                    shifted[k2:] = row[:-k2]
                else:
                    shifted = row
                new[k2] = np.logaddexp(new[k2], shifted + math.log(w))
        lg = new
    row = lg[0]
    idx = np.nonzero(np.isfinite(row))[0]
    return 2.0 * idx, row[idx]


class FootruleLogPartition(NamedTuple):
    """``log Z_n(alpha)`` as a jit-able callable: exact (counts) or IS (grid + interpolation)."""

    n: int
    distances: jax.Array | None
    log_counts: jax.Array | None
    alpha_grid: jax.Array | None
    log_z_grid: jax.Array | None

    def __call__(self, alpha):
        if self.distances is not None:
            return jax.nn.logsumexp(self.log_counts - (alpha / self.n) * self.distances)
        return jnp.interp(alpha, self.alpha_grid, self.log_z_grid)


def _log_z_importance(key, alpha, n: int, num_samples: int):
    """IS estimate of ``log Z_n(alpha)``: proposal = pseudo-Mallows with ``D[i, r-1] = |i+1-r|``
    and the V order; target numerator equals the proposal numerator, so ``log w = sum log C``."""
    ids = jnp.arange(1, n + 1)
    D = jnp.abs(ids[:, None] - ids[None, :]).astype(jnp.result_type(float))
    order = v_order(ids)
    keys = jax.random.split(key, num_samples)
    _, logw = jax.vmap(lambda k: pseudo_mallows_sample(k, alpha, D, order))(keys)
    return jax.nn.logsumexp(logw) - jnp.log(num_samples)


def footrule_log_partition(
    n: int,
    *,
    method: str = "exact",
    key=None,
    alpha_grid=None,
    num_samples: int = 10_000,
) -> FootruleLogPartition:
    """``log Z_n(alpha) = log sum_sigma exp(-(alpha/n) d_F(sigma, id))`` as a callable.

    Args:
      n: the number of items.
      method: ``"exact"`` uses :func:`footrule_distance_log_counts` (any n); ``"importance"``
        estimates ``log Z_n`` on ``alpha_grid`` with pseudo-Mallows proposals and interpolates
        linearly.
      key: a PRNG key; required for ``method="importance"``.
      alpha_grid: the ``alpha`` values of the importance estimate; ``None`` is
        ``linspace(0, 50, 101)``.
      num_samples: pseudo-Mallows proposals per grid point for ``method="importance"``.

    Returns:
      A :class:`FootruleLogPartition`, a jit-able callable ``alpha -> log Z_n(alpha)``.

    Raises:
      ValueError: for an unknown ``method``, ``method="importance"`` without ``key``, or
        ``n < 1`` with ``method="exact"``.
    """
    if method == "exact":
        d, lc = footrule_distance_log_counts(n)
        ft = jnp.result_type(float)
        return FootruleLogPartition(n, jnp.asarray(d, ft), jnp.asarray(lc, ft), None, None)
    if method == "importance":
        if key is None:
            raise ValueError("key: method='importance' needs a PRNG key")
        grid = jnp.linspace(0.0, 50.0, 101) if alpha_grid is None else jnp.asarray(alpha_grid)
        keys = jax.random.split(key, grid.shape[0])
        lz = jnp.stack([_log_z_importance(k, a, n, num_samples) for k, a in zip(keys, grid)])
        return FootruleLogPartition(n, None, None, grid, lz)
    raise ValueError(f"method: expected 'exact' or 'importance', got {method!r}")


# --------------------------------------------------------------------------- proposal


def _window(x, n, L):
    return jnp.minimum(n, x + L) - jnp.maximum(1, x - L)


def leap_and_shift_move(rho, item, rank, leap_size: int):
    """The deterministic part of leap-and-shift (M.2): ``item`` to ``rank``, the items ranked
    between shifted by one towards its old rank.

    Args:
      rho: ``int [n]`` 1-based ranks.
      item: the 0-based item ``u``.
      rank: its new rank ``r*``, in the window ``S`` around ``rho_u`` (``r* != rho_u``).
      leap_size: ``L``.

    Returns:
      ``(rho', log q(rho | rho') - log q(rho' | rho))``.
    """
    n = rho.shape[0]
    a = rho[item]
    down = (rho > a) & (rho <= rank)  # leap down the list: those items move up by one
    up = (rho >= rank) & (rho < a)
    new = (rho - down + up).at[item].set(rank)
    log_ratio = jnp.where(
        jnp.abs(rank - a) == 1, 0.0,
        jnp.log(_window(a, n, leap_size) * 1.0) - jnp.log(_window(rank, n, leap_size) * 1.0)
    )
    return new.astype(rho.dtype), log_ratio


def leap_and_shift(key, rho, leap_size: int):
    """One leap-and-shift proposal (M.2).

    Args:
      key: PRNG key of the item and the new rank, both uniform.
      rho: ``int [n]`` 1-based ranks.
      leap_size: ``L``.

    Returns:
      ``(rho', log q(rho | rho') - log q(rho' | rho))``.

    References:
      Vitelli et al., JMLR 18(158), 2018, sec. 3.1.
    """
    n = rho.shape[0]
    k1, k2 = jax.random.split(key)
    u = jax.random.randint(k1, (), 0, n)
    a = rho[u]
    lo = jnp.maximum(1, a - leap_size)
    s = _window(a, n, leap_size)
    j = jax.random.randint(k2, (), 0, s)
    r = lo + j
    r = jnp.where(r >= a, r + 1, r)  # skip the current rank
    return leap_and_shift_move(rho, u, r, leap_size)


# --------------------------------------------------------------------------- kernel


class MallowsState(NamedTuple):
    """What one chain carries from step to step.

    ``rho``: consensus ranks ``int32 [n]``; ``alpha``: scale (fixed unless updated); ``D``: the
    data matrix of the current data; ``rankings``: the augmented data ``[N, n]`` (``[0, n]`` for
    complete data, whose ``D`` stays fixed); ``iteration``: steps taken (the alpha move runs
    every ``alpha_jump`` of them).
    """

    rho: jax.Array
    alpha: jax.Array
    D: jax.Array
    rankings: jax.Array
    iteration: jax.Array

    @property
    def position(self) -> dict:
        """The sampled variables, ``{"rho": int32[n], "alpha": float}``."""
        return {"rho": self.rho, "alpha": self.alpha}


class MallowsInfo(NamedTuple):
    """Diagnostics of one step: the fraction of the ``rho_steps`` leap-and-shift proposals
    accepted and whether the alpha proposal was accepted (``0`` when alpha is fixed)."""

    rho_acceptance_rate: jax.Array
    alpha_accepted: jax.Array


def _dist_sum(D, rho):
    return jnp.take_along_axis(D, (rho - 1)[:, None], axis=1).sum()


def _is_concrete(x) -> bool:
    return not isinstance(x, jax.core.Tracer)


def init(position, D, rankings=None) -> MallowsState:
    """The state of one chain at ``position``.

    Args:
      position: ``{"rho": int[n], "alpha": float}``, the sampled variables (as in
        :attr:`MallowsState.position`): 1-based consensus ranks and the scale ``alpha > 0``.
      D: ``[n, n]`` float data matrix (``rankings.footrule_data_matrix``).
      rankings: the augmented data ``[N, n]`` for partial data, ``None`` for complete data.

    Returns:
      A :class:`MallowsState` at iteration 0. Values are checked when concrete (not under
      ``jit``/``vmap``), shapes always.
    """
    if not (hasattr(position, "keys") and {"rho", "alpha"} <= set(position.keys())):
        raise TypeError(f"position: expected a mapping with 'rho' and 'alpha', got "
                        f"{type(position).__name__}")
    D = jnp.asarray(D)
    if D.ndim != 2 or D.shape[0] != D.shape[1] or not jnp.issubdtype(D.dtype, jnp.floating):
        raise ValueError(f"D: expected a square float [n, n] data matrix, got {D.dtype} "
                         f"{D.shape}")
    n = D.shape[0]
    rho, alpha = position["rho"], position["alpha"]
    if jnp.shape(rho) != (n,):
        raise ValueError(f"position['rho']: expected shape ({n},), got {jnp.shape(rho)}")
    if _is_concrete(rho):
        validate_permutation(rho, n, zero_based=False, name="position['rho']")
    if jnp.ndim(alpha) != 0:
        raise ValueError(f"position['alpha']: expected a scalar, got shape {jnp.shape(alpha)}")
    if _is_concrete(alpha) and not (np.isfinite(alpha) and alpha > 0):
        raise ValueError(f"position['alpha']: expected a finite value > 0, got {alpha}")
    if rankings is None:
        rankings = jnp.zeros((0, n), jnp.int32)
    if jnp.ndim(rankings) != 2 or jnp.shape(rankings)[1] != n:
        raise ValueError(f"rankings: expected shape [N, {n}], got {jnp.shape(rankings)}")
    return MallowsState(jnp.asarray(rho, jnp.int32), jnp.asarray(alpha, D.dtype), D,
                        jnp.asarray(rankings, jnp.int32), jnp.int32(0))


def build_kernel(
    *,
    num_assessors: int,
    leap_size: int = 1,
    update_alpha: bool = False,
    sigma_alpha: float = 0.1,
    alpha_rate: float = 0.1,
    alpha_jump: int = 1,
    log_partition: Callable | None = None,
    blocks: Blocks | None = None,
    prefer=None,
    num_swaps: int = 0,
    rho_steps: int = 1,
):
    """One Metropolis-Hastings step of the Bayesian Mallows model (footrule) for one chain.

    The step makes ``rho_steps`` leap-and-shift moves on ``rho`` (M.2), an alpha move every
    ``alpha_jump`` iterations (if ``update_alpha``) and, for partial data, ``num_swaps``
    augmentation swaps per user (``mallows_augment.augment_mh``). Every part is an exact
    Metropolis-Hastings step of the posterior (M.1) (joint with the latent rankings for
    partial data), so the chain leaves it invariant.

    Args:
      num_assessors: ``N`` of (M.1), the exponent of ``Z_n(alpha)`` in the alpha move.
      leap_size: ``L`` of leap-and-shift.
      update_alpha: move alpha on a log-normal random walk with an Exponential prior.
      sigma_alpha: the random walk's ``sigma``.
      alpha_rate: the prior's rate ``lambda``.
      alpha_jump: iterations between alpha moves.
      log_partition: ``log Z_n(alpha)`` (:func:`footrule_log_partition`); needed with
        ``update_alpha``.
      blocks, prefer: block or pairwise data of the augmentation (``None``: complete data).
      num_swaps: augmentation swaps per user and step.
      rho_steps: leap-and-shift proposals per step.

    Returns:
      ``kernel(rng_key, state) -> (state, info)`` on :class:`MallowsState` and
      :class:`MallowsInfo`, pure and jit-able; ``vmap`` it over chains. The key is split into
      the keys of the rho moves, the alpha move and the augmentation.

    References:
      Vitelli, Sørensen, Crispino, Frigessi, Arjas, "Probabilistic preference learning with
      the Mallows rank model", JMLR 18(158), 2018, sec. 3.1.
    """
    if update_alpha and log_partition is None:
        raise ValueError("log_partition: needed with update_alpha")
    augment = blocks is not None or prefer is not None

    def kernel(rng_key, state: MallowsState) -> tuple[MallowsState, MallowsInfo]:
        k_rho, k_alpha, k_aug = jax.random.split(rng_key, 3)
        rho, alpha, D = state.rho, state.alpha, state.D
        n = rho.shape[0]

        def rho_move(t, carry):
            rho, accepted = carry
            kp, ku = jax.random.split(jax.random.fold_in(k_rho, t))
            prop, log_ratio = leap_and_shift(kp, rho, leap_size)
            dlog = -(alpha / n) * (_dist_sum(D, prop) - _dist_sum(D, rho)) + log_ratio  # (M.1)
            ok = jnp.log(jax.random.uniform(ku)) < dlog
            return jnp.where(ok, prop, rho), accepted + ok.astype(jnp.float32) / rho_steps

        rho, rho_rate = jax.lax.fori_loop(0, rho_steps, rho_move, (rho, jnp.float32(0.0)))
        alpha_accepted = jnp.float32(0.0)
        if update_alpha:
            ke, ku = jax.random.split(k_alpha)
            new_alpha = alpha * jnp.exp(sigma_alpha * jax.random.normal(ke))
            s = _dist_sum(D, rho)
            dlog = (
                -(new_alpha - alpha) / n * s
                - num_assessors * (log_partition(new_alpha) - log_partition(alpha))
                - alpha_rate * (new_alpha - alpha)
                + jnp.log(new_alpha) - jnp.log(alpha)  # log-normal proposal correction
            )
            ok = (jnp.log(jax.random.uniform(ku)) < dlog) & (state.iteration % alpha_jump == 0)
            alpha = jnp.where(ok, new_alpha, alpha)
            alpha_accepted = ok.astype(jnp.float32)
        R = state.rankings
        if augment:
            R = augment_mh(k_aug, rho, R, alpha, num_swaps, prefer=prefer, blocks=blocks)
            D = footrule_data_matrix(R).astype(D.dtype)
        new_state = MallowsState(rho, alpha, D, R, state.iteration + 1)
        return new_state, MallowsInfo(rho_rate, alpha_accepted)

    return kernel


class _MallowsData(NamedTuple):
    """Validated inputs of :func:`mallows_mh` and :class:`MallowsMH`."""

    D: jax.Array
    rankings: jax.Array  # augmented data [N, n], or [0, n] for complete data
    num_assessors: int
    blocks: Blocks | None
    prefer: jax.Array | None


def _prepare(rankings, D, num_assessors, blocks, prefer, alpha) -> _MallowsData:
    if not (np.isfinite(alpha) and alpha > 0):
        raise ValueError(f"alpha: expected a finite value > 0, got {alpha}")
    ft = jnp.result_type(float)
    if blocks is not None or prefer is not None:
        if rankings is None:
            raise ValueError("rankings: augmentation needs initial complete rankings")
        R, blocks, prefer = check_augmentation_args(rankings, blocks, prefer)
        D = jnp.asarray(footrule_data_matrix(R), ft)
        return _MallowsData(D, jnp.asarray(R), R.shape[0], blocks, prefer)
    if rankings is not None:
        R = validate_rankings(rankings)
        R = R.reshape(-1, R.shape[-1])
        no_data = jnp.zeros((0, R.shape[1]), jnp.int32)
        return _MallowsData(jnp.asarray(footrule_data_matrix(R), ft), no_data, R.shape[0], None,
                            None)
    if D is None:
        raise ValueError("rankings/D: pass the rankings or the data matrix D")
    d = np.asarray(D)
    if d.ndim != 2 or d.shape[0] != d.shape[1]:
        raise ValueError(f"D: expected a square [n, n] data matrix, got shape {d.shape}")
    if num_assessors is None:
        raise ValueError("num_assessors: needed with D (for the alpha update)")
    no_data = jnp.zeros((0, d.shape[0]), jnp.int32)
    return _MallowsData(jnp.asarray(d, ft), no_data, num_assessors, None, None)


def _setup(rankings, *, D, num_assessors, alpha, leap_size, update_alpha, sigma_alpha,
           alpha_rate, alpha_jump, log_partition, blocks, prefer, num_swaps, rho_steps,
           key_importance) -> tuple[_MallowsData, Callable]:
    """Validated data and the kernel of :func:`mallows_mh` and :class:`MallowsMH`."""
    data = _prepare(rankings, D, num_assessors, blocks, prefer, alpha)
    n = data.D.shape[0]
    if not (isinstance(leap_size, int) and 1 <= leap_size < max(n, 2)):
        raise ValueError(f"leap_size: expected an int in 1..{max(n - 1, 1)}, got {leap_size}")
    if sigma_alpha <= 0 or alpha_rate < 0:
        raise ValueError("sigma_alpha must be > 0 and alpha_rate >= 0")
    lp = None
    if update_alpha:
        lp = log_partition
        if isinstance(log_partition, str):
            lp = footrule_log_partition(n, method=log_partition, key=key_importance)
    kernel = build_kernel(
        num_assessors=data.num_assessors,
        leap_size=leap_size,
        update_alpha=update_alpha,
        sigma_alpha=sigma_alpha,
        alpha_rate=alpha_rate,
        alpha_jump=alpha_jump,
        log_partition=lp,
        blocks=data.blocks,
        prefer=data.prefer,
        num_swaps=n if num_swaps is None else num_swaps,
        rho_steps=rho_steps,
    )
    return data, kernel


def mallows_mh(
    rankings=None,
    *,
    D=None,
    num_assessors=None,
    alpha: float = 1.0,
    leap_size: int = 1,
    update_alpha: bool = False,
    sigma_alpha: float = 0.1,
    alpha_rate: float = 0.1,
    alpha_jump: int = 1,
    log_partition="exact",
    blocks=None,
    prefer=None,
    num_swaps: int | None = None,
    rho_steps: int = 1,
    key_importance=None,
) -> SamplingAlgorithm:
    """Metropolis-Hastings for the Bayesian Mallows model (footrule), BlackJAX style.

    Args:
      rankings: complete rankings ``[N, n]`` (or the initial augmented data with
        ``blocks``/``prefer``); or pass ``D`` and ``num_assessors`` instead.
      D: ``[n, n]`` data matrix, with ``num_assessors``, in place of ``rankings``.
      num_assessors: ``N`` when ``D`` is given.
      alpha: fixed scale, or the initial one when ``update_alpha``; the default of ``init``.
      leap_size: ``L`` of leap-and-shift.
      update_alpha: log-normal random walk (sd ``sigma_alpha``) on alpha with an
        Exponential(``alpha_rate``) prior, every ``alpha_jump`` iterations.
      sigma_alpha, alpha_rate, alpha_jump: as for ``update_alpha``.
      log_partition: ``"exact"``, ``"importance"`` or a :class:`FootruleLogPartition`.
      blocks, prefer: partial / click / pairwise data, augmented with ``num_swaps`` Metropolis
        swaps per user and iteration (default ``n``).
      num_swaps: as for ``blocks``/``prefer``.
      rho_steps: leap-and-shift proposals per iteration.
      key_importance: PRNG key of ``log_partition="importance"``.

    Returns:
      A :class:`~jaxlib_ext.samplers.base.SamplingAlgorithm`: ``init(position)`` with
      ``position = {"rho": int[n]}`` or ``{"rho": ..., "alpha": ...}`` (``alpha`` defaults to
      the ``alpha`` above; :func:`init` on this data) and ``step(rng_key, state)``
      (:func:`build_kernel`).

    References:
      Vitelli, Sørensen, Crispino, Frigessi, Arjas, "Probabilistic preference learning with
      the Mallows rank model", JMLR 18(158), 2018.
    """
    data, kernel = _setup(
        rankings, D=D, num_assessors=num_assessors, alpha=alpha, leap_size=leap_size,
        update_alpha=update_alpha, sigma_alpha=sigma_alpha, alpha_rate=alpha_rate,
        alpha_jump=alpha_jump, log_partition=log_partition, blocks=blocks, prefer=prefer,
        num_swaps=num_swaps, rho_steps=rho_steps, key_importance=key_importance,
    )

    def init_fn(position) -> MallowsState:
        if not (hasattr(position, "keys") and "rho" in position.keys()):
            raise TypeError(f"position: expected a mapping with 'rho' (and optionally "
                            f"'alpha'), got {type(position).__name__}")
        position = {"alpha": alpha, **position}
        return init(position, data.D, data.rankings)

    return SamplingAlgorithm(init_fn, kernel)


class MallowsMHState(NamedTuple):
    """The state :class:`MallowsMH` hands to ``numpyro.infer.MCMC``: the chain, the info of
    its last step and the key of the next step (NumPyro's kernels keep ``rng_key`` in their
    state; ``MCMC.run`` after ``MCMC.warmup`` replaces it). Its ``position`` is the
    ``sample_field``; collect diagnostics with e.g.
    ``extra_fields=("info.rho_acceptance_rate",)``."""

    chain: MallowsState
    info: MallowsInfo
    rng_key: jax.Array

    @property
    def position(self) -> dict:
        return self.chain.position


class MallowsMH(MCMCKernel):
    """Metropolis-Hastings for the Bayesian Mallows model (footrule), for ``numpyro.infer.MCMC``.

    A thin adapter over :func:`mallows_mh` (:func:`init` and :func:`build_kernel`) that keeps
    NumPyro's kernel contract: ``init(rng_key, num_warmup, init_params, model_args,
    model_kwargs)`` and ``sample(state, model_args, model_kwargs)`` on a
    :class:`MallowsMHState` that carries its ``rng_key``. Samples are
    ``{"rho": int32[n], "alpha": float}``. With ``chain_method="vectorized"`` the states carry
    a leading chain axis and the kernel is vmapped over it.

    Its arguments (``rankings``, ``D``, ``num_assessors``, ``alpha``, ``leap_size``,
    ``update_alpha``, ``sigma_alpha``, ``alpha_rate``, ``alpha_jump``, ``log_partition``,
    ``blocks``, ``prefer``, ``num_swaps``, ``rho_steps``, ``key_importance``) are those of
    :func:`mallows_mh`.
    """

    sample_field = "position"

    def __init__(
        self,
        rankings=None,
        *,
        D=None,
        num_assessors=None,
        alpha: float = 1.0,
        leap_size: int = 1,
        update_alpha: bool = False,
        sigma_alpha: float = 0.1,
        alpha_rate: float = 0.1,
        alpha_jump: int = 1,
        log_partition="exact",
        blocks=None,
        prefer=None,
        num_swaps: int | None = None,
        rho_steps: int = 1,
        key_importance=None,
    ):
        self.data, self.kernel = _setup(
            rankings, D=D, num_assessors=num_assessors, alpha=alpha, leap_size=leap_size,
            update_alpha=update_alpha, sigma_alpha=sigma_alpha, alpha_rate=alpha_rate,
            alpha_jump=alpha_jump, log_partition=log_partition, blocks=blocks, prefer=prefer,
            num_swaps=num_swaps, rho_steps=rho_steps, key_importance=key_importance,
        )
        self.alpha = alpha

    def init_chain(self, rng_key, rho=None) -> MallowsState:
        """:func:`init` on this kernel's data at ``rho``, or at a uniformly random permutation
        drawn with ``rng_key`` (one chain; ``vmap`` it over keys)."""
        n = self.data.D.shape[0]
        if rho is None:
            rho = jax.random.permutation(rng_key, n).astype(jnp.int32) + 1
        return init({"rho": rho, "alpha": self.alpha}, self.data.D, self.data.rankings)

    def _init_one(self, rng_key, rho=None) -> MallowsMHState:
        k_chain, k_run = jax.random.split(rng_key)
        chain = self.init_chain(k_chain, rho)
        no_info = MallowsInfo(jnp.float32(0.0), jnp.float32(0.0))
        return MallowsMHState(chain, no_info, k_run)

    def init(self, rng_key, num_warmup, init_params, model_args, model_kwargs):
        rho0 = None
        if init_params is not None:
            rho0 = init_params["rho"] if isinstance(init_params, dict) else init_params
            rho0 = jnp.asarray(rho0, jnp.int32)
        if is_prng_key(rng_key):
            if rho0 is not None:
                validate_permutation(rho0, self.data.D.shape[0], zero_based=False,
                                     name="init_params")
            return self._init_one(rng_key, rho0)
        if rho0 is None:
            return jax.vmap(self._init_one)(rng_key)
        return jax.vmap(self._init_one)(rng_key, rho0)

    def _sample_one(self, state: MallowsMHState) -> MallowsMHState:
        rng_key, k_step = jax.random.split(state.rng_key)
        chain, info = self.kernel(k_step, state.chain)
        return MallowsMHState(chain, info, rng_key)

    def sample(self, state, model_args, model_kwargs):
        batched = state.chain.rho.ndim == 2  # chain_method="vectorized"
        return jax.vmap(self._sample_one)(state) if batched else self._sample_one(state)

    def get_diagnostics_str(self, state):
        return f"acc. rho {float(jnp.mean(state.info.rho_acceptance_rate)):.2f}"


# --------------------------------------------------------------------------- fast driver


class MCMCResult(NamedTuple):
    """``rho [C, S, n]``, ``alpha [C, S]``, mean acceptance rates, per-user rank probabilities
    ``[N, n, n]`` (zeros for complete data) and the final states."""

    rho: jax.Array
    alpha: jax.Array
    rho_acceptance_rate: jax.Array
    alpha_acceptance_rate: jax.Array
    user_rank_probs: jax.Array
    state: MallowsState


def run_mallows_mcmc(
    key,
    rankings=None,
    *,
    num_chains: int = 4,
    num_samples: int = 1000,
    num_warmup: int = 1000,
    thin: int = 1,
    D=None,
    num_assessors=None,
    alpha: float = 1.0,
    key_importance=None,
    **kernel_kwargs,
) -> MCMCResult:
    """Runs vectorised chains of :class:`MallowsMH` inside one ``lax.scan``, without NumPyro's
    driver.

    With ``thin=1`` and ``num_chains > 1`` the draws equal those of
    ``numpyro.infer.MCMC(MallowsMH(...), num_warmup=num_warmup, num_samples=num_samples,
    num_chains=num_chains, chain_method="vectorized").run(key)``.

    Args:
      key: PRNG key, split into one key per chain.
      rankings: as in :func:`mallows_mh`, as are ``D``, ``num_assessors``, ``alpha``,
        ``key_importance`` and the keyword arguments ``kernel_kwargs``.
      num_chains: chains, from uniformly random permutations.
      num_samples: draws kept per chain.
      num_warmup: steps dropped per chain first.
      thin: steps per kept draw.

    Returns:
      An :class:`MCMCResult`.
    """
    mh = MallowsMH(
        rankings, D=D, num_assessors=num_assessors, alpha=alpha,
        key_importance=key_importance, **kernel_kwargs,
    )
    state = mh.init(jax.random.split(key, num_chains), num_warmup, None, (), {})
    return _run_scan(lambda s: mh.sample(s, (), {}), state, num_samples, num_warmup, thin)


def _run_scan(sample, state0: MallowsMHState, num_samples, num_warmup, thin):
    n = state0.chain.rho.shape[-1]
    augmented = state0.chain.rankings.shape[-2] > 0

    def step(_, state):
        return sample(state)

    @jax.jit
    def go(state):
        def thin_step(carry, _):
            s, counts = carry
            s = jax.lax.fori_loop(0, thin - 1, step, s)
            s = sample(s)
            if augmented:  # per-user rank counts, summed over chains
                counts = counts + jax.nn.one_hot(s.chain.rankings - 1, n,
                                                 dtype=jnp.float32).sum(0)
            return (s, counts), (s.chain.rho, s.chain.alpha, s.info)

        state = jax.lax.fori_loop(0, num_warmup, step, state)
        N = state.chain.rankings.shape[-2]
        (state, counts), trace = jax.lax.scan(
            thin_step, (state, jnp.zeros((N, n, n), jnp.float32)), None, length=num_samples
        )
        return state, counts, trace

    state, counts, (rho, alpha, info) = go(state0)
    C = state0.chain.rho.shape[0]
    return MCMCResult(
        jnp.swapaxes(rho, 0, 1),
        jnp.swapaxes(alpha, 0, 1),
        info.rho_acceptance_rate.mean(),
        info.alpha_accepted.mean(),
        counts / (num_samples * C),
        state.chain,
    )


def rank_diagnostics(rho_samples):
    """Split R-hat and ESS (NumPyro diagnostics) of each item's rank.

    Args:
      rho_samples: consensus draws, ``[C, S, n]`` (chains, samples per chain, items).

    Returns:
      ``(r_hat, ess)``, float ``[n]`` each; an item whose rank never moves gets R-hat 1 and ESS
      ``C * S``.

    Raises:
      ValueError: when ``rho_samples`` is not 3-D.
    """
    x = np.asarray(rho_samples, np.float64)
    if x.ndim != 3:
        raise ValueError(f"rho_samples: expected [chains, samples, n], got {x.shape}")
    const = np.all(x == x[:1, :1], axis=(0, 1))  # an item never moving has no defined R-hat
    r_hat = np.where(const, 1.0, split_gelman_rubin(x))
    ess = np.where(const, x.shape[0] * x.shape[1], effective_sample_size(x))
    return r_hat, ess
