"""Grouped matmuls in Pallas (Triton): ``gmm_pallas``, ``tgmm_pallas`` and their custom VJP.

Same contract as ``reference.py`` (``lhs [M, K]``, rows in consecutive groups of
``group_sizes [G]``, ``sum(group_sizes) <= M``, rows past the sum give zeros).

Tiling over group boundaries (the scheme of megablox, JAX's ``pallas/ops/tpu/megablox``): the
rows are cut into tiles of ``block_m``; a group covers a run of tiles and a tile on a boundary
is shared by the groups meeting there. ``group_metadata`` (plain XLA, before the kernel)
lists the work items, one per (group, tile) pair with at least one row of the group in the
tile: item ``i`` has the tile index, the group and the row range ``[lo, hi)`` of the group
inside the tile. There are at most ``tiles + G - 1`` items (each boundary adds one visit to
a tile); the grid has that static size and the unused items have an empty row range.

* ``gmm`` kernel, grid ``(items, N / block_n)``: item ``i`` multiplies its tile of ``lhs`` by
  ``rhs[group]`` (a loop over ``K`` in ``block_k`` steps) and stores only rows ``[lo, hi)``
  (a masked store). Every row belongs to one item per column block, so programs never write
  the same element; the output buffer starts as zeros (an aliased input), so rows past the
  sum stay zero.
* ``tgmm`` kernel, grid ``(G, K / block_k, N / block_n)``: group ``g`` loops over its tiles
  (a trip count read from the group offsets; zero for an empty group) and accumulates
  ``lhs_tile^T grad_tile`` with the rows outside the group zeroed.

Gradients (``jax.custom_vjp``), ``group_sizes`` getting none:

* of ``out = gmm(lhs, rhs)``: ``d lhs = gmm(d out, rhs^T)`` (the same kernel, reading ``rhs``
  transposed) and ``d rhs = tgmm(lhs, d out)``;
* of ``out = tgmm(lhs, grad)`` (``out[g] = sum_{r in g} lhs[r]^T grad[r]``):
  ``d lhs = gmm(grad, d out^T)`` and ``d grad = gmm(lhs, d out)``, zero on rows past the sum.

Inside ``jax.shard_map`` the operands of each custom VJP take the varying axes of all of them
(``_common.like_varying``), so the cotangent of a replicated ``rhs`` is summed over the devices.

Numerics: float32 accumulation (float64 for float64 operands, interpret mode only: Triton has
no float64 dot). In-kernel dots: bfloat16 operands stay bfloat16 (bf16 MMA); float32 operands
take 3xTF32 (``DotAlgorithmPreset.TF32_TF32_F32_X3``) when compiled and ``Precision.HIGHEST``
in interpret mode.

Padding: ``M`` up to a multiple of ``block_m`` and ``K``, ``N`` up to multiples of the
contraction and column blocks, with zeros (no effect on the products), sliced off after.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from jaxlib_ext.pallas_kernels._common import like_varying, run_interpreted
from jaxlib_ext.pallas_kernels.moe._metadata import group_metadata, group_offsets
from jaxlib_ext.pallas_kernels.moe.config import GMMKernelConfig

__all__ = ["GMMKernelConfig", "gmm_pallas", "group_metadata", "tgmm_pallas"]


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _pad2(x, rows: int, cols: int):
    return jnp.pad(x, ((0, rows - x.shape[0]), (0, cols - x.shape[1])))


def _acc_dtype(*arrays):
    f64 = any(jnp.dtype(a.dtype) == jnp.float64 for a in arrays)
    return jnp.float64 if f64 else jnp.float32


def _precision(dtype, interpret: bool):
    if jnp.dtype(dtype) == jnp.bfloat16 or jnp.dtype(dtype) == jnp.float16:
        return lax.Precision.DEFAULT
    if interpret:
        return lax.Precision.HIGHEST
    return lax.DotAlgorithmPreset.TF32_TF32_F32_X3


# --------------------------------------------------------------------------------- kernels


def _gmm_kernel(
    tile_ref, group_ref, lo_ref, hi_ref, lhs_ref, rhs_ref, _zeros_ref, out_ref,
    *, bm, bk, bn, k_steps, transpose_rhs, precision, acc_dtype,
):  # fmt: skip
    """One (work item, column block): ``lhs[tile] @ rhs[group]``, rows ``[lo, hi)`` stored."""
    i = pl.program_id(0)
    j = pl.program_id(1)
    tile, group, lo, hi = tile_ref[i], group_ref[i], lo_ref[i], hi_ref[i]
    row0 = tile * bm
    cols = pl.ds(j * bn, bn)

    def step(kk, acc):
        depth = pl.ds(kk * bk, bk)
        a = lhs_ref[pl.ds(row0, bm), depth]
        if transpose_rhs:  # rhs is [G, N, K]: read the [bn, bk] block and contract its K
            b = rhs_ref[group, cols, depth]
            dims = (((1,), (1,)), ((), ()))
        else:
            b = rhs_ref[group, depth, cols]
            dims = (((1,), (0,)), ((), ()))
        return acc + lax.dot_general(
            a, b, dims, precision=precision, preferred_element_type=acc_dtype
        )

    acc = lax.fori_loop(0, k_steps, step, jnp.zeros((bm, bn), acc_dtype))
    rows = row0 + lax.broadcasted_iota(jnp.int32, (bm, bn), 0)
    mask = (rows >= lo) & (rows < hi)
    plgpu.store(out_ref.at[pl.ds(row0, bm), cols], acc.astype(out_ref.dtype), mask=mask)


def _tgmm_kernel(
    start_ref, end_ref, lhs_ref, grad_ref, out_ref, *, bm, bk, bn, precision, acc_dtype
):  # fmt: skip
    """One (group, K block, column block): ``sum over the group's tiles of lhs^T grad``."""
    g = pl.program_id(0)
    kb = pl.program_id(1)
    j = pl.program_id(2)
    start, end = start_ref[g], end_ref[g]
    first = start // bm
    trips = jnp.where(end > start, (end - 1) // bm - first + 1, 0)
    depth = pl.ds(kb * bk, bk)
    cols = pl.ds(j * bn, bn)

    def step(t, acc):
        row0 = (first + t) * bm
        rows = row0 + lax.broadcasted_iota(jnp.int32, (bm, bk), 0)
        a = lhs_ref[pl.ds(row0, bm), depth]
        a = jnp.where((rows >= start) & (rows < end), a, jnp.zeros((), a.dtype))
        b = grad_ref[pl.ds(row0, bm), cols]
        return acc + lax.dot_general(
            a, b, (((0,), (0,)), ((), ())), precision=precision, preferred_element_type=acc_dtype
        )

    acc = lax.fori_loop(0, trips, step, jnp.zeros((bk, bn), acc_dtype))
    out_ref[...] = acc.astype(out_ref.dtype)


# --------------------------------------------------------------------------------- calls


def _gmm_call(lhs, rhs, group_sizes, config: GMMKernelConfig, transpose_rhs: bool):
    m, k = lhs.shape
    n = rhs.shape[1] if transpose_rhs else rhs.shape[2]
    config = config.for_shape(k, n)
    bm, bk, bn = config.block_m, config.block_k, config.block_n
    mp, kp, np_ = _cdiv(m, bm) * bm, _cdiv(k, bk) * bk, _cdiv(n, bn) * bn
    lhs_p = _pad2(lhs, mp, kp)
    pad_k, pad_n = (0, kp - k), (0, np_ - n)
    rhs_p = jnp.pad(rhs, ((0, 0), pad_n, pad_k) if transpose_rhs else ((0, 0), pad_k, pad_n))
    tile, group, lo, hi = group_metadata(group_sizes, m, bm)
    acc_dtype = _acc_dtype(lhs, rhs)
    out_dtype = lhs.dtype
    kernel = functools.partial(
        _gmm_kernel, bm=bm, bk=bk, bn=bn, k_steps=kp // bk, transpose_rhs=transpose_rhs,
        precision=_precision(lhs.dtype, config.interpret), acc_dtype=acc_dtype,
    )  # fmt: skip

    def call(*args):
        # the aliased output buffer's type is the output's: varying as the operands
        zeros = like_varying(jnp.zeros((mp, np_), out_dtype), *args)
        return pl.pallas_call(
            kernel,
            out_shape=like_varying(jax.ShapeDtypeStruct((mp, np_), out_dtype), zeros),
            grid=(tile.shape[0], np_ // bn),
            input_output_aliases={6: 0},
            compiler_params=plgpu.CompilerParams(
                num_warps=config.num_warps, num_stages=config.num_stages
            ),
            interpret=config.interpret,
            name="moe_gmm",
        )(*args, zeros)

    args = (tile, group, lo, hi, lhs_p, rhs_p.astype(lhs.dtype))
    out = run_interpreted(call, *args) if config.interpret else call(*args)
    return out[:m, :n]


def _tgmm_call(lhs, grad, group_sizes, config: GMMKernelConfig):
    m, k = lhs.shape
    n = grad.shape[1]
    num_groups = group_sizes.shape[0]
    config = config.for_shape(k, n)
    bm, bk, bn = config.block_m, config.block_k, config.block_n
    mp, kp, np_ = _cdiv(m, bm) * bm, _cdiv(k, bk) * bk, _cdiv(n, bn) * bn
    starts, ends = group_offsets(group_sizes, m)
    acc_dtype = _acc_dtype(lhs, grad)
    kernel = functools.partial(
        _tgmm_kernel, bm=bm, bk=bk, bn=bn,
        precision=_precision(lhs.dtype, config.interpret), acc_dtype=acc_dtype,
    )  # fmt: skip

    def call(*args):
        return pl.pallas_call(
            kernel,
            out_shape=like_varying(jax.ShapeDtypeStruct((num_groups, kp, np_), lhs.dtype), *args),
            grid=(num_groups, kp // bk, np_ // bn),
            out_specs=pl.BlockSpec((None, bk, bn), lambda g, kb, j: (g, kb, j)),
            compiler_params=plgpu.CompilerParams(
                num_warps=config.num_warps, num_stages=config.num_stages
            ),
            interpret=config.interpret,
            name="moe_tgmm",
        )(*args)

    args = (starts, ends, _pad2(lhs, mp, kp), _pad2(grad.astype(lhs.dtype), mp, np_))
    out = run_interpreted(call, *args) if config.interpret else call(*args)
    return out[:, :k, :n]


# --------------------------------------------------------------------------------- custom VJP


@functools.partial(jax.custom_vjp, nondiff_argnums=(3,))
def _gmm(lhs, rhs, group_sizes, config):
    return _gmm_call(lhs, rhs, group_sizes, config, transpose_rhs=False)


def _gmm_fwd(lhs, rhs, group_sizes, config):
    return _gmm(lhs, rhs, group_sizes, config), (lhs, rhs, group_sizes)


def _gmm_bwd(config, residuals, d_out):
    lhs, rhs, group_sizes = residuals
    d_lhs = _gmm_call(d_out, rhs, group_sizes, config, transpose_rhs=True)
    d_rhs = _tgmm_call(lhs, d_out, group_sizes, config)
    return d_lhs.astype(lhs.dtype), d_rhs.astype(rhs.dtype), None


_gmm.defvjp(_gmm_fwd, _gmm_bwd)


def _config(config):
    if config is None:
        return GMMKernelConfig(interpret=None)  # interpreted where the backend is not a GPU
    if not isinstance(config, GMMKernelConfig):
        raise TypeError(f"config must be a GMMKernelConfig, got {type(config).__name__}")
    return config


def gmm_pallas(lhs, rhs, group_sizes, *, config: GMMKernelConfig | None = None):
    """Grouped matmul ``[M, K] x [G, K, N] -> [M, N]`` by the Pallas kernel (module docstring).

    Differentiable in ``lhs`` and ``rhs``. Arguments are not validated here (``moe.gmm`` does).

    Args:
      lhs: ``[M, K]`` rows sorted by group.
      rhs: ``[G, K, N]`` per-group weights (cast to ``lhs``'s dtype).
      group_sizes: ``int[G]`` rows per group.
      config: tile sizes and launch parameters; ``None``: ``GMMKernelConfig()``, interpreted where
        the backend is not a GPU.

    Returns:
      The ``[M, N]`` products.
    """
    group_sizes = group_sizes.astype(jnp.int32)
    lhs, rhs = like_varying((lhs, rhs.astype(lhs.dtype)), lhs, rhs, group_sizes)
    return _gmm(lhs, rhs, group_sizes, _config(config))


@functools.partial(jax.custom_vjp, nondiff_argnums=(3,))
def _tgmm(lhs, grad, group_sizes, config):
    return _tgmm_call(lhs, grad, group_sizes, config)


def _tgmm_fwd(lhs, grad, group_sizes, config):
    return _tgmm(lhs, grad, group_sizes, config), (lhs, grad, group_sizes)


def _tgmm_bwd(config, residuals, d_out):
    lhs, grad, group_sizes = residuals
    d_out = d_out.astype(lhs.dtype)
    d_lhs = _gmm_call(grad, d_out, group_sizes, config, transpose_rhs=True)
    d_grad = _gmm_call(lhs, d_out, group_sizes, config, transpose_rhs=False)
    return d_lhs.astype(lhs.dtype), d_grad.astype(grad.dtype), None


_tgmm.defvjp(_tgmm_fwd, _tgmm_bwd)


def tgmm_pallas(lhs, grad, group_sizes, *, config: GMMKernelConfig | None = None):
    """Per-group ``lhs^T grad``, ``[M, K] x [M, N] -> [G, K, N]``, by the Pallas kernel.

    Differentiable in ``lhs`` and ``grad`` (module docstring).

    Args:
      lhs: ``[M, K]`` rows sorted by group.
      grad: ``[M, N]`` output cotangents.
      group_sizes: ``int[G]`` rows per group.
      config: as in :func:`gmm_pallas`.

    Returns:
      The ``[G, K, N]`` per-group products.
    """
    group_sizes = group_sizes.astype(jnp.int32)
    lhs, grad = like_varying((lhs, grad), lhs, grad, group_sizes)
    return _tgmm(lhs, grad, group_sizes, _config(config))
