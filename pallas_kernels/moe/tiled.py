"""Grouped matmuls in plain XLA over the work items of ``_metadata`` (no per-group loop).

The Pallas kernels' scheme written with XLA ops: the zero-padded rows are viewed as tiles
``[tiles, block_m, K]``; work item ``i`` (tile ``t_i``, group ``g_i``, rows ``[lo_i, hi_i)``)
takes its tile and the matrix ``rhs[g_i]`` (gathers), one batched matmul computes every item,
rows outside ``[lo_i, hi_i)`` are zeroed and the items are summed back into their tiles
(``segment_sum``; each row has exactly one item with it in range, none for rows past the sum)::

    gmm:   out[t_i rows] += mask_i * (lhs[t_i] @ rhs[g_i])
    tgmm:  out[g_i]      += (mask_i * lhs[t_i])^T @ grad[t_i]

The matmul work is ``(M + G * block_m) K N`` multiply-adds (the boundary tiles are computed
once per group that meets there), against ``G M K N`` for a dense masked product; the gathered
weights take ``(tiles + G - 1) K N`` elements. ``block_m`` defaults to
:func:`default_block_m`: padding at most an eighth of the rows. Differentiable by JAX's rules
(gathers, a batched matmul and a segment sum). This is the XLA path of ``moe.gmm`` on backends
whose ``ragged_dot`` lowering computes every group on every row (XLA:CPU).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from jaxlib_ext.pallas_kernels.moe._metadata import cdiv, group_metadata

__all__ = ["default_block_m", "gmm_tiled", "tgmm_tiled"]


def default_block_m(m: int, num_groups: int) -> int:
    """The largest power of two in ``[8, 128]`` at most ``m / (8 G)``.

    Boundary tiles then add at most ``G * block_m <= m / 8`` rows of work.

    Args:
      m: number of rows ``M``.
      num_groups: number of groups ``G``.

    Returns:
      The row tile ``block_m``, a Python int.
    """
    target = max(m // max(8 * num_groups, 1), 1)
    return int(min(128, max(8, 1 << (target.bit_length() - 1))))


def _acc_dtype(*arrays):
    f64 = any(jnp.dtype(a.dtype) == jnp.float64 for a in arrays)
    return jnp.float64 if f64 else jnp.float32


def _items(lhs, group_sizes, block_m):
    m = lhs.shape[0]
    tiles = cdiv(m, block_m)
    tile, group, lo, hi = group_metadata(group_sizes.astype(jnp.int32), m, block_m)
    rows = tile[:, None] * block_m + jnp.arange(block_m, dtype=jnp.int32)[None, :]
    mask = (rows >= lo[:, None]) & (rows < hi[:, None])  # [I, block_m]
    return tiles, tile, group, mask


def _as_tiles(x, tiles, block_m):
    x = jnp.pad(x, ((0, tiles * block_m - x.shape[0]), (0, 0)))
    return x.reshape(tiles, block_m, x.shape[1])


def gmm_tiled(lhs, rhs, group_sizes, *, block_m=None, precision=None):
    """``gmm`` (``reference.py``'s contract) by the tiled work items: ``[M, N]``.

    Args:
      lhs: ``[M, K]`` rows sorted by group.
      rhs: ``[G, K, N]`` per-group weights (cast to ``lhs``'s dtype).
      group_sizes: ``int[G]`` rows per group.
      block_m: row tile; ``None``: :func:`default_block_m`.
      precision: ``lax.Precision`` of the tile products, ``None`` for the default.

    Returns:
      The ``[M, N]`` products, of ``lhs``'s dtype.
    """
    m = lhs.shape[0]
    block_m = block_m or default_block_m(m, rhs.shape[0])
    acc = _acc_dtype(lhs, rhs)
    tiles, tile, group, mask = _items(lhs, group_sizes, block_m)
    a = jnp.take(_as_tiles(lhs, tiles, block_m), tile, axis=0)  # [I, bm, K]
    w = jnp.take(rhs.astype(lhs.dtype), group, axis=0)  # [I, K, N]
    out = lax.dot_general(
        a, w, (((2,), (1,)), ((0,), (0,))), precision=precision, preferred_element_type=acc
    )
    out = jnp.where(mask[..., None], out, jnp.zeros((), acc))
    out = jax.ops.segment_sum(out, tile, num_segments=tiles, indices_are_sorted=True)
    return out.reshape(tiles * block_m, -1)[:m].astype(lhs.dtype)


def tgmm_tiled(lhs, grad, group_sizes, *, block_m=None, precision=None):
    """``tgmm`` (``reference.py``'s contract) by the tiled work items: ``[G, K, N]``.

    Args:
      lhs: ``[M, K]`` rows sorted by group.
      grad: ``[M, N]`` output cotangents (cast to ``lhs``'s dtype).
      group_sizes: ``int[G]`` rows per group.
      block_m: row tile; ``None``: :func:`default_block_m`.
      precision: ``lax.Precision`` of the tile products, ``None`` for the default.

    Returns:
      The ``[G, K, N]`` per-group products, of ``lhs``'s dtype.
    """
    m = lhs.shape[0]
    num_groups = group_sizes.shape[0]
    block_m = block_m or default_block_m(m, num_groups)
    acc = _acc_dtype(lhs, grad)
    tiles, tile, group, mask = _items(lhs, group_sizes, block_m)
    a = jnp.take(_as_tiles(lhs, tiles, block_m), tile, axis=0)  # [I, bm, K]
    a = jnp.where(mask[..., None], a, jnp.zeros((), a.dtype))
    g = jnp.take(_as_tiles(grad.astype(lhs.dtype), tiles, block_m), tile, axis=0)  # [I, bm, N]
    out = lax.dot_general(
        a, g, (((1,), (1,)), ((0,), (0,))), precision=precision, preferred_element_type=acc
    )  # [I, K, N]
    out = jax.ops.segment_sum(out, group, num_segments=num_groups)
    return out.astype(lhs.dtype)
