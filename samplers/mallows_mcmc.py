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

**Layout** (after BlackJAX's ``init``/``build_kernel`` and its ``State``/``Info`` pair):
:func:`init` builds a :class:`MallowsState` (what a chain carries), :func:`build_kernel` returns
the pure ``kernel(state) -> (state, info)`` with a :class:`MallowsInfo` of per-step
diagnostics, :class:`MallowsMH` adapts the pair to ``numpyro.infer.MCMC`` and
:func:`run_mallows_mcmc` scans the vmapped kernel directly.
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

    ``method="exact"`` uses :func:`footrule_distance_log_counts` (any n). ``"importance"``
    estimates it on ``alpha_grid`` (default ``linspace(0, 50, 101)``) with ``num_samples``
    pseudo-Mallows proposals per point and interpolates linearly; it needs ``key``.
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


def leap_and_shift(key, rho, leap_size: int):
    """One leap-and-shift proposal (M.2): ``(rho_new, log q(rho|rho') - log q(rho'|rho))``."""
    n = rho.shape[0]
    k1, k2 = jax.random.split(key)
    u = jax.random.randint(k1, (), 0, n)
    a = rho[u]
    lo = jnp.maximum(1, a - leap_size)
    s = _window(a, n, leap_size)
    j = jax.random.randint(k2, (), 0, s)
    r = lo + j
    r = jnp.where(r >= a, r + 1, r)  # skip the current rank
    down = (rho > a) & (rho <= r)  # leap down the list: those items move up by one
    up = (rho >= r) & (rho < a)
    new = (rho - down + up).at[u].set(r)
    log_ratio = jnp.where(
        jnp.abs(r - a) == 1, 0.0, jnp.log(s * 1.0) - jnp.log(_window(r, n, leap_size) * 1.0)
    )
    return new.astype(rho.dtype), log_ratio


# --------------------------------------------------------------------------- kernel


class MallowsState(NamedTuple):
    """What one chain carries from step to step.

    ``rho``: consensus ranks ``int32 [n]``; ``alpha``: scale (fixed unless updated); ``D``: the
    data matrix of the current data; ``rankings``: the augmented data ``[N, n]`` (``[0, n]`` for
    complete data, whose ``D`` stays fixed); ``iteration``: steps taken (the alpha move runs
    every ``alpha_jump`` of them); ``rng_key``: the key of the next step.
    """

    rho: jax.Array
    alpha: jax.Array
    D: jax.Array
    rankings: jax.Array
    iteration: jax.Array
    rng_key: jax.Array

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


def init(rng_key, D, rankings, alpha, rho=None) -> MallowsState:
    """Initial :class:`MallowsState`: ``rho`` as given or a uniformly random permutation."""
    n = D.shape[0]
    k_rho, key = jax.random.split(rng_key)
    rho = jax.random.permutation(k_rho, n).astype(jnp.int32) + 1 if rho is None else rho
    return MallowsState(
        jnp.asarray(rho, jnp.int32), jnp.asarray(alpha, D.dtype), D, rankings, jnp.int32(0), key
    )


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
    """Pure ``kernel(state) -> (state, info)`` of one chain (:class:`MallowsState`,
    :class:`MallowsInfo`): ``rho_steps`` leap-and-shift moves on ``rho`` (M.2), an alpha move
    every ``alpha_jump`` iterations (if ``update_alpha``) and, for partial data, ``num_swaps``
    augmentation swaps per user (``mallows_augment.augment_mh``). The key is carried in the
    state, as in NumPyro's functional ``hmc`` API; ``vmap`` it over chains."""
    augment = blocks is not None or prefer is not None

    def kernel(state: MallowsState) -> tuple[MallowsState, MallowsInfo]:
        key, k_rho, k_alpha, k_aug = jax.random.split(state.rng_key, 4)
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
        new_state = MallowsState(rho, alpha, D, R, state.iteration + 1, key)
        return new_state, MallowsInfo(rho_rate, alpha_accepted)

    return kernel


class _MallowsData(NamedTuple):
    """Validated inputs of :class:`MallowsMH`."""

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


class MallowsMHState(NamedTuple):
    """The state :class:`MallowsMH` hands to ``numpyro.infer.MCMC``: the chain and the info of
    its last step. Its ``position`` is the ``sample_field``; collect diagnostics with e.g.
    ``extra_fields=("info.rho_acceptance_rate",)``."""

    chain: MallowsState
    info: MallowsInfo

    @property
    def position(self) -> dict:
        return self.chain.position


class MallowsMH(MCMCKernel):
    """Metropolis-Hastings for the Bayesian Mallows model (footrule), for ``numpyro.infer.MCMC``.

    :param rankings: complete rankings ``[N, n]`` (or the initial augmented data with
        ``blocks``/``prefer``), or pass ``D`` and ``num_assessors`` instead.
    :param alpha: fixed scale, or the initial one when ``update_alpha``.
    :param leap_size: ``L`` of leap-and-shift.
    :param update_alpha: log-normal random walk (sd ``sigma_alpha``) on alpha with an
        Exponential(``alpha_rate``) prior, every ``alpha_jump`` iterations.
    :param log_partition: ``"exact"``, ``"importance"`` or a :class:`FootruleLogPartition`.
    :param blocks, prefer: partial / click / pairwise data, augmented with ``num_swaps``
        Metropolis swaps per user and iteration (default ``n``).
    :param rho_steps: leap-and-shift proposals per iteration.
    :param key_importance: PRNG key of ``log_partition="importance"``.

    A thin adapter over the pure :func:`init` and :func:`build_kernel`: samples are
    ``{"rho": int32[n], "alpha": float}``, the state is a :class:`MallowsMHState`. With
    ``chain_method="vectorized"`` the states carry a leading chain axis and the kernel is
    vmapped over it.
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
        self.data = _prepare(rankings, D, num_assessors, blocks, prefer, alpha)
        n = self.data.D.shape[0]
        if not (isinstance(leap_size, int) and 1 <= leap_size < max(n, 2)):
            raise ValueError(f"leap_size: expected an int in 1..{max(n - 1, 1)}, got {leap_size}")
        if sigma_alpha <= 0 or alpha_rate < 0:
            raise ValueError("sigma_alpha must be > 0 and alpha_rate >= 0")
        lp = None
        if update_alpha:
            lp = log_partition
            if isinstance(log_partition, str):
                lp = footrule_log_partition(n, method=log_partition, key=key_importance)
        self.alpha = alpha
        self.kernel = build_kernel(
            num_assessors=self.data.num_assessors,
            leap_size=leap_size,
            update_alpha=update_alpha,
            sigma_alpha=sigma_alpha,
            alpha_rate=alpha_rate,
            alpha_jump=alpha_jump,
            log_partition=lp,
            blocks=self.data.blocks,
            prefer=self.data.prefer,
            num_swaps=n if num_swaps is None else num_swaps,
            rho_steps=rho_steps,
        )

    def init_chain(self, rng_key, rho=None) -> MallowsState:
        """:func:`init` on this kernel's data (one chain; ``vmap`` it over keys)."""
        return init(rng_key, self.data.D, self.data.rankings, self.alpha, rho)

    def init(self, rng_key, num_warmup, init_params, model_args, model_kwargs):
        rho0 = None
        if init_params is not None:
            rho0 = init_params["rho"] if isinstance(init_params, dict) else init_params
            rho0 = jnp.asarray(rho0, jnp.int32)
        if is_prng_key(rng_key):
            if rho0 is not None:
                validate_permutation(rho0, self.data.D.shape[0], zero_based=False,
                                     name="init_params")
            chain = self.init_chain(rng_key, rho0)
        elif rho0 is None:
            chain = jax.vmap(self.init_chain)(rng_key)
        else:
            chain = jax.vmap(self.init_chain)(rng_key, rho0)
        no_info = MallowsInfo(jnp.zeros_like(chain.iteration, jnp.float32),
                              jnp.zeros_like(chain.iteration, jnp.float32))
        return MallowsMHState(chain, no_info)

    def sample(self, state, model_args, model_kwargs):
        batched = state.chain.rho.ndim == 2  # chain_method="vectorized"
        kernel = jax.vmap(self.kernel) if batched else self.kernel
        return MallowsMHState(*kernel(state.chain))

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
    """Run ``num_chains`` chains of :func:`build_kernel` with ``vmap`` inside one ``lax.scan``
    (no NumPyro driver overhead). Keeps every ``thin``-th state after ``num_warmup``. Takes
    the arguments of :class:`MallowsMH`."""
    mh = MallowsMH(
        rankings, D=D, num_assessors=num_assessors, alpha=alpha,
        key_importance=key_importance, **kernel_kwargs,
    )
    states = jax.vmap(mh.init_chain)(jax.random.split(key, num_chains))
    return _run_scan(jax.vmap(mh.kernel), states, num_samples, num_warmup, thin)


def _run_scan(kernel, state0: MallowsState, num_samples, num_warmup, thin):
    n = state0.rho.shape[-1]
    augmented = state0.rankings.shape[-2] > 0

    def step(_, state):
        return kernel(state)[0]

    @jax.jit
    def go(state):
        def thin_step(carry, _):
            s, counts = carry
            s = jax.lax.fori_loop(0, thin - 1, step, s)
            s, info = kernel(s)
            if augmented:  # per-user rank counts, summed over chains
                counts = counts + jax.nn.one_hot(s.rankings - 1, n, dtype=jnp.float32).sum(0)
            return (s, counts), (s.rho, s.alpha, info)

        state = jax.lax.fori_loop(0, num_warmup, step, state)
        N = state.rankings.shape[-2]
        (state, counts), trace = jax.lax.scan(
            thin_step, (state, jnp.zeros((N, n, n), jnp.float32)), None, length=num_samples
        )
        return state, counts, trace

    state, counts, (rho, alpha, info) = go(state0)
    C = state0.rho.shape[0]
    return MCMCResult(
        jnp.swapaxes(rho, 0, 1),
        jnp.swapaxes(alpha, 0, 1),
        info.rho_acceptance_rate.mean(),
        info.alpha_accepted.mean(),
        counts / (num_samples * C),
        state,
    )


def rank_diagnostics(rho_samples):
    """Split R-hat and ESS (NumPyro diagnostics) of each item's rank, ``[C, S, n]`` input."""
    x = np.asarray(rho_samples, np.float64)
    if x.ndim != 3:
        raise ValueError(f"rho_samples: expected [chains, samples, n], got {x.shape}")
    const = np.all(x == x[:1, :1], axis=(0, 1))  # an item never moving has no defined R-hat
    r_hat = np.where(const, 1.0, split_gelman_rubin(x))
    ess = np.where(const, x.shape[0] * x.shape[1], effective_sample_size(x))
    return r_hat, ess
