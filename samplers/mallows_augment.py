"""Data augmentation for partial, click and pairwise preference data, and top-K recommendations.

Under the footrule Mallows model (arXiv 2205.13911; Vitelli et al. 2018, JMLR 18(158))
the latent full ranking ``R_j`` of user ``j`` given the consensus ``rho`` has density

    P(R_j | rho, alpha, data) ∝ exp(-(alpha/n) sum_i |R_ji - rho_i|) 1[R_j consistent with data]

:func:`augment_mh` targets it exactly with Metropolis swaps: pick two ranks (with probability 1/2
two adjacent ranks ``r, r+1``, otherwise a uniformly random pair), swap the items holding them,
reject the swap if it breaks a block or a pairwise preference. The rank pair is drawn the same way
in both directions, so the proposal is symmetric and the acceptance is the likelihood ratio.
Adjacent swaps connect all linear extensions of a partial order, so the chain is irreducible for
pairwise data; swaps within a block connect every assignment for block data.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from jaxlib_ext.samplers.rankings import Blocks, satisfies_pairwise, validate_rankings

__all__ = ["augment_mh", "check_augmentation_args", "top_k_recommendations"]


def check_augmentation_args(rankings, blocks, prefer):
    """Validate an initial augmented data set against its block or pairwise constraints.

    Args:
      rankings: initial complete 1-based rankings, ``[N, n]``.
      blocks: :class:`~jaxlib_ext.samplers.rankings.Blocks` of shape ``[N, n]`` each, or
        ``None``.
      prefer: bool ``[N, n, n]`` pairwise preferences, or ``None``. Exactly one of ``blocks``
        and ``prefer`` is given.

    Returns:
      ``(rankings, blocks, prefer)``: the rankings as ``int32`` numpy, and the given constraint
      as ``jnp`` arrays (the other one ``None``).

    Raises:
      TypeError: for a traced, boolean or non-numeric ``rankings``.
      ValueError: for invalid rankings, not exactly one of ``blocks`` and ``prefer``, wrong
        shapes or dtype, or an initial ranking that breaks a block or a pairwise preference.
    """
    R = validate_rankings(rankings, name="rankings")
    if R.ndim != 2:
        raise ValueError(f"rankings: expected [N, n] initial complete rankings, got {R.shape}")
    if (blocks is None) == (prefer is None):
        raise ValueError("blocks/prefer: pass exactly one of them")
    if blocks is not None:
        ib, rb = np.asarray(blocks.item_block), np.asarray(blocks.rank_block)
        if ib.shape != R.shape or rb.shape != R.shape:
            raise ValueError(
                f"blocks: expected item_block and rank_block of shape {R.shape}, got "
                f"{ib.shape} and {rb.shape}"
            )
        if not np.all(np.take_along_axis(rb, R - 1, axis=1) == ib):
            raise ValueError("rankings: an initial ranking puts an item outside its block")
        return R, Blocks(jnp.asarray(ib), jnp.asarray(rb)), None
    P = np.asarray(prefer)
    if P.dtype != bool or P.shape != R.shape + (R.shape[1],):
        raise ValueError(
            f"prefer: expected a boolean [N, n, n] = {R.shape + (R.shape[1],)} array, got "
            f"{P.dtype} {P.shape}"
        )
    if not bool(np.all(satisfies_pairwise(R, P))):
        raise ValueError("rankings: an initial ranking violates a pairwise preference")
    return R, None, jnp.asarray(P)


def augment_mh(key, rho, rankings, alpha, num_swaps: int, *, prefer=None, blocks=None):
    """``num_swaps`` Metropolis swap proposals on every user's latent ranking (module docstring).

    jit/vmap-able.

    Args:
      key: a PRNG key.
      rho: the consensus, 1-based ranks ``[n]``.
      rankings: the current latent rankings ``[N, n]`` (1-based), consistent with the data.
      alpha: Mallows scale, ``>= 0``.
      num_swaps: the number of swap proposals per user.
      prefer: bool ``[N, n, n]`` pairwise preferences, or ``None``.
      blocks: :class:`~jaxlib_ext.samplers.rankings.Blocks` ``[N, n]`` each, or ``None``.

    Returns:
      The updated latent rankings, ``[N, n]``.
    """
    R = jnp.asarray(rankings)
    N, n = R.shape
    rho_f = jnp.asarray(rho).astype(jnp.float32)
    scale = alpha / n

    def one_user(k, r_j, pref_j, ib_j):
        inv = jnp.argsort(r_j)  # item at rank index
        k1, k2, k3, k4, k5 = jax.random.split(k, 5)
        adj = jax.random.bernoulli(k1, 0.5, (num_swaps,))
        x = jax.random.randint(k2, (num_swaps,), 0, n - 1)
        p1 = jax.random.randint(k3, (num_swaps,), 0, n)
        p2 = jax.random.randint(k4, (num_swaps,), 0, n - 1)
        p2 = p2 + (p2 >= p1)  # a uniform pair of distinct ranks
        lo_all = jnp.where(adj, x, jnp.minimum(p1, p2))
        hi_all = jnp.where(adj, x + 1, jnp.maximum(p1, p2))
        logu = jnp.log(jax.random.uniform(k5, (num_swaps,)))

        def prop(t, carry):
            r_j, inv = carry
            lo, hi = lo_all[t], hi_all[t]
            a, b = inv[lo], inv[hi]  # a is above b
            ok = jnp.bool_(True)
            if pref_j is not None:
                between = (r_j > lo + 1) & (r_j < hi + 1)
                ok = ~pref_j[a, b] & ~jnp.any(between & (pref_j[a] | pref_j[:, b]))
            if ib_j is not None:
                ok = ok & (ib_j[a] == ib_j[b])
            fl, fh = lo.astype(jnp.float32) + 1, hi.astype(jnp.float32) + 1
            dlog = -scale * (
                jnp.abs(fh - rho_f[a]) + jnp.abs(fl - rho_f[b])
                - jnp.abs(fl - rho_f[a]) - jnp.abs(fh - rho_f[b])
            )
            acc = ok & (logu[t] < dlog)
            r_new = r_j.at[a].set(hi + 1).at[b].set(lo + 1)
            inv_new = inv.at[lo].set(b).at[hi].set(a)
            return (jnp.where(acc, r_new, r_j), jnp.where(acc, inv_new, inv))

        r_j, _ = jax.lax.fori_loop(0, num_swaps, prop, (r_j, inv))
        return r_j

    keys = jax.random.split(key, N)
    in_axes = (0, 0, None if prefer is None else 0, None if blocks is None else 0)
    ib = None if blocks is None else jnp.asarray(blocks.item_block)
    return jax.vmap(one_user, in_axes=in_axes)(keys, R, prefer, ib)


def top_k_recommendations(user_rank_probs, clicked, k: int):
    """Top-``k`` unclicked items per user (click data, arXiv 2205.13911).

    The score of an unclicked item is the posterior probability that it lands in ranks
    ``n1+1..n1+k`` of the user's latent ranking (``n1`` = number of clicks).

    Args:
      user_rank_probs: ``[N, n, n]``, entry ``[j, i, r-1]`` the posterior probability that user
        ``j``'s latent ranking puts item ``i`` at rank ``r`` (``AugmentedFit.user_rank_probs``).
      clicked: bool ``[N, n]`` click data.
      k: the number of recommendations, ``1..n``.

    Returns:
      ``(items int32 [N, k], probabilities [N, k])``, best first.

    Raises:
      ValueError: for mismatched shapes or ``k`` outside ``1..n``.

    References:
      arXiv 2205.13911 (Pseudo-Mallows).
    """
    P = jnp.asarray(user_rank_probs)
    c = jnp.asarray(clicked)
    if P.ndim != 3 or P.shape[:2] != c.shape or P.shape[1] != P.shape[2]:
        raise ValueError(
            f"user_rank_probs/clicked: expected [N, n, n] and [N, n], got {P.shape}, {c.shape}"
        )
    n = P.shape[1]
    if not 1 <= k <= n:
        raise ValueError(f"k: expected 1..{n}, got {k}")
    n1 = c.sum(axis=1)
    r = jnp.arange(n)[None, :]
    window = (r >= n1[:, None]) & (r < n1[:, None] + k)  # rank index r-1 in [n1, n1+k)
    score = jnp.sum(P * window[:, None, :], axis=2)
    score = jnp.where(c, -1.0, score)
    probs, items = jax.lax.top_k(score, k)
    return items.astype(jnp.int32), probs
