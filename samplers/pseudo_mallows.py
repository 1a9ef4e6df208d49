"""Pseudo-Mallows: a sequential, exactly normalised approximation of the Mallows posterior.

Liu, Vitelli, Mannino, Frigessi, Scheel, "Pseudo-Mallows for Efficient Probabilistic Preference
Learning", arXiv 2205.13911. The labels (PM.k) below are this module's own.

Posterior of the consensus ``rho`` (1-based ranks of ``n`` items) under the footrule Mallows model
with ``alpha`` fixed and a uniform prior, data matrix ``D``
(see ``rankings.footrule_data_matrix``)::

    P(rho | R) = exp(-(alpha/n) sum_i D[i, rho_i - 1]) / Z_post                         (PM.1)

Pseudo-Mallows for an item order ``o`` (a permutation of ``0..n-1``)::

    q_o(rho) = prod_k exp(-(alpha/n) D[o_k, rho_{o_k} - 1]) / C_k                       (PM.2)
    C_k      = sum_{r in S_k} exp(-(alpha/n) D[o_k, r - 1]),  S_k = free ranks at step k

and, because the numerators of (PM.1) and (PM.2) coincide,

    KL(q_o || P) = log Z_post - E_{q_o}[sum_k log C_k]                                  (PM.3)

Everything here is pure ``jnp`` (jit/vmap-able, explicit keys) except the ``exact_*`` oracles,
which run in float64 numpy with an O(2^n n) dynamic programme over sets of used ranks (usable up
to n ~ 20) and :func:`exhaustive_order_search` (all n! orders, n <= 7).

Conventions:

* V order (:func:`v_order`): the item with the *middle* consensus rank is placed first and the
  two extremes last, as in the authors' R code
  (github.com/sylvia-liu-qinghua/Pseudo-Mallows).
* The consensus used by the V order is the item's mean rank; it is read off ``D[:, 0]``
  (``D[i, 0] = sum_j (R_ji - 1)``), so the heuristic needs only ``D``.
* Augmentation (:func:`fit_augmented`): block data (missing ranks, top-k, clicks) are
  re-sampled with the sequential pseudo sampler restricted to each block, with factors
  ``exp(-(alpha/n)|r - rho_i|)`` on the *absolute* ranks ``r`` (the exact conditional's
  factors). Items are visited in a fresh uniformly random order per user and iteration.
  Pairwise data cannot be sampled sequentially without dead ends, so they are augmented with
  Metropolis swaps (``mallows_augment.augment_mh``), as the MCMC does.
"""

from __future__ import annotations

import functools
import itertools
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from numpyro.distributions import Distribution, constraints
from numpyro.distributions.constraints import Constraint
from numpyro.distributions.util import validate_sample

from jaxlib_ext.samplers.rankings import (
    Blocks,
    footrule_data_matrix,
    validate_permutation,
)

__all__ = [
    "AugmentedFit",
    "PseudoMallows",
    "exact_expected_log_normalisers",
    "exact_kl",
    "exact_posterior_marginals",
    "exhaustive_order_search",
    "fit_augmented",
    "item_order",
    "kl_estimate",
    "kl_objective",
    "local_search_order",
    "log_posterior_normaliser",
    "permutation",
    "pseudo_mallows_log_prob",
    "pseudo_mallows_sample",
    "v_order",
]


# --------------------------------------------------------------------------- pure core


def _step_logits(alpha, D, order):
    n = D.shape[0]
    return -(alpha / n) * jnp.asarray(D)[jnp.asarray(order)]  # [step k, rank r-1]


def _is_permutation(x, start: int):
    """Whether the last axis of ``x`` is a permutation of ``start..start+len-1``."""
    xp = jnp if isinstance(x, jax.Array) else np
    x = xp.asarray(x)
    return xp.all(xp.sort(x, axis=-1) == xp.arange(start, start + x.shape[-1]), axis=-1)


def pseudo_mallows_log_prob(rho, alpha, D, order):
    """``log q_o(rho)`` of (PM.2) for one rank vector ``rho``.

    Vectorised over steps: rank ``r`` is still free at step ``k`` iff it is used at step
    ``>= k``, so every ``C_k`` is one masked log-sum-exp. O(n^2).

    Args:
      rho: one rank vector (1-based), integer ``[n]``.
      alpha: Mallows scale (footrule, ``alpha/n`` scaling), ``>= 0``.
      D: ``[n, n]`` data matrix ``D[i, r-1]`` (``rankings.footrule_data_matrix``).
      order: item order ``o``, a permutation of ``0..n-1``, ``[n]``.

    Returns:
      The scalar ``log q_o(rho)``; ``-inf`` when ``rho`` is not a permutation of ``1..n``
      (outside the support).
    """
    logits = _step_logits(alpha, D, order)
    n = logits.shape[0]
    rho = jnp.asarray(rho)
    r_seq = rho[jnp.asarray(order)] - 1  # rank taken at step k
    step_of_rank = jnp.zeros(n, jnp.int32).at[r_seq].set(jnp.arange(n, dtype=jnp.int32))
    free = step_of_rank[None, :] >= jnp.arange(n)[:, None]
    log_c = jax.nn.logsumexp(jnp.where(free, logits, -jnp.inf), axis=1)  # log C_k (PM.2)
    chosen = jnp.take_along_axis(logits, r_seq[:, None], axis=1)[:, 0]
    return jnp.where(_is_permutation(rho, 1), jnp.sum(chosen - log_c), -jnp.inf)


def _sequential_sample(gumbel, logits, allowed=None):
    """Sequential draw, step ``k`` picks a free (and allowed) rank with prob. ∝ exp(logits[k]).

    ``gumbel`` [n, n] are standard Gumbel variates (Gumbel-max trick). Returns the rank index
    (0-based) taken at each step and ``sum_k log C_k``.
    """
    n = logits.shape[0]
    allowed = jnp.ones((n, n), bool) if allowed is None else allowed

    def step(used, k):
        ok = ~used & allowed[k]
        masked = jnp.where(ok, logits[k], -jnp.inf)
        r = jnp.argmax(masked + gumbel[k])
        return used.at[r].set(True), (r, jax.nn.logsumexp(masked))

    _, (r_seq, log_c) = jax.lax.scan(step, jnp.zeros(n, bool), jnp.arange(n))
    return r_seq, jnp.sum(log_c)


def pseudo_mallows_sample(key, alpha, D, order):
    """One exact draw from ``q_o`` (PM.2). O(n^2).

    Args:
      key: a PRNG key.
      alpha: Mallows scale (footrule, ``alpha/n`` scaling), ``>= 0``.
      D: ``[n, n]`` data matrix ``D[i, r-1]`` (``rankings.footrule_data_matrix``).
      order: item order ``o``, a permutation of ``0..n-1``, ``[n]``.

    Returns:
      ``(rho, sum_log_c)``: the rank vector ``int32 [n]`` (1-based) and the scalar
      ``sum_k log C_k``.
    """
    logits = _step_logits(alpha, D, order)
    n = logits.shape[0]
    r_seq, sum_log_c = _sequential_sample(jax.random.gumbel(key, (n, n)), logits)
    rho = jnp.zeros(n, jnp.int32).at[jnp.asarray(order)].set(r_seq.astype(jnp.int32) + 1)
    return rho, sum_log_c


def v_order(scores, *, key=None, sigma: float = 0.0):
    """V-shaped order: middle consensus item first, extremes last (module docstring).

    The consensus rank ``c_i`` is the rank of ``scores``; items are sorted by
    ``|c_i - (n+1)/2|`` (+ ``sigma`` Gaussian jitter). Ties (the two items at the same
    distance) are broken at random with ``key``, or towards the better item when ``key`` is
    None. jit-able.

    Args:
      scores: ``[n]``, lower for better items (mean rank, ``D[:, 0]``, minus click counts).
      key: a PRNG key for the jitter and the random tie-break, or ``None`` for a deterministic
        order.
      sigma: standard deviation of the Gaussian jitter added to the distances; used only with
        ``key``.

    Returns:
      The item order, ``int32 [n]``, a permutation of ``0..n-1``.
    """
    s = jnp.asarray(scores, jnp.float32)
    n = s.shape[0]
    c = jnp.argsort(jnp.argsort(s)).astype(jnp.float32) + 1.0
    dist = jnp.abs(c - (n + 1) / 2.0)
    if key is not None:
        k1, k2 = jax.random.split(key)
        dist = dist + sigma * jax.random.normal(k1, (n,))
        tie = jax.random.uniform(k2, (n,))
    else:
        tie = c
    return jnp.lexsort((tie, dist)).astype(jnp.int32)


def kl_objective(key, alpha, D, order, num_samples: int):
    """Monte-Carlo ``E_{q_o}[sum_k log C_k]`` of (PM.3).

    Maximising it over ``o`` minimises ``KL(q_o || P)``; ``log Z_post`` is not needed.

    Args:
      key: a PRNG key.
      alpha: Mallows scale (footrule, ``alpha/n`` scaling), ``>= 0``.
      D: ``[n, n]`` data matrix ``D[i, r-1]`` (``rankings.footrule_data_matrix``).
      order: item order ``o``, a permutation of ``0..n-1``, ``[n]``.
      num_samples: the number of draws from ``q_o``.

    Returns:
      ``(mean, standard error)`` of ``sum_k log C_k`` over the draws, scalars.
    """
    keys = jax.random.split(key, num_samples)
    _, s = jax.vmap(lambda k: pseudo_mallows_sample(k, alpha, D, order))(keys)
    return s.mean(), s.std() / jnp.sqrt(num_samples)


def kl_estimate(key, alpha, D, order, num_samples: int = 1000, log_z_post=None):
    """Monte-Carlo ``KL(q_o || P) = log Z_post - E_q sum_k log C_k`` (PM.3).

    Args:
      key: a PRNG key.
      alpha: Mallows scale (footrule, ``alpha/n`` scaling), ``>= 0``.
      D: ``[n, n]`` data matrix ``D[i, r-1]`` (``rankings.footrule_data_matrix``).
      order: item order ``o``, a permutation of ``0..n-1``, ``[n]``.
      num_samples: the number of draws from ``q_o``.
      log_z_post: ``log Z_post`` of (PM.1); ``None`` computes the exact value with
        :func:`log_posterior_normaliser` (n <= 20).

    Returns:
      ``(kl, standard error)``, scalars.
    """
    if log_z_post is None:
        log_z_post = log_posterior_normaliser(alpha, D)
    m, se = kl_objective(key, alpha, D, order, num_samples)
    return log_z_post - m, se


# --------------------------------------------------------------------------- distribution


class _Permutation(Constraint):
    """The last axis is a permutation of ``start..start+n-1`` (``n`` = its length if None)."""

    is_discrete = True
    event_dim = 1

    def __init__(self, n: int | None, start: int):
        self.n = None if n is None else int(n)
        self.start = int(start)

    def __call__(self, x):
        ok = _is_permutation(x, self.start)
        if self.n is not None and np.shape(x)[-1] != self.n:
            return ok & False  # wrong number of items
        return ok

    def feasible_like(self, prototype):
        n = jnp.shape(prototype)[-1] if self.n is None else self.n
        return jnp.broadcast_to(jnp.arange(self.start, self.start + n), jnp.shape(prototype))

    def tree_flatten(self):
        return (), ((), {"n": self.n, "start": self.start})

    def __repr__(self):
        return f"Permutation(n={self.n}, start={self.start})"

    def eq(self, other, static=False):
        return (
            isinstance(other, _Permutation) and other.n == self.n and other.start == self.start
        )


def permutation(n: int) -> Constraint:
    """The support of :class:`PseudoMallows`: rank vectors, permutations of ``1..n``.

    Args:
      n: the number of items.

    Returns:
      A NumPyro constraint with ``event_dim`` 1.
    """
    return _Permutation(n, 1)


item_order = _Permutation(None, 0)
"""Constraint of an item order: a permutation of ``0..n-1`` (``n`` = its length)."""


class PseudoMallows(Distribution):
    """Pseudo-Mallows distribution over rank vectors (arXiv 2205.13911; (PM.2)).

    :param alpha: Mallows scale (footrule, ``alpha/n`` scaling), ``>= 0`` (``0`` is uniform).
    :param D: ``[n, n]`` data matrix ``D[i, r-1]`` (``rankings.footrule_data_matrix``).
    :param order: item order, a permutation of ``0..n-1`` (``v_order``, ``local_search_order``).
    :param validate_args: check ``alpha``, ``D`` and ``order`` against :attr:`arg_constraints`
        on construction (``ValueError`` naming the argument) and mask out-of-support values in
        :meth:`log_prob` with a warning, as NumPyro's distributions do.

    Values are ``int32 [..., n]`` rank vectors (1-based); ``batch_shape`` is ``()`` and
    ``event_shape`` is ``(n,)`` (use ``expand`` or ``vmap`` for batches). ``sample`` is exact
    (vmap over ``sample_shape``) and ``log_prob`` exact, ``-inf`` outside the support; both jit.
    Shapes are always checked; values only when ``validate_args``. The parameters are the pytree
    leaves and ``n`` is read off ``event_shape``, so the distribution survives
    ``jit``/``vmap``/``lax.map``.
    """

    arg_constraints = {
        "alpha": constraints.nonnegative,
        "D": constraints.independent(constraints.real, 2),
        "order": item_order,
    }
    pytree_data_fields = ("alpha", "D", "order")

    def __init__(self, alpha, D, order, *, validate_args=None):
        ft = jnp.result_type(float)  # float64 under jax_enable_x64, else float32
        if jnp.ndim(alpha) != 0:
            raise ValueError(f"alpha: expected a scalar, got shape {jnp.shape(alpha)}")
        shape = jnp.shape(D)
        if len(shape) != 2 or shape[0] != shape[1] or shape[0] < 1:
            raise ValueError(f"D: expected a square [n, n] data matrix, got shape {shape}")
        if jnp.shape(order) != shape[:1]:
            raise ValueError(f"order: expected shape {shape[:1]}, got {jnp.shape(order)}")
        # Constants stay concrete under jit, so validate_args checks them there too, as
        # NumPyro's own distributions do; traced parameters are not checked.
        with jax.ensure_compile_time_eval():
            self.alpha = jnp.asarray(alpha, ft)
            self.D = jnp.asarray(D, ft)
            self.order = jnp.asarray(order, jnp.int32)
        super().__init__(batch_shape=(), event_shape=shape[:1], validate_args=validate_args)

    @property
    def n(self) -> int:
        """Number of items."""
        return self.event_shape[0]

    @constraints.dependent_property(is_discrete=True, event_dim=1)
    def support(self):
        return permutation(self.n)

    @classmethod
    def from_rankings(cls, rankings, alpha, *, order="v", key=None, **search_kwargs):
        """Posterior approximation from complete rankings ``[N, n]``; ``order`` is ``"v"``,
        ``"local"`` (V order improved by :func:`local_search_order`) or an explicit order."""
        from jaxlib_ext.samplers.rankings import validate_rankings

        R = validate_rankings(rankings)
        D = footrule_data_matrix(R.reshape(-1, R.shape[-1]))
        if isinstance(order, str):
            if order not in ("v", "local"):
                raise ValueError(f"order: expected 'v', 'local' or an array, got {order!r}")
            o = v_order(D[:, 0])
            if order == "local":
                if key is None:
                    raise ValueError("key: a PRNG key is required for order='local'")
                o, _ = local_search_order(key, alpha, D, o, **search_kwargs)
            order = o
        return cls(alpha, D, order)

    def _draw(self, key, sample_shape):
        """``sample_shape`` draws and their ``sum_k log C_k`` (PM.2)."""
        shape = tuple(sample_shape)
        m = math.prod(shape)
        rho, sum_log_c = _sample_many(key, self.alpha, self.D, self.order, max(m, 1))
        return rho[:m].reshape(shape + (self.n,)), sum_log_c[:m].reshape(shape)

    def sample(self, key, sample_shape=()):
        return self._draw(key, sample_shape)[0]

    def sample_with_intermediates(self, key, sample_shape=()):
        rho, sum_log_c = self._draw(key, sample_shape)
        return rho, [sum_log_c]

    @validate_sample
    def log_prob(self, value):
        v = jnp.asarray(value)
        lp = jax.vmap(lambda r: pseudo_mallows_log_prob(r, self.alpha, self.D, self.order))(
            v.reshape(-1, self.n)
        )
        return lp.reshape(v.shape[:-1])


# Compiled once per shape, so that eager draws from the distribution do not retrace the scan.
@functools.partial(jax.jit, static_argnums=4)
def _sample_many(key, alpha, D, order, num: int):
    keys = jax.random.split(key, num)
    return jax.vmap(lambda k: pseudo_mallows_sample(k, alpha, D, order))(keys)


# --------------------------------------------------------------------------- order search


def _crn_objective(gumbels, alpha, D, order):
    """Sample-average ``E_q sum log C`` with common random numbers (fixed Gumbels)."""
    logits = _step_logits(alpha, D, order)
    return jax.vmap(lambda g: _sequential_sample(g, logits)[1])(gumbels).mean()


@jax.jit
def _neighbour_objectives(gumbels, alpha, D, order):
    n = order.shape[0]
    ii, jj = np.triu_indices(n, 1)

    def swapped(i, j):
        o = order.at[i].set(order[j]).at[j].set(order[i])
        return _crn_objective(gumbels, alpha, D, o)

    return jax.vmap(swapped)(jnp.asarray(ii), jnp.asarray(jj)), jnp.asarray(ii), jnp.asarray(jj)


def local_search_order(key, alpha, D, order, *, num_samples: int = 256, max_sweeps: int = 20):
    """Greedy local search over orders maximising the KL objective (PM.3).

    Each sweep evaluates all ``n(n-1)/2`` transpositions of the current order on one fixed set
    of Gumbel variates (common random numbers make the sample-average objective a deterministic
    function of the order, so the search terminates) and moves to the best one while it
    improves.

    Args:
      key: a PRNG key for the fixed Gumbel variates.
      alpha: Mallows scale (footrule, ``alpha/n`` scaling), ``>= 0``.
      D: ``[n, n]`` data matrix ``D[i, r-1]`` (``rankings.footrule_data_matrix``).
      order: item order ``o``, a permutation of ``0..n-1``, ``[n]``. The starting order.
      num_samples: the number of fixed Gumbel draws the objective averages over.
      max_sweeps: the largest number of moves.

    Returns:
      ``(order, history)``: the final order ``int32 [n]`` and the list of objective values
      (floats) after each move, starting from the initial order; the history is on those fixed
      variates.

    Raises:
      ValueError: when ``alpha``, ``D`` or ``order`` fails the checks of :class:`PseudoMallows`.
    """
    PseudoMallows(alpha, D, order, validate_args=True)  # checks alpha, D and order
    D = jnp.asarray(D, jnp.result_type(float))
    n = D.shape[0]
    order = jnp.asarray(order, jnp.int32)
    gumbels = jax.random.gumbel(key, (num_samples, n, n))
    alpha = jnp.asarray(alpha, D.dtype)
    cur = float(_crn_objective(gumbels, alpha, D, order))
    hist = [cur]
    if n < 2:
        return order, hist
    for _ in range(max_sweeps):
        vals, ii, jj = _neighbour_objectives(gumbels, alpha, D, order)
        b = int(jnp.argmax(vals))
        if float(vals[b]) <= cur + 1e-7:
            break
        i, j = int(ii[b]), int(jj[b])
        order = order.at[i].set(order[j]).at[j].set(order[i])
        cur = float(vals[b])
        hist.append(cur)
    return order, hist


# --------------------------------------------------------------------------- exact oracles


def _layers(n: int):
    masks = np.arange(1 << n, dtype=np.int64)
    pc = np.zeros(1 << n, np.int64)
    for b in range(n):
        pc += (masks >> b) & 1
    return [masks[pc == k] for k in range(n + 1)]


def _pull(vals_prev, layer, n, add):
    """For masks in ``layer``: logsumexp over r in mask of vals_prev[mask ^ 2^r] + add[.., r]."""
    out = np.full(len(layer), -np.inf)
    for r in range(n):
        has = (layer >> r) & 1 == 1
        if not has.any():
            continue
        src = layer[has] ^ (1 << r)
        out[has] = np.logaddexp(out[has], vals_prev[src] + add(src, r))
    return out


def _check_exact(alpha, D, limit=20):
    d = np.asarray(D, np.float64)
    if d.ndim != 2 or d.shape[0] != d.shape[1]:
        raise ValueError(f"D: expected a square [n, n] data matrix, got shape {d.shape}")
    if d.shape[0] > limit:
        raise ValueError(f"D: exact computation supports n <= {limit}, got n={d.shape[0]}")
    if not np.isfinite(alpha) or alpha < 0:
        raise ValueError(f"alpha: expected a finite value >= 0, got {alpha}")
    return d


def log_posterior_normaliser(alpha, D) -> float:
    """``log Z_post = log sum_rho exp(-(alpha/n) sum_i D[i, rho_i-1])`` exactly (a log permanent).

    Computed by a float64 DP over sets of used ranks, O(2^n n), n <= 20.

    Args:
      alpha: Mallows scale, finite and ``>= 0``.
      D: ``[n, n]`` data matrix ``D[i, r-1]`` with ``n <= 20``.

    Returns:
      ``log Z_post`` as a Python float.

    Raises:
      ValueError: when ``D`` is not square, ``n > 20`` or ``alpha`` is negative or not finite.
    """
    d = _check_exact(float(alpha), D)
    n = d.shape[0]
    lg = -(float(alpha) / n) * d
    layers = _layers(n)
    f = np.full(1 << n, -np.inf)
    f[0] = 0.0
    for k in range(n):  # item k takes one rank of the next set
        f[layers[k + 1]] = _pull(f, layers[k + 1], n, lambda src, r, k=k: lg[k, r])
    return float(f[(1 << n) - 1])


def exact_expected_log_normalisers(alpha, D, order) -> float:
    """``E_{q_o}[sum_k log C_k]`` exactly.

    The law of the set of used ranks after ``k`` steps is propagated by a DP (``C_k`` depends
    only on that set). O(2^n n), n <= 20.

    Args:
      alpha: Mallows scale, finite and ``>= 0``.
      D: ``[n, n]`` data matrix ``D[i, r-1]`` with ``n <= 20``.
      order: item order ``o``, a permutation of ``0..n-1``.

    Returns:
      The expectation as a Python float.

    Raises:
      ValueError: when ``D`` is not square, ``n > 20``, ``alpha`` is negative or not finite, or
        ``order`` is not a permutation of ``0..n-1``.
    """
    d = _check_exact(float(alpha), D)
    n = d.shape[0]
    o = validate_permutation(order, n, zero_based=True, name="order")
    lg = -(float(alpha) / n) * d[o]  # [step, rank]
    layers = _layers(n)
    logp = np.full(1 << n, -np.inf)
    logp[0] = 0.0
    logc = np.zeros(1 << n)
    total = 0.0
    for k in range(n):
        lay = layers[k]
        bits = ((lay[:, None] >> np.arange(n)[None, :]) & 1) == 1
        lc = np.logaddexp.reduce(np.where(bits, -np.inf, lg[k][None, :]), axis=1)
        logc[lay] = lc
        total += float(np.sum(np.exp(logp[lay]) * lc))
        logp[layers[k + 1]] = _pull(
            logp, layers[k + 1], n, lambda src, r, k=k: lg[k, r] - logc[src]
        )
    return total


def exact_kl(alpha, D, order) -> float:
    """``KL(q_o || P)`` exactly via (PM.3) and the two DPs above (n <= 20).

    Args:
      alpha: Mallows scale, finite and ``>= 0``.
      D: ``[n, n]`` data matrix ``D[i, r-1]`` with ``n <= 20``.
      order: item order ``o``, a permutation of ``0..n-1``.

    Returns:
      The KL divergence as a Python float.

    Raises:
      ValueError: as :func:`exact_expected_log_normalisers`.
    """
    return log_posterior_normaliser(alpha, D) - exact_expected_log_normalisers(alpha, D, order)


def exact_posterior_marginals(alpha, D) -> np.ndarray:
    """Exact ``P(rho_i = r | R)`` of (PM.1) by forward-backward over rank sets.

    Args:
      alpha: Mallows scale, finite and ``>= 0``.
      D: ``[n, n]`` data matrix ``D[i, r-1]`` with ``n <= 20``.

    Returns:
      float64 ``[n, n]`` numpy array, entry ``[i, r-1]``.

    Raises:
      ValueError: when ``D`` is not square, ``n > 20`` or ``alpha`` is negative or not finite.
    """
    d = _check_exact(float(alpha), D)
    n = d.shape[0]
    lg = -(float(alpha) / n) * d
    layers = _layers(n)
    full = (1 << n) - 1
    f = np.full(1 << n, -np.inf)
    f[0] = 0.0
    for k in range(n):
        f[layers[k + 1]] = _pull(f, layers[k + 1], n, lambda src, r, k=k: lg[k, r])
    # b[S] = log-sum over assignments of items |S|..n-1 to the ranks outside S.
    b = np.full(1 << n, -np.inf)
    b[full] = 0.0
    for k in range(n - 1, -1, -1):
        lay = layers[k]
        acc = np.full(len(lay), -np.inf)
        for r in range(n):
            free = (lay >> r) & 1 == 0
            acc[free] = np.logaddexp(acc[free], lg[k, r] + b[lay[free] | (1 << r)])
        b[lay] = acc
    logz = f[full]
    marg = np.zeros((n, n))
    for k in range(n):
        lay = layers[k]
        for r in range(n):
            free = (lay >> r) & 1 == 0
            s = f[lay[free]] + lg[k, r] + b[lay[free] | (1 << r)] - logz
            marg[k, r] = np.exp(s).sum()
    return marg


def exhaustive_order_search(alpha, D):
    """Exact KL of every order (n <= 7).

    Args:
      alpha: Mallows scale, finite and ``>= 0``.
      D: ``[n, n]`` data matrix ``D[i, r-1]`` with ``n <= 7``.

    Returns:
      ``(orders, kl)``: all orders ``int32 [n!, n]`` (lexicographic) and their exact
      ``KL(q_o || P)``, ``float64 [n!]``.

    Raises:
      ValueError: when ``D`` is not square, ``n > 7`` or ``alpha`` is negative or not finite.
    """
    d = _check_exact(float(alpha), D, limit=7)
    n = d.shape[0]
    orders = np.array(list(itertools.permutations(range(n))), dtype=np.int32)
    logz = log_posterior_normaliser(alpha, d)
    kl = np.array([logz - exact_expected_log_normalisers(alpha, d, o) for o in orders])
    return orders, kl


# --------------------------------------------------------------------------- augmentation


class AugmentedFit(NamedTuple):
    """Output of :func:`fit_augmented` (and of the MCMC analogue).

    ``rho``: kept consensus draws ``[T, n]``; ``user_rank_probs[j, i, r-1]``: posterior
    probability that user ``j``'s latent ranking puts item ``i`` at rank ``r``;
    ``rankings``: the last augmented data ``[N, n]``.
    """

    rho: jax.Array
    user_rank_probs: jax.Array
    rankings: jax.Array


def augment_blocks_pseudo(key, rho, alpha, blocks: Blocks):
    """Resample every user's latent ranking within its blocks by the sequential pseudo sampler.

    The factors are ``exp(-(alpha/n)|r - rho_i|)``; the item order is random per user.

    Args:
      key: a PRNG key.
      rho: the consensus, 1-based ranks ``[n]``.
      alpha: Mallows scale, ``>= 0``.
      blocks: :class:`~jaxlib_ext.samplers.rankings.Blocks`, integer ``[N, n]`` each.

    Returns:
      ``int32 [N, n]`` complete 1-based rankings, each consistent with its blocks.
    """
    item_block = jnp.asarray(blocks.item_block)
    rank_block = jnp.asarray(blocks.rank_block)
    N, n = item_block.shape
    ranks = jnp.arange(1, n + 1)
    logits_item = -(alpha / n) * jnp.abs(ranks[None, :] - rho[:, None]).astype(jnp.float32)

    def one(k, ib, rb):
        k1, k2 = jax.random.split(k)
        o = jax.random.permutation(k1, n)
        allowed = ib[o][:, None] == rb[None, :]
        r_seq, _ = _sequential_sample(jax.random.gumbel(k2, (n, n)), logits_item[o], allowed)
        return jnp.zeros(n, jnp.int32).at[o].set(r_seq.astype(jnp.int32) + 1)

    return jax.vmap(one)(jax.random.split(key, N), item_block, rank_block)


def fit_augmented(
    key,
    rankings,
    alpha,
    *,
    num_iter: int,
    blocks: Blocks | None = None,
    prefer=None,
    burnin: int | None = None,
    num_swaps: int | None = None,
    order=None,
):
    """Pseudo-Mallows with data augmentation for partial, click or pairwise data.

    Alternates (A) ``rho ~ q_o(. | D(R_aug))`` with the V order of the current data and (B) a
    fresh augmentation of every user's latent ranking: the sequential block sampler for
    ``blocks`` data, ``num_swaps`` Metropolis swaps per user for ``prefer`` (pairwise) data.
    jit-compiled.

    Args:
      key: a PRNG key.
      rankings: an initial complete ranking per user consistent with the data, ``[N, n]``
        (1-based).
      alpha: Mallows scale, finite and ``>= 0``.
      num_iter: the number of iterations, ``>= 2``.
      blocks: block data (missing ranks, top-k, clicks); exactly one of ``blocks`` and
        ``prefer`` is given.
      prefer: pairwise data, bool ``[N, n, n]`` (see ``rankings.pairwise_closure``).
      burnin: the number of first iterations discarded; ``None`` is ``num_iter // 2``.
      num_swaps: Metropolis swaps per user and iteration for ``prefer`` data; ``None`` is ``n``.
      order: a fixed item order, a permutation of ``0..n-1`` (e.g. from
        :func:`local_search_order` on the data after a short run); ``None`` uses the V order of
        the current data at every iteration.

    Returns:
      :class:`AugmentedFit`.

    Raises:
      ValueError: for rankings inconsistent with the data, not exactly one of ``blocks`` and
        ``prefer``, an invalid ``alpha``, ``num_iter < 2`` or an ``order`` that is not a
        permutation.
    """
    from jaxlib_ext.samplers.mallows_augment import augment_mh, check_augmentation_args

    R0, blocks, prefer = check_augmentation_args(rankings, blocks, prefer)
    if not (np.isfinite(alpha) and alpha >= 0):
        raise ValueError(f"alpha: expected a finite value >= 0, got {alpha}")
    if num_iter < 2:
        raise ValueError(f"num_iter: expected >= 2, got {num_iter}")
    burnin = num_iter // 2 if burnin is None else burnin
    n = R0.shape[1]
    num_swaps = n if num_swaps is None else num_swaps
    if order is not None:
        order = jnp.asarray(validate_permutation(order, n, zero_based=True, name="order"))
    return _fit_augmented_jit(
        key, jnp.asarray(R0), jnp.float32(alpha), blocks, prefer, order, num_iter, burnin,
        num_swaps, augment_mh,
    )


def _fit_augmented_impl(
    key, R0, alpha, blocks, prefer, order, num_iter, burnin, num_swaps, augment_mh
):
    N, n = R0.shape

    def body(carry, t):
        R, counts, k = carry
        k, ka, kb = jax.random.split(k, 3)
        D = footrule_data_matrix(R)
        o = v_order(D[:, 0]) if order is None else order
        rho, _ = pseudo_mallows_sample(ka, alpha, D, o)
        if prefer is None:
            R = augment_blocks_pseudo(kb, rho, alpha, blocks)
        else:
            R = augment_mh(kb, rho, R, alpha, num_swaps, prefer=prefer, blocks=blocks)
        keep = t >= burnin
        counts = counts + keep * jax.nn.one_hot(R - 1, n, dtype=jnp.float32)
        return (R, counts, k), rho

    init = (R0, jnp.zeros((N, n, n), jnp.float32), key)
    (R, counts, _), rhos = jax.lax.scan(body, init, jnp.arange(num_iter))
    return AugmentedFit(rhos[burnin:], counts / (num_iter - burnin), R)


_fit_augmented_jit = jax.jit(_fit_augmented_impl, static_argnums=(6, 7, 8, 9))
