r"""Pallas (Triton) kernels of the POET-X block rotation (arXiv 2603.05500, section 3).

Two kernels carry every activation-sized product of the layer:

* ``block_apply``: ``out[t, k, :] = z[t, k, :] @ G_k`` for the ``k``-th group of ``b`` features,
  grid ``(token tiles, blocks, column tiles)``, the contraction over the block looped inside the
  program. It is the forward (with ``G``) and the input cotangent (with ``G^T``).
* ``block_gram``: ``dG_k = sum_t z[t, k, :]^T dy[t, k, :]``, grid ``(blocks, row tiles, column
  tiles)``, the token axis looped inside the program (Triton programs cannot accumulate into a
  shared output block).

The Cayley–Neumann blocks ``G = I + 2Q + 2Q^2 + 2Q^3 + Q^4`` are built once per call from
``theta`` by XLA's batched matmuls (:func:`.reference.cayley_neumann`,
cost :math:`O(n b^2)`, independent of the number of tokens), and ``dQ`` follows from ``dG`` by
the polynomial's vjp. Building ``G`` inside the token kernel would recompute it for every token
tile, and a whole ``b = 256`` block in float32 (256 KiB) exceeds an H200 program's shared memory.

:func:`block_rotate_pallas` wraps the two kernels in a ``custom_vjp`` (forward ``block_apply``;
backward ``block_apply`` with ``G^T`` and ``block_gram``). Accumulation is in float32 (float64
for float64 inputs, interpret mode only).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from jaxlib_ext.pallas_kernels._common import like_varying, run_interpreted
from jaxlib_ext.pallas_kernels.poet.config import PoetKernelConfig

__all__ = ["PoetKernelConfig", "block_apply_pallas", "block_gram_pallas", "block_rotate_pallas"]


def _acc_dtype(dtype):
    return jnp.float64 if dtype == jnp.float64 else jnp.float32


def _flatten_tokens(z, block_tokens):
    t = int(z.size // z.shape[-1]) if z.ndim > 1 else 1
    z2 = z.reshape(t, z.shape[-1])
    pad = (-t) % block_tokens
    if pad:
        z2 = jnp.pad(z2, ((0, pad), (0, 0)))
    return z2, t


def _config(config, block_size):
    return (config or PoetKernelConfig()).for_shape(block_size)


def _params(config):
    return plgpu.CompilerParams(num_warps=config.num_warps, num_stages=config.num_stages)


def block_apply_pallas(z, g, config: PoetKernelConfig | None = None):
    """``[..., k b] x [k, b, b] -> [..., k b]``, ``out[..., k, :] = z[..., k, :] @ G_k``.

    Args:
      z: ``[..., k b]`` row vectors.
      g: ``[k, b, b]`` blocks (cast to ``z``'s dtype).
      config: tile sizes and launch parameters; ``None``: ``PoetKernelConfig()`` fitted to ``b``.

    Returns:
      The ``[..., k b]`` products, of ``z``'s dtype.
    """
    k, b, _ = g.shape
    cfg = _config(config, b)
    tt, tc, tk = cfg.block_tokens, cfg.block_cols, cfg.block_k
    z2, t = _flatten_tokens(z, tt)
    acc_dtype = _acc_dtype(z.dtype)
    out = _apply_call(z2, g.astype(z.dtype), tt, tc, tk, acc_dtype, cfg)
    return out[:t].reshape(z.shape)


def _apply_call(z2, g, tt, tc, tk, acc_dtype, cfg):
    tp, n = z2.shape
    k, b, _ = g.shape
    nc = b // tc

    def kernel(z_ref, g_ref, o_ref):
        acc = jnp.zeros((tt, tc), acc_dtype)
        for s in range(b // tk):
            zs = z_ref[:, pl.ds(s * tk, tk)]
            gs = g_ref[pl.ds(s * tk, tk), :]
            acc += jnp.dot(zs, gs, preferred_element_type=acc_dtype)
        o_ref[...] = acc.astype(o_ref.dtype)

    def call(z2, g):
        return pl.pallas_call(
            kernel,
            out_shape=like_varying(jax.ShapeDtypeStruct((tp, n), z2.dtype), z2, g),
            grid=(tp // tt, k, nc),
            in_specs=[
                pl.BlockSpec((tt, b), lambda i, kk, j: (i, kk)),
                pl.BlockSpec((None, b, tc), lambda i, kk, j: (kk, 0, j)),
            ],
            out_specs=pl.BlockSpec((tt, tc), lambda i, kk, j: (i, kk * nc + j)),
            compiler_params=_params(cfg),
            interpret=cfg.interpret,
            name="poet_block_apply",
        )(z2, g)

    return run_interpreted(call, z2, g) if cfg.interpret else call(z2, g)


def block_gram_pallas(z, dy, k: int, config: PoetKernelConfig | None = None):
    """``[..., k b] x [..., k b] -> [k, b, b]``: ``dG_k = sum_t z_k^T dy_k`` in float32.

    Args:
      z: ``[..., k b]`` inputs of the block product.
      dy: ``[..., k b]`` output cotangents (cast to ``z``'s dtype).
      k: number of blocks.
      config: tile sizes and launch parameters; ``None``: ``PoetKernelConfig()`` fitted to ``b``.

    Returns:
      The ``[k, b, b]`` sums, accumulated in float32 (float64 for float64 ``z``).
    """
    b = z.shape[-1] // k
    cfg = _config(config, b)
    tt, tc, tr = cfg.block_tokens, cfg.block_cols, cfg.block_k
    z2, _ = _flatten_tokens(z, tt)  # zero rows add nothing
    d2, _ = _flatten_tokens(dy.astype(z.dtype), tt)
    acc_dtype = _acc_dtype(z.dtype)
    tp = z2.shape[0]
    nr, nc = b // tr, b // tc

    def kernel(z_ref, d_ref, o_ref):
        def body(i, acc):
            rows = pl.ds(i * tt, tt)
            return acc + jax.lax.dot_general(  # z_rows^T @ dy_rows
                z_ref[rows, :], d_ref[rows, :], (((0,), (0,)), ((), ())),
                preferred_element_type=acc_dtype,
            )

        acc = jax.lax.fori_loop(0, tp // tt, body, jnp.zeros((tr, tc), acc_dtype))
        o_ref[...] = acc

    def call(z2, d2):
        return pl.pallas_call(
            kernel,
            out_shape=like_varying(jax.ShapeDtypeStruct((k, b, b), acc_dtype), z2, d2),
            grid=(k, nr, nc),
            in_specs=[
                pl.BlockSpec((tp, tr), lambda kk, r, c: (0, kk * nr + r)),
                pl.BlockSpec((tp, tc), lambda kk, r, c: (0, kk * nc + c)),
            ],
            out_specs=pl.BlockSpec((None, tr, tc), lambda kk, r, c: (kk, r, c)),
            compiler_params=_params(cfg),
            interpret=cfg.interpret,
            name="poet_block_gram",
        )(z2, d2)

    return run_interpreted(call, z2, d2) if cfg.interpret else call(z2, d2)


def block_rotate_pallas(z, g, config: PoetKernelConfig | None = None):
    """Differentiable ``out[..., k, :] = z[..., k, :] @ G_k`` on the Pallas kernels.

    Inside ``jax.shard_map`` ``z`` and ``G`` first take the varying axes of both, so the
    cotangent of a replicated ``G`` is summed over the devices.

    Args:
      z: ``[..., k b]`` row vectors.
      g: ``[k, b, b]`` blocks.
      config: tile sizes and launch parameters; ``None``: ``PoetKernelConfig()`` fitted to ``b``.

    Returns:
      The ``[..., k b]`` products.
    """
    z, g = like_varying((z, g), z, g)
    return _block_rotate(z, g, config)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def _block_rotate(z, g, config):
    return block_apply_pallas(z, g, config)


def _rotate_fwd(z, g, config):
    return block_apply_pallas(z, g, config), (z, g)


def _rotate_bwd(config, res, dy):
    z, g = res
    dz = block_apply_pallas(dy, jnp.swapaxes(g, -1, -2), config)
    dg = block_gram_pallas(z, dy, g.shape[0], config)
    return dz.astype(z.dtype), dg.astype(g.dtype)


_block_rotate.defvjp(_rotate_fwd, _rotate_bwd)
