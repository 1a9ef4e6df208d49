"""Output of the momentum delta rule's Pallas path (Triton), chunk-parallel.

One program per (chunk, batch row * head, V-block) evaluates equation (10) from the entering
states ``(S_0, M_0)`` of its chunk, the pseudo-values Vt and the preparation's query
coefficients::

    O = Qa S_0 - Qb M_0 + Attn Vt       Qa = diag(A) sQ,  Qb = diag(b) sQ,  Attn = gamma * (sQ Kt^T)
"""

from __future__ import annotations

import functools

from jax.experimental import pallas as pl

from jaxlib_ext.pallas_kernels.mdn._chunk_algebra import matmul
from jaxlib_ext.pallas_kernels.mdn._launch import launch, shape_dtype


def _out_kernel(qa_ref, qb_ref, attn_ref, hs_ref, hm_ref, vt_ref, o_ref, *, precision):
    """One (batch, head, chunk, V-block) tile of equation (10)."""
    mm = functools.partial(matmul, precision=precision)
    o = mm(qa_ref[...], hs_ref[...]) - mm(qb_ref[...], hm_ref[...]) + mm(attn_ref[...], vt_ref[...])
    o_ref[...] = o.astype(o_ref.dtype)


def out_call(prep, hs, hm, vt, out_dtype, *, chunk, block_v, precision, config):
    """Equation (10) for every chunk.

    Args:
      prep: the ``ChunkPrep`` of every chunk; ``qa, qb`` [B, Tp, H, Kp], ``attn``
        [B, Tp, H, chunk].
      hs, hm: the states entering each chunk, [B, H, N*Kp, Vp].
      vt: the pseudo-values Vt, [B, Tp, H, Vp].
      out_dtype: the dtype of ``o``.
      chunk: the chunk size C (Tp a multiple of it).
      block_v: the V-tile, dividing Vp.
      precision: the ``lax.Precision`` of the in-kernel dots; it selects the dot dtype
        (bfloat16 for ``DEFAULT``, else float32).
      config: the ``MDNKernelConfig`` (with ``interpret`` set).

    Returns:
      ``o`` [B, Tp, H, Vp] in ``out_dtype``.
    """
    b, tp, h, kp = prep.qa.shape
    vp = vt.shape[-1]
    # grid (chunk, batch * head, V-block): at most three grid axes for Triton.
    tok_k = pl.BlockSpec((None, chunk, None, kp), lambda i, j, l: (j // h, i, j % h, 0))
    tok_c = pl.BlockSpec((None, chunk, None, chunk), lambda i, j, l: (j // h, i, j % h, 0))
    tok_v = pl.BlockSpec((None, chunk, None, block_v), lambda i, j, l: (j // h, i, j % h, l))
    state = pl.BlockSpec((None, None, kp, block_v), lambda i, j, l: (j // h, j % h, i, l))
    (o,) = launch(
        functools.partial(_out_kernel, precision=precision),
        (prep.qa, prep.qb, prep.attn, hs, hm, vt),
        [tok_k, tok_k, tok_c, state, state, tok_v],
        [tok_v],
        [shape_dtype((b, tp, h, vp), out_dtype)],
        grid=(tp // chunk, b * h, vp // block_v),
        config=config,
        name="mdn_out",
        kp=kp,
    )
    return o
