"""Seeded generators of the four standard learned-MILP families.

The families and their default parameters are those of the learn2branch / Ecole generators
(Gasse, Chetelat, Ferroni, Charlin, Lodi, arXiv 1906.01629, sec. 5.1 and its appendix), written
from their published descriptions; no code was copied. Each returns a :class:`MILP` and is
reproducible from ``seed`` (NumPy ``default_rng``).

* :func:`set_cover` (Balas and Ho 1980): minimise ``c^T x`` subject to every row covered,
  ``sum_{j in row i} x_j >= 1``, ``x`` binary; ``density`` of ones, each column in at least one row
  and each row with at least two columns, costs uniform on ``1..max_coef``.
* :func:`combinatorial_auction` (Leyton-Brown, Pearson, Shoham 2000, "arbitrary" relationships,
  simplified): items have common values and pairwise compatibilities; a bid grows a bundle item by
  item (with probability ``add_item_prob``, the next item drawn by compatibility), its price is the
  bundle's private value plus a ``len^(1+additivity)`` complementarity term; each bidder also gets
  up to ``max_n_sub_bids`` substitutable bids on neighbouring bundles, tied by a dummy item (the
  XOR constraint). Maximise revenue subject to each item sold at most once.
  Simplification: the budget/resale filter of the original is replaced by keeping sub-bids
  whose price is within ``budget_factor`` of the parent bid's.
* :func:`capacitated_facility_location` (Cornuejols, Sridharan, Thizy 1991): points uniform on the
  unit square, demands uniform on ``5..35``, capacities on ``10..160`` rescaled so that total
  capacity is ``ratio`` times total demand, fixed costs ``U(100,110) sqrt(s_j) + U(0,90)``,
  transport cost ``10 d_i ||p_i - q_j||``; binary open ``x_j``, continuous assignment
  ``y_ij in [0,1]`` with ``sum_j y_ij >= 1``, ``sum_i d_i y_ij <= s_j x_j``,
  ``sum_j s_j x_j >= sum_i d_i`` and the tightening ``y_ij <= x_j``.
* :func:`independent_set` on a Barabasi-Albert graph (``affinity`` edges per new node): maximise
  ``sum x`` with one ``sum_{i in K} x_i <= 1`` row per clique ``K`` of a greedy clique partition of
  the edges (the clique formulation of the original).
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from jaxlib_ext.samplers.milp.problem import MILP, make_milp

__all__ = ["FAMILIES", "capacitated_facility_location", "combinatorial_auction",
           "independent_set", "set_cover"]


def _check_pos(**kw):
    for k, v in kw.items():
        if not (isinstance(v, (int, np.integer)) and v > 0):
            raise ValueError(f"{k}: expected a positive integer, got {v!r}")


def set_cover(seed: int = 0, n_rows: int = 500, n_cols: int = 1000, density: float = 0.05,
              max_coef: int = 100) -> MILP:
    """Set cover (Balas and Ho), Ecole defaults ``500 x 1000``, density 0.05, costs ``1..100``.

    Args:
      seed: the NumPy ``default_rng`` seed.
      n_rows: rows to cover, ``> 0``.
      n_cols: columns (binary), ``> 0``.
      density: the fraction of ones in ``A``, in ``(0, 1]``.
      max_coef: costs are uniform on ``1..max_coef``.

    Returns:
      The :class:`~jaxlib_ext.samplers.milp.problem.MILP` (minimise ``c^T x``, every row
      covered).

    Raises:
      ValueError: a size or ``density`` out of range.

    References:
      Gasse et al., arXiv 1906.01629, sec. 5.1 and appendix.
    """
    _check_pos(n_rows=n_rows, n_cols=n_cols, max_coef=max_coef)
    if not 0 < density <= 1:
        raise ValueError(f"density: expected in (0, 1], got {density}")
    rng = np.random.default_rng(seed)
    nnz = max(int(n_rows * n_cols * density), n_cols, 2 * n_rows)
    rows = [rng.integers(n_rows, size=n_cols)]  # every column in some row
    cols = [np.arange(n_cols)]
    rows.append(np.repeat(np.arange(n_rows), 2))  # every row with >= 2 columns
    cols.append(np.concatenate([rng.choice(n_cols, 2, replace=False) for _ in range(n_rows)]))
    extra = nnz - n_cols - 2 * n_rows
    if extra > 0:
        rows.append(rng.integers(n_rows, size=extra))
        cols.append(rng.integers(n_cols, size=extra))
    A = sp.csr_array((np.ones(sum(len(r) for r in rows)), (np.concatenate(rows),
                      np.concatenate(cols))), shape=(n_rows, n_cols))
    A.data[:] = 1.0
    A.sum_duplicates()
    A.data[:] = 1.0
    c = rng.integers(1, max_coef + 1, size=n_cols).astype(np.float64)
    return make_milp(c, A, np.ones(n_rows), None, 0.0, 1.0, np.ones(n_cols, bool),
                     name=f"setcover-{n_rows}x{n_cols}-s{seed}")


def combinatorial_auction(seed: int = 0, n_items: int = 100, n_bids: int = 500,
                          min_value: int = 1, max_value: int = 100,
                          value_deviation: float = 0.5, add_item_prob: float = 0.65,
                          max_n_sub_bids: int = 5, additivity: float = 0.2,
                          budget_factor: float = 1.5) -> MILP:
    """Combinatorial auction (arbitrary relationships, simplified), Ecole defaults 100 x 500.

    Args:
      seed: the NumPy ``default_rng`` seed.
      n_items: items, ``> 0``.
      n_bids: bids (binary columns), ``> 0``.
      min_value: the lowest common item value.
      max_value: the highest common item value.
      value_deviation: the spread of the private values around the common ones, as a fraction of
        ``max_value``.
      add_item_prob: the probability of growing a bundle by one more item.
      max_n_sub_bids: substitutable bids per bidder, tied by a dummy item (the XOR constraint).
      additivity: the exponent of the complementarity term ``len^(1+additivity)``.
      budget_factor: sub-bids are kept whose price is within this factor of the parent bid's.

    Returns:
      The :class:`~jaxlib_ext.samplers.milp.problem.MILP` (maximise revenue, each item sold at
      most once).

    Raises:
      ValueError: a size out of range.

    References:
      Leyton-Brown, Pearson, Shoham 2000; Gasse et al., arXiv 1906.01629, sec. 5.1.
    """
    _check_pos(n_items=n_items, n_bids=n_bids)
    rng = np.random.default_rng(seed)
    values = min_value + (max_value - min_value) * rng.random(n_items)
    compat = np.triu(rng.random((n_items, n_items)), 1)
    compat = compat + compat.T
    compat /= compat.sum(1, keepdims=True)
    bundles, prices, dummies = [], [], []
    n_dummy = 0
    while len(bundles) < n_bids:
        private = values + max_value * value_deviation * (2 * rng.random(n_items) - 1)
        first = rng.choice(n_items, p=values / values.sum())
        bundle = [first]
        while rng.random() < add_item_prob and len(bundle) < n_items:
            w = compat[bundle].mean(0).copy()
            w[bundle] = 0
            if w.sum() <= 0:
                break
            bundle.append(rng.choice(n_items, p=w / w.sum()))
        price = private[bundle].sum() + len(bundle) ** (1 + additivity)
        if price <= 0:
            continue
        group = [(sorted(bundle), price)]
        for _ in range(rng.integers(0, max_n_sub_bids + 1)):
            sub = set(bundle)
            drop = rng.choice(list(sub))
            sub.discard(drop)
            w = compat[list(sub) or [drop]].mean(0).copy()
            w[list(sub) + [drop]] = 0
            if w.sum() > 0:
                sub.add(rng.choice(n_items, p=w / w.sum()))
            sub = sorted(sub)
            p_sub = private[sub].sum() + len(sub) ** (1 + additivity)
            if 0 < p_sub <= budget_factor * price and all(sub != g[0] for g in group):
                group.append((sub, p_sub))
        group = group[: n_bids - len(bundles)]
        dummy = n_dummy if len(group) > 1 else -1
        n_dummy += len(group) > 1
        for b, p in group:
            bundles.append(b)
            prices.append(p)
            dummies.append(dummy)
    rows, cols = [], []
    for j, (b, d) in enumerate(zip(bundles, dummies)):
        rows += list(b)
        cols += [j] * len(b)
        if d >= 0:
            rows.append(n_items + d)
            cols.append(j)
    m = n_items + n_dummy
    A = sp.csr_array((np.ones(len(rows)), (rows, cols)), shape=(m, n_bids))
    return make_milp(np.asarray(prices), A, None, np.ones(m), 0.0, 1.0, np.ones(n_bids, bool),
                     sense=-1, name=f"cauction-{n_items}x{n_bids}-s{seed}")


def capacitated_facility_location(seed: int = 0, n_customers: int = 100,
                                  n_facilities: int = 100, ratio: float = 5.0) -> MILP:
    """Capacitated facility location (Cornuejols et al.), Ecole defaults 100 x 100, ratio 5.

    Columns: ``x_j`` (binary, ``n_facilities``) first, then ``y_ij`` (continuous, row-major over
    customers ``i`` and facilities ``j``).

    Args:
      seed: the NumPy ``default_rng`` seed.
      n_customers: customers, ``> 0``.
      n_facilities: facilities, ``> 0``.
      ratio: total capacity over total demand, ``> 0``.

    Returns:
      The mixed :class:`~jaxlib_ext.samplers.milp.problem.MILP`.

    Raises:
      ValueError: a size or ``ratio`` out of range.

    References:
      Cornuejols, Sridharan, Thizy 1991; Gasse et al., arXiv 1906.01629, sec. 5.1.
    """
    _check_pos(n_customers=n_customers, n_facilities=n_facilities)
    if ratio <= 0:
        raise ValueError(f"ratio: expected > 0, got {ratio}")
    rng = np.random.default_rng(seed)
    nc, nf = n_customers, n_facilities
    pc, pf = rng.random((nc, 2)), rng.random((nf, 2))
    demand = rng.integers(5, 36, size=nc).astype(np.float64)
    cap = rng.integers(10, 161, size=nf).astype(np.float64)
    fixed = np.floor(rng.uniform(100, 110, nf) * np.sqrt(cap) + rng.integers(0, 91, nf))
    cap = np.floor(cap * ratio * demand.sum() / cap.sum())
    trans = 10.0 * demand[:, None] * np.linalg.norm(pc[:, None] - pf[None], axis=-1)
    n = nf + nc * nf
    yidx = nf + np.arange(nc * nf).reshape(nc, nf)
    rows, cols, vals, lo, up = [], [], [], [], []
    r = 0
    for i in range(nc):  # demand: sum_j y_ij >= 1
        rows += [r] * nf
        cols += list(yidx[i])
        vals += [1.0] * nf
        lo.append(1.0)
        up.append(np.inf)
        r += 1
    for j in range(nf):  # capacity: sum_i d_i y_ij - s_j x_j <= 0
        rows += [r] * (nc + 1)
        cols += list(yidx[:, j]) + [j]
        vals += list(demand) + [-cap[j]]
        lo.append(-np.inf)
        up.append(0.0)
        r += 1
    rows += [r] * nf  # total capacity: sum_j s_j x_j >= sum_i d_i
    cols += list(range(nf))
    vals += list(cap)
    lo.append(demand.sum())
    up.append(np.inf)
    r += 1
    for i in range(nc):  # tightening: y_ij - x_j <= 0
        for j in range(nf):
            rows += [r, r]
            cols += [yidx[i, j], j]
            vals += [1.0, -1.0]
            lo.append(-np.inf)
            up.append(0.0)
            r += 1
    A = sp.csr_array((vals, (rows, cols)), shape=(r, n))
    c = np.concatenate([fixed, trans.ravel()])
    integ = np.zeros(n, bool)
    integ[:nf] = True
    return make_milp(c, A, np.asarray(lo), np.asarray(up), 0.0, 1.0, integ,
                     name=f"facility-{nc}x{nf}-s{seed}")


def _barabasi_albert(rng, n, m):
    edges = set()
    targets = list(range(m + 1))
    for i in range(m + 1):  # start from a clique on m + 1 nodes
        for j in range(i):
            edges.add((j, i))
    degree_list = [v for e in edges for v in e]
    for v in range(m + 1, n):
        chosen = set()
        while len(chosen) < m:
            chosen.add(degree_list[rng.integers(len(degree_list))])
        for u in chosen:
            edges.add((u, v))
            degree_list += [u, v]
    del targets
    return edges


def independent_set(seed: int = 0, n_nodes: int = 500, affinity: int = 4) -> MILP:
    """Maximum independent set on a Barabasi-Albert graph, clique formulation (Ecole: 500, 4).

    Args:
      seed: the NumPy ``default_rng`` seed.
      n_nodes: nodes (binary columns), ``> 0``.
      affinity: edges per new node, ``0 < affinity < n_nodes``.

    Returns:
      The :class:`~jaxlib_ext.samplers.milp.problem.MILP` (maximise ``sum x``, one row per clique
      of a greedy clique partition of the edges).

    Raises:
      ValueError: a size out of range.

    References:
      Gasse et al., arXiv 1906.01629, sec. 5.1.
    """
    _check_pos(n_nodes=n_nodes, affinity=affinity)
    if affinity >= n_nodes:
        raise ValueError(f"affinity: expected < n_nodes ({n_nodes}), got {affinity}")
    rng = np.random.default_rng(seed)
    edges = _barabasi_albert(rng, n_nodes, affinity)
    nbrs = [set() for _ in range(n_nodes)]
    for u, v in edges:
        nbrs[u].add(v)
        nbrs[v].add(u)
    uncovered = set(edges)
    cliques = []
    for u, v in sorted(edges, key=lambda e: -len(nbrs[e[0]]) - len(nbrs[e[1]])):
        if (u, v) not in uncovered:
            continue
        clique = [u, v]
        for w in sorted(nbrs[u] & nbrs[v], key=lambda w: -len(nbrs[w])):
            if all(w in nbrs[k] for k in clique):
                clique.append(w)
        for a in clique:
            for b in clique:
                uncovered.discard((a, b))
        cliques.append(clique)
    rows = [i for i, k in enumerate(cliques) for _ in k]
    cols = [v for k in cliques for v in k]
    A = sp.csr_array((np.ones(len(rows)), (rows, cols)), shape=(len(cliques), n_nodes))
    return make_milp(np.ones(n_nodes), A, None, np.ones(len(cliques)), 0.0, 1.0,
                     np.ones(n_nodes, bool), sense=-1, name=f"indset-{n_nodes}-s{seed}")


FAMILIES = {
    "setcover": set_cover,
    "cauction": combinatorial_auction,
    "facility": capacitated_facility_location,
    "indset": independent_set,
}
