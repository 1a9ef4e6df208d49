"""Rankings as integer arrays: validation, loaders, distances and the footrule data matrix.

Conventions used by every Mallows module of ``jaxlib_ext.samplers``:

* ``n`` items are indexed ``0..n-1`` (array positions); ranks are **1-based**, ``1..n``,
  ``1`` = best, as in BayesMallows and in arXiv 2205.13911.
* A complete ranking is an int array ``R[i]`` = rank of item ``i``; ``N`` assessors stack into
  ``R[j, i]``. The consensus ``rho`` has the same layout.
* A missing rank is encoded by the sentinel :data:`MISSING` (``-1``). Observed ranks of one
  assessor must be distinct and lie in ``1..n``.
* Partial data are carried by *blocks*: ``item_block[j, i]`` names the block of item ``i`` for
  assessor ``j`` and ``rank_block[j, r-1]`` the block that rank ``r`` belongs to; a latent full
  ranking is consistent with the data iff every item takes a rank of its own block. Missing
  ranks (one free block plus singletons), top-k lists and clicks (clicked items own ranks
  ``1..n1``, the others ``n1+1..n``) are all of this form.
* Pairwise preferences are carried by a boolean ``prefer[j, a, b]`` (assessor ``j`` ranks ``a``
  above ``b``), transitively closed by :func:`pairwise_closure`.

The footrule data matrix of the Pseudo-Mallows posterior (arXiv 2205.13911) is
``D[i, r-1] = sum_j |R[j, i] - r|``, so that ``sum_j d_F(R_j, rho) = sum_i D[i, rho_i - 1]``.
"""

from __future__ import annotations

import csv
import itertools
from importlib import resources
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

MISSING = -1
"""Sentinel for an unobserved rank in a rankings array."""

__all__ = [
    "MISSING",
    "Blocks",
    "all_permutations",
    "blocks_from_clicks",
    "blocks_from_partial",
    "footrule_data_matrix",
    "footrule_distance",
    "initial_rankings_from_blocks",
    "initial_rankings_from_pairwise",
    "kendall_distance",
    "load_beach",
    "load_potato",
    "load_potato_true_ranking",
    "load_sushi",
    "pairwise_closure",
    "rank_marginals",
    "satisfies_pairwise",
    "validate_permutation",
    "validate_rankings",
]


# --------------------------------------------------------------------------- validation


def _as_int_array(x, name: str) -> np.ndarray:
    if isinstance(x, jax.core.Tracer):
        raise TypeError(f"{name}: expected a concrete array (validation runs before tracing)")
    a = np.asarray(x)
    if a.dtype == bool or not (
        np.issubdtype(a.dtype, np.integer) or np.issubdtype(a.dtype, np.floating)
    ):
        raise TypeError(f"{name}: expected an integer array of ranks, got dtype {a.dtype}")
    if np.issubdtype(a.dtype, np.floating):
        if not np.all(np.isfinite(a)):
            raise ValueError(
                f"{name}: found NaN/Inf; encode a missing rank as MISSING={MISSING}, not NaN"
            )
        if not np.all(a == np.round(a)):
            raise ValueError(f"{name}: expected integer ranks, got non-integral values")
    return a.astype(np.int32)


def validate_rankings(rankings, *, allow_missing: bool = False, name: str = "rankings"):
    """Check an array of 1-based ranks and return it as ``int32`` numpy.

    Args:
      rankings: ranks, shape ``[N, n]`` (``N`` assessors, ``n`` items) or ``[n]``; integer or
        integral float values in ``1..n``, or :data:`MISSING`. Must be concrete (not traced).
      allow_missing: whether the :data:`MISSING` sentinel is accepted.
      name: the argument name used in error messages.

    Returns:
      The ranks as an ``int32`` numpy array of the input shape.

    Raises:
      TypeError: for a traced, boolean or non-numeric input.
      ValueError: for a shape other than ``[N, n]`` or ``[n]``, NaN/Inf or non-integral values,
        ranks outside ``1..n``, repeated ranks within a row (ties) and, unless ``allow_missing``,
        the :data:`MISSING` sentinel.
    """
    a = _as_int_array(rankings, name)
    if a.ndim not in (1, 2):
        raise ValueError(f"{name}: expected shape [N, n] or [n], got {a.shape}")
    a2 = a.reshape(-1, a.shape[-1])
    n = a2.shape[1]
    if n < 1 or a2.shape[0] < 1:
        raise ValueError(f"{name}: expected at least one assessor and one item, got {a.shape}")
    miss = a2 == MISSING
    if miss.any() and not allow_missing:
        raise ValueError(
            f"{name}: found the MISSING sentinel ({MISSING}) but complete rankings are required"
        )
    bad = ~miss & ((a2 < 1) | (a2 > n))
    if bad.any():
        j, i = np.argwhere(bad)[0]
        raise ValueError(
            f"{name}: ranks must lie in 1..{n} (or be MISSING={MISSING}); row {j}, item {i} "
            f"has {a2[j, i]}"
        )
    for j in range(a2.shape[0]):
        obs = a2[j][~miss[j]]
        if len(np.unique(obs)) != len(obs):
            vals, counts = np.unique(obs, return_counts=True)
            raise ValueError(
                f"{name}: row {j} is not a ranking: repeated rank(s) {vals[counts > 1].tolist()}"
            )
    return a


def validate_permutation(x, n: int | None = None, *, zero_based: bool, name: str):
    """Check that ``x`` is a permutation of ``0..n-1`` (``zero_based``) or ``1..n``.

    Args:
      x: a concrete 1-D integer (or integral float) array.
      n: the expected length; ``None`` takes the length of ``x``.
      zero_based: whether the values must be ``0..n-1`` (``True``) or ``1..n`` (``False``).
      name: the argument name used in error messages.

    Returns:
      ``x`` as an ``int32`` numpy array of shape ``[n]``.

    Raises:
      TypeError: for a traced, boolean or non-numeric input.
      ValueError: when ``x`` is not 1-D, has a length other than ``n`` or is not a permutation.
    """
    a = _as_int_array(x, name)
    if a.ndim != 1:
        raise ValueError(f"{name}: expected a 1-D permutation, got shape {a.shape}")
    n = a.shape[0] if n is None else n
    if a.shape[0] != n:
        raise ValueError(f"{name}: expected length {n}, got {a.shape[0]}")
    lo = 0 if zero_based else 1
    if not np.array_equal(np.sort(a), np.arange(lo, lo + n)):
        raise ValueError(
            f"{name}: expected a permutation of {lo}..{lo + n - 1}, got {a.tolist()}"
        )
    return a


# --------------------------------------------------------------------------- distances


def footrule_distance(r1, r2):
    """Spearman footrule ``sum_i |r1_i - r2_i|`` over the last axis.

    Args:
      r1: rank vectors, shape ``[..., n]``.
      r2: rank vectors broadcastable against ``r1``.

    Returns:
      The footrule distances, of the broadcast shape without its last axis.
    """
    return jnp.sum(jnp.abs(jnp.asarray(r1) - jnp.asarray(r2)), axis=-1)


def kendall_distance(r1, r2):
    """Kendall tau distance: number of item pairs ordered differently (last axis).

    Args:
      r1: rank vectors, shape ``[..., n]``.
      r2: rank vectors broadcastable against ``r1``.

    Returns:
      The integer number of discordant pairs, of the broadcast shape without its last axis.
    """
    r1, r2 = jnp.asarray(r1), jnp.asarray(r2)
    d1 = r1[..., :, None] - r1[..., None, :]
    d2 = r2[..., :, None] - r2[..., None, :]
    return jnp.sum((d1 * d2) < 0, axis=(-2, -1)) // 2


def footrule_data_matrix(rankings):
    """Footrule data matrix ``D[i, r-1] = sum_j |R[j, i] - r|`` (arXiv 2205.13911).

    Pure ``jnp``, jit-able; the posterior exponent is ``-(alpha/n) sum_i D[i, rho_i - 1]``.

    Args:
      rankings: complete 1-based rankings ``R``, integer ``[N, n]``.

    Returns:
      ``D``, float ``[n, n]`` (float64 under ``jax_enable_x64``).

    References:
      arXiv 2205.13911 (Pseudo-Mallows).
    """
    R = jnp.asarray(rankings)
    n = R.shape[-1]
    r = jnp.arange(1, n + 1, dtype=R.dtype)
    ft = jnp.result_type(float)  # float64 under jax_enable_x64
    return jnp.sum(jnp.abs(R[:, :, None] - r[None, None, :]), axis=0).astype(ft)


def all_permutations(n: int) -> np.ndarray:
    """All ``n!`` rank vectors (1-based) in lexicographic order.

    Args:
      n: the number of items, ``1 <= n <= 9``.

    Returns:
      ``int32 [n!, n]`` numpy array, one rank vector per row.

    Raises:
      ValueError: when ``n`` lies outside ``1..9``.
    """
    if not 1 <= n <= 9:
        raise ValueError(f"n: enumeration supports 1..9 items, got {n}")
    return np.array(list(itertools.permutations(range(1, n + 1))), dtype=np.int32)


def rank_marginals(samples, n: int | None = None):
    """Empirical rank marginals ``P(rho_i = r)`` from samples of 1-based ranks.

    Args:
      samples: rank vectors, integer ``[..., n]`` with values in ``1..n``.
      n: the number of items; ``None`` takes the last axis of ``samples``.

    Returns:
      ``float32 [n, n]``: entry ``[i, r-1]`` is the fraction of samples with ``rho_i = r``.
    """
    s = jnp.asarray(samples)
    n = s.shape[-1] if n is None else n
    s = s.reshape(-1, n)
    onehot = jax.nn.one_hot(s - 1, n, dtype=jnp.float32)
    return onehot.mean(axis=0)


# --------------------------------------------------------------------------- partial data


class Blocks(NamedTuple):
    """Partial data as blocks (see module docstring): ``int32 [N, n]`` each."""

    item_block: np.ndarray
    rank_block: np.ndarray


def blocks_from_partial(rankings) -> Blocks:
    """Blocks for rankings with :data:`MISSING` entries.

    Each observed item is a singleton block holding its rank; all missing items of a row share
    block ``0`` with the unused ranks.

    Args:
      rankings: 1-based ranks with :data:`MISSING` entries, ``[N, n]`` or ``[n]``.

    Returns:
      :class:`Blocks` with ``item_block`` and ``rank_block``, ``int32 [N, n]`` each.

    Raises:
      TypeError: for a traced, boolean or non-numeric input (see :func:`validate_rankings`).
      ValueError: for invalid ranks (see :func:`validate_rankings`).
    """
    R = validate_rankings(rankings, allow_missing=True)
    R = R.reshape(-1, R.shape[-1])
    N, n = R.shape
    item_block = np.zeros((N, n), np.int32)
    rank_block = np.zeros((N, n), np.int32)
    for j in range(N):
        for i in range(n):
            if R[j, i] != MISSING:
                item_block[j, i] = i + 1
                rank_block[j, R[j, i] - 1] = i + 1
    return Blocks(item_block, rank_block)


def blocks_from_clicks(clicked) -> Blocks:
    """Blocks for clicking data (arXiv 2205.13911).

    Clicked items take ranks ``1..n1`` (block 1), the others ``n1+1..n`` (block 0).

    Args:
      clicked: boolean ``[N, n]``; ``clicked[j, i]`` says whether assessor ``j`` clicked item
        ``i``. Each row must leave at least one item unclicked.

    Returns:
      :class:`Blocks` with ``item_block`` and ``rank_block``, ``int32 [N, n]`` each.

    Raises:
      TypeError: when ``clicked`` is not a boolean 2-D array.
      ValueError: when a row clicks every item.

    References:
      arXiv 2205.13911 (Pseudo-Mallows).
    """
    c = np.asarray(clicked)
    if c.ndim != 2 or c.dtype != bool:
        raise TypeError(f"clicked: expected a boolean [N, n] array, got {c.dtype} {c.shape}")
    n1 = c.sum(axis=1)
    if (n1 == c.shape[1]).any():
        raise ValueError("clicked: a user clicked every item; nothing is left to recommend")
    ranks = np.arange(c.shape[1])[None, :]
    return Blocks(c.astype(np.int32), (ranks < n1[:, None]).astype(np.int32))


def initial_rankings_from_blocks(key, blocks: Blocks):
    """A random complete ranking per assessor consistent with the blocks (jit-able).

    Args:
      key: a PRNG key.
      blocks: :class:`Blocks` with ``item_block`` and ``rank_block``, integer ``[N, n]`` each.

    Returns:
      ``int32 [N, n]`` complete 1-based rankings; each item takes a rank of its own block.
    """
    item_block = jnp.asarray(blocks.item_block)
    rank_block = jnp.asarray(blocks.rank_block)
    N, n = item_block.shape
    keys = jax.random.split(key, N)

    def one(k, ib, rb):
        # Sort items by (block, random key) and ranks by (block, rank): the k-th item of a
        # block then receives the k-th rank of the same block.
        u = jax.random.uniform(k, (n,))
        item_sorted = jnp.lexsort((u, ib))
        rank_sorted = jnp.lexsort((jnp.arange(n), rb))
        return jnp.zeros(n, jnp.int32).at[item_sorted].set(rank_sorted.astype(jnp.int32) + 1)

    return jax.vmap(one)(keys, item_block, rank_block)


def pairwise_closure(prefs, num_items: int, num_assessors: int | None = None) -> np.ndarray:
    """Transitive closure of pairwise preferences.

    Args:
      prefs: ``int [M, 3]`` with rows ``(assessor, top_item, bottom_item)``, all 0-based.
      num_items: the number of items ``n``; items must lie in ``0..n-1``.
      num_assessors: the number of assessors ``N``; ``None`` takes the largest assessor index
        plus one.

    Returns:
      ``prefer[j, a, b]`` (bool ``[N, n, n]`` numpy): assessor ``j`` ranks ``a`` above ``b``.

    Raises:
      TypeError: for a traced, boolean or non-numeric ``prefs``.
      ValueError: for a shape other than ``[M, 3]``, out-of-range items or assessors, an item
        preferred over itself, or a cycle (an assessor preferring ``a`` over ``b`` and,
        transitively, ``b`` over ``a``).
    """
    p = _as_int_array(prefs, "prefs")
    if p.ndim != 2 or p.shape[1] != 3:
        raise ValueError(f"prefs: expected shape [M, 3] (assessor, top, bottom), got {p.shape}")
    N = int(p[:, 0].max()) + 1 if num_assessors is None else num_assessors
    if (p[:, 1:] < 0).any() or (p[:, 1:] >= num_items).any() or (p[:, 0] < 0).any():
        raise ValueError(f"prefs: items must lie in 0..{num_items - 1}, assessors >= 0")
    if (p[:, 1] == p[:, 2]).any():
        raise ValueError("prefs: an item cannot be preferred over itself")
    M = np.zeros((N, num_items, num_items), bool)
    M[p[:, 0], p[:, 1], p[:, 2]] = True
    for k in range(num_items):  # Floyd-Warshall on booleans, all assessors at once
        M |= M[:, :, k : k + 1] & M[:, k : k + 1, :]
    cyc = np.argwhere(M[:, np.arange(num_items), np.arange(num_items)])
    if len(cyc):
        raise ValueError(f"prefs: assessor {cyc[0][0]} has cyclic preferences")
    return M


def initial_rankings_from_pairwise(prefer) -> np.ndarray:
    """A complete ranking per assessor consistent with ``prefer``.

    The ranking is a topological order: items sorted by how many items they must beat,
    descending; valid for a transitively closed relation.

    Args:
      prefer: bool ``[N, n, n]``, transitively closed (see :func:`pairwise_closure`).

    Returns:
      ``int32 [N, n]`` complete 1-based rankings (numpy).
    """
    P = np.asarray(prefer)
    wins = P.sum(axis=2)  # a preferred over b => wins[a] > wins[b] when closed
    order = np.argsort(-wins, axis=1, kind="stable")
    R = np.empty_like(order)
    np.put_along_axis(R, order, np.arange(1, P.shape[1] + 1)[None, :], axis=1)
    return R.astype(np.int32)


def satisfies_pairwise(rankings, prefer):
    """Whether each full ranking respects every preference of its assessor.

    Args:
      rankings: complete 1-based rankings, integer ``[N, n]``.
      prefer: bool ``[N, n, n]``; ``prefer[j, a, b]`` says assessor ``j`` ranks ``a`` above ``b``.

    Returns:
      Bool ``[N]``.
    """
    R = jnp.asarray(rankings)
    above = R[:, :, None] < R[:, None, :]
    return jnp.all(above | ~jnp.asarray(prefer), axis=(1, 2))


# --------------------------------------------------------------------------- loaders

_DATA_SOURCE = "BayesMallows (ocbe-uio/BayesMallows, GPL-3); see samplers/data/README.md"


def _read_csv(name: str) -> tuple[list[str], list[list[str]]]:
    text = resources.files("jaxlib_ext.samplers").joinpath("data", name).read_text()
    rows = list(csv.reader(text.splitlines()))
    return rows[0], rows[1:]


def load_potato(kind: str = "visual") -> np.ndarray:
    """Potato data: ranks of 20 potatoes by 12 assessors (1 = heaviest).

    Args:
      kind: ``"visual"`` (ranked by looking) or ``"weighing"`` (ranked by weighing in the hand).

    Returns:
      ``int32 [12, 20]`` ranks.

    Raises:
      ValueError: for a ``kind`` other than ``"visual"`` or ``"weighing"``.

    Source: {src}.
    """
    if kind not in ("visual", "weighing"):
        raise ValueError(f"kind: expected 'visual' or 'weighing', got {kind!r}")
    _, rows = _read_csv(f"potato_{kind}.csv")
    return validate_rankings(np.array([[float(v) for v in r[1:]] for r in rows]))


def load_potato_true_ranking() -> np.ndarray:
    """True rank of each of the 20 potatoes by weight, ``int32 [20]``."""
    _, rows = _read_csv("potato_true_ranking.csv")
    return validate_permutation(np.array([float(v) for v in rows[0][1:]]), zero_based=False,
                                name="potato_true_ranking")


def load_sushi() -> tuple[np.ndarray, list[str]]:
    """Kamishima's sushi set A: ``int32 [5000, 10]`` ranks (1 = best) and the item names."""
    header, rows = _read_csv("sushi_rankings.csv")
    return validate_rankings(np.array([[float(v) for v in r] for r in rows])), header


def load_beach() -> tuple[np.ndarray, int, int]:
    """Beach pairwise preferences: ``(prefs int32 [1442, 3], num_assessors=60, num_items=15)``,
    rows ``(assessor, top_item, bottom_item)`` converted to 0-based indices."""
    header, rows = _read_csv("beach_preferences.csv")
    col = {h: k for k, h in enumerate(header)}
    p = np.array(
        [[int(r[col["assessor"]]), int(r[col["top_item"]]), int(r[col["bottom_item"]])]
         for r in rows],
        dtype=np.int32,
    ) - 1
    return p, int(p[:, 0].max()) + 1, int(p[:, 1:].max()) + 1


for _f in (load_potato,):
    _f.__doc__ = _f.__doc__.format(src=_DATA_SOURCE)
