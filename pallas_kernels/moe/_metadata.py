"""Work items of the grouped matmuls tiled over group boundaries (the megablox scheme).

The rows are cut into tiles of ``block_m``; a group covers a run of tiles and a tile on a
boundary is shared by the groups meeting there. A work item is one (group, tile) pair with at
least one row of the group in the tile; there are at most ``tiles + G - 1`` of them (each
boundary adds one visit to a tile), so a fixed-size list of that length (unused items with an
empty row range) describes any grouping. Computed in plain XLA, before the kernels.
"""

from __future__ import annotations

import jax.numpy as jnp

__all__ = ["cdiv", "group_metadata", "group_offsets"]


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def group_offsets(group_sizes, m: int):
    """``(starts, ends)`` ``[G]`` int32 of the groups' row ranges, clipped to ``[0, m]``."""
    ends = jnp.minimum(jnp.cumsum(group_sizes.astype(jnp.int32)), m)
    starts = jnp.minimum(ends - group_sizes.astype(jnp.int32), ends)
    return jnp.maximum(starts, 0), ends


def group_metadata(group_sizes, m: int, block_m: int):
    """The work items of the ``gmm`` kernel (module docstring), computed in XLA.

    Returns ``(tile, group, lo, hi)``, each ``[tiles + G - 1]`` int32 with
    ``tiles = ceil(m / block_m)``: item ``i`` covers rows ``[lo_i, hi_i)`` of tile ``tile_i``,
    all in group ``group_i``; unused items have ``lo = hi = 0``.
    """
    num_groups = group_sizes.shape[0]
    tiles = cdiv(m, block_m)
    items = tiles + num_groups - 1
    starts, ends = group_offsets(group_sizes, m)
    first = starts // block_m
    last = (jnp.maximum(ends, 1) - 1) // block_m
    count = jnp.where(ends > starts, last - first + 1, 0)
    item_end = jnp.cumsum(count)
    idx = jnp.arange(items, dtype=jnp.int32)
    group = jnp.searchsorted(item_end, idx, side="right").astype(jnp.int32)
    valid = group < num_groups
    group = jnp.minimum(group, num_groups - 1)
    tile = first[group] + idx - (item_end[group] - count[group])
    lo = jnp.maximum(starts[group], tile * block_m)
    hi = jnp.minimum(ends[group], (tile + 1) * block_m)
    zero = jnp.zeros_like(idx)
    tile = jnp.where(valid, tile, zero)
    lo = jnp.where(valid, lo, zero)
    hi = jnp.where(valid, hi, zero)
    return tile.astype(jnp.int32), group, lo.astype(jnp.int32), hi.astype(jnp.int32)
