"""Chunk preparation of the momentum delta rule's Pallas path (Triton), chunk-parallel.

One program per (chunk, batch row, head) computes everything of its chunk that does not depend
on the entering states (``_chunk_algebra.chunk_prep``): the gate products (5), (6), the
unit-lower-triangular inverse ``T = (I + L)^{-1}`` of the pseudo-value system (9), the
right-hand sides of (11) ``Uv = T V``, ``Y = T diag(A_{t-1}) P``, ``Z = T diag(b_{t-1}) P``,
the chunk-end key products of (7), (8) and the query coefficients of (10). The outputs that only
feed dots are stored in the dot dtype (bfloat16 for bfloat16 inputs).
"""

from __future__ import annotations

import functools

from jax.experimental import pallas as pl

from jaxlib_ext.pallas_kernels.mdn._chunk_algebra import F32, ChunkPrep, chunk_prep, dot_dtype
from jaxlib_ext.pallas_kernels.mdn._launch import launch, shape_dtype


def _prep_kernel(*refs, scale, precision, inverse):
    """One (batch, head, chunk) tile. ``refs``: the eight inputs (q, k, v, p, the log-gates,
    beta, eta), then the outputs in the order of ``ChunkPrep``."""
    outs = chunk_prep(
        *(r[...].astype(F32) for r in refs[:8]), scale=scale, precision=precision, inverse=inverse
    )
    for ref, val in zip(refs[8:], outs, strict=True):
        ref[...] = val.astype(ref.dtype)


def prep_call(q, k, v, p, la, lm, beta, eta, *, chunk, scale, precision, inverse, config):
    """``ChunkPrep`` of every chunk, on [B, Tp, H, *] arrays (Tp a multiple of ``chunk``).

    Args:
      q, k, p: [B, Tp, H, Kp] queries, keys and probe keys.
      v: [B, Tp, H, Vp] values.
      la, lm: [B, Tp, H] log decays of S and M.
      beta: [B, Tp, H] step sizes.
      eta: [B, Tp, H] momentum input gains.
      chunk: the chunk size C.
      scale: the query scale.
      precision: the ``lax.Precision`` of the in-kernel dots; it selects the dot dtype
        (bfloat16 for ``DEFAULT``, else float32).
      inverse: the in-kernel unit-lower-triangular inverse of (9), ``"substitution"`` or
        ``"neumann"``.
      config: the ``MDNKernelConfig`` (with ``interpret`` set).

    Returns:
      ``ChunkPrep``: uv [B, Tp, H, Vp] float32; y, z, kgs, kgm, qa, qb [B, Tp, H, Kp] and attn
      [B, Tp, H, C] in the dot dtype; a, b, u [B, Tp, H] float32.
    """
    b, tp, h, kp = q.shape
    vp = v.shape[-1]
    tok = lambda d: pl.BlockSpec((None, chunk, None, d), lambda i, j, l: (j, i, l, 0))
    gate = pl.BlockSpec((None, chunk, None), lambda i, j, l: (j, i, l))
    dot = dot_dtype(precision)  # y, z, kgs, kgm, qa, qb, attn only ever feed dots
    out_shape = (
        [shape_dtype((b, tp, h, vp))]
        + [shape_dtype((b, tp, h, kp), dot)] * 6
        + [shape_dtype((b, tp, h, chunk), dot)]
        + [shape_dtype((b, tp, h))] * 3
    )
    outs = launch(
        functools.partial(_prep_kernel, scale=scale, precision=precision, inverse=inverse),
        (q, k, v, p, la, lm, beta, eta),
        [tok(kp), tok(kp), tok(vp), tok(kp)] + [gate] * 4,
        [tok(vp)] + [tok(kp)] * 6 + [tok(chunk)] + [gate] * 3,
        out_shape,
        grid=(tp // chunk, b, h),
        config=config,
        name="mdn_prep",
        kp=kp,
    )
    return ChunkPrep(*outs)
