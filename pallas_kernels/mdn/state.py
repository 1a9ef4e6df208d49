"""State recurrence of the momentum delta rule's Pallas path (Triton), forward and backward.

One program per (batch row, head, V-block) runs a sequential loop over the chunks, carrying the
states ``(S, M)`` ``[K, block_v]`` (float32) entering the current chunk, with the per-chunk
quantities of the preparation (``prep.py``)::

    Vt    = Uv - Y S + Z M                         (11)
    S_new = A_C S - b_C M + Kgs^T Vt               (7) at t = C
    M_new = U_C M - Kgm^T Vt                       (8) at t = C

The forward stores Vt and the states entering every chunk (for the output and the backward)
and returns the final states. The backward carries the cotangents ``(dS, dM)`` of the state
leaving the current chunk in reverse, through the transposes of (11), (7), (8) and the state
terms of the output (10), storing dVt and the chunk-end state cotangents. ``mosaic.py`` is the
Mosaic GPU version of the forward.
"""

from __future__ import annotations

import functools

import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from jaxlib_ext.pallas_kernels.mdn._chunk_algebra import dot_dtype, matmul
from jaxlib_ext.pallas_kernels.mdn._launch import F32, launch, shape_dtype


def _chunk_end(vec_ref, sl, chunk):
    """The last entry of a chunk's slice of a [Tp] coefficient vector, as a scalar."""
    vec = vec_ref[sl].astype(F32)
    return jnp.sum(jnp.where(jnp.arange(chunk) == chunk - 1, vec, 0.0))


def _state_fwd_kernel(
    uv_ref, y_ref, z_ref, kgs_ref, kgm_ref, a_ref, b_ref, u_ref, s0_ref, m0_ref,
    vt_ref, hs_ref, hm_ref, st_ref, mt_ref,
    *, chunk, n_chunks, kp, precision,
):  # fmt: skip
    """One (batch, head, V-block): the loop over chunks carrying (S, M) [K, BV]."""
    mm = functools.partial(matmul, precision=precision)

    def body(n, carry):
        s, m = carry
        sl = pl.ds(n * chunk, chunk)
        hsl = pl.ds(n * kp, kp)
        hs_ref[hsl, :] = s.astype(hs_ref.dtype)
        hm_ref[hsl, :] = m.astype(hm_ref.dtype)
        vt = uv_ref[sl, :] - mm(y_ref[sl, :], s) + mm(z_ref[sl, :], m)  # (11)
        vt_ref[sl, :] = vt.astype(vt_ref.dtype)
        a_end = _chunk_end(a_ref, sl, chunk)
        b_end = _chunk_end(b_ref, sl, chunk)
        u_end = _chunk_end(u_ref, sl, chunk)
        s_new = a_end * s - b_end * m + mm(kgs_ref[sl, :], vt, ta=True)  # (7)
        m_new = u_end * m - mm(kgm_ref[sl, :], vt, ta=True)  # (8)
        return s_new, m_new

    s, m = lax.fori_loop(0, n_chunks, body, (s0_ref[...], m0_ref[...]))
    st_ref[...] = s
    mt_ref[...] = m


def _state_bwd_kernel(
    do_ref, qa_ref, qb_ref, attn_ref, y_ref, z_ref, kgs_ref, kgm_ref, a_ref, b_ref, u_ref,
    dst_ref, dmt_ref, dvt_ref, dhs_ref, dhm_ref, ds0_ref, dm0_ref,
    *, chunk, n_chunks, kp, precision,
):  # fmt: skip
    """One (batch, head, V-block): the reverse loop over chunks carrying (dS, dM)."""
    mm = functools.partial(matmul, precision=precision)

    def body(i, carry):
        ds, dm = carry
        n = n_chunks - 1 - i
        sl = pl.ds(n * chunk, chunk)
        hsl = pl.ds(n * kp, kp)
        dhs_ref[hsl, :] = ds.astype(dhs_ref.dtype)
        dhm_ref[hsl, :] = dm.astype(dhm_ref.dtype)
        do = do_ref[sl, :].astype(F32)
        dvt = (
            mm(attn_ref[sl, :], do, ta=True) + mm(kgs_ref[sl, :], ds) - mm(kgm_ref[sl, :], dm)
        )
        dvt_ref[sl, :] = dvt.astype(dvt_ref.dtype)
        a_end = _chunk_end(a_ref, sl, chunk)
        b_end = _chunk_end(b_ref, sl, chunk)
        u_end = _chunk_end(u_ref, sl, chunk)
        ds_new = a_end * ds - mm(y_ref[sl, :], dvt, ta=True) + mm(qa_ref[sl, :], do, ta=True)
        dm_new = (
            u_end * dm
            - b_end * ds
            + mm(z_ref[sl, :], dvt, ta=True)
            - mm(qb_ref[sl, :], do, ta=True)
        )
        return ds_new, dm_new

    ds, dm = lax.fori_loop(0, n_chunks, body, (dst_ref[...], dmt_ref[...]))
    ds0_ref[...] = ds
    dm0_ref[...] = dm


def _sequence_specs(tp, kp, chunk, block_v, n):
    """BlockSpecs of the state kernels, grid ``(B, H, V-blocks)``: whole sequences per (batch,
    head), the V-block of value-like tensors, one state tile and all chunk states. Returns
    ``(full_k, full_c, full_v, gate, state, states)``."""
    full_k = pl.BlockSpec((None, tp, None, kp), lambda i, j, l: (i, 0, j, 0))
    full_c = pl.BlockSpec((None, tp, None, chunk), lambda i, j, l: (i, 0, j, 0))
    full_v = pl.BlockSpec((None, tp, None, block_v), lambda i, j, l: (i, 0, j, l))
    gate = pl.BlockSpec((None, tp, None), lambda i, j, l: (i, 0, j))
    state = pl.BlockSpec((None, None, kp, block_v), lambda i, j, l: (i, j, 0, l))
    states = pl.BlockSpec((None, None, n * kp, block_v), lambda i, j, l: (i, j, 0, l))
    return full_k, full_c, full_v, gate, state, states


def _sequence_out_shapes(b, tp, h, kp, vp, n, dot):
    """Outputs of both state kernels: a value-like sequence and the per-chunk (S, M) (or their
    cotangents), in the dot dtype ``dot`` (they only feed dots and the chunk-end decay sums),
    and the final pair in float32."""
    return [
        shape_dtype((b, tp, h, vp), dot),
        shape_dtype((b, h, n * kp, vp), dot),
        shape_dtype((b, h, n * kp, vp), dot),
        shape_dtype((b, h, kp, vp)),
        shape_dtype((b, h, kp, vp)),
    ]


def state_fwd_call(prep, s0, m0, *, chunk, block_v, precision, config):
    """Forward recurrence (11), (7), (8) over the chunks.

    Args:
      prep: the ``ChunkPrep`` of every chunk, on [B, Tp, H, *] arrays.
      s0, m0: the entering states, [B, H, Kp, Vp].
      chunk: the chunk size C (Tp a multiple of it).
      block_v: the V-tile, dividing Vp.
      precision: the ``lax.Precision`` of the in-kernel dots; it selects the dot dtype
        (bfloat16 for ``DEFAULT``, else float32).
      config: the ``MDNKernelConfig`` (with ``interpret`` set).

    Returns:
      ``(Vt, hs, hm, S_T, M_T)``: Vt [B, Tp, H, Vp] and the states entering each chunk
      [B, H, N*Kp, Vp] in the dot dtype; the final states [B, H, Kp, Vp] float32.
    """
    b, tp, h, kp = prep.y.shape
    vp = prep.uv.shape[-1]
    n = tp // chunk
    full_k, _, full_v, gate, state, states = _sequence_specs(tp, kp, chunk, block_v, n)
    kernel = functools.partial(
        _state_fwd_kernel, chunk=chunk, n_chunks=n, kp=kp, precision=precision
    )
    return launch(
        kernel,
        (prep.uv, prep.y, prep.z, prep.kgs, prep.kgm, prep.a, prep.b, prep.u, s0, m0),
        [full_v] + [full_k] * 4 + [gate] * 3 + [state, state],
        [full_v, states, states, state, state],
        _sequence_out_shapes(b, tp, h, kp, vp, n, dot_dtype(precision)),
        grid=(b, h, vp // block_v),
        config=config,
        name="mdn_state_fwd",
        kp=kp,
    )


def state_bwd_call(prep, do, dst, dmt, *, chunk, block_v, precision, config):
    """Reverse recurrence from the output cotangent and those of the final states.

    Args:
      prep: the ``ChunkPrep`` of every chunk, on [B, Tp, H, *] arrays.
      do: the output cotangent, [B, Tp, H, Vp].
      dst, dmt: the cotangents of the final states S_T, M_T, [B, H, Kp, Vp].
      chunk: the chunk size C (Tp a multiple of it).
      block_v: the V-tile, dividing Vp.
      precision: the ``lax.Precision`` of the in-kernel dots; it selects the dot dtype
        (bfloat16 for ``DEFAULT``, else float32).
      config: the ``MDNKernelConfig`` (with ``interpret`` set).

    Returns:
      ``(dVt, dhs, dhm, dS_0, dM_0)``: dVt [B, Tp, H, Vp] and the chunk-end state cotangents
      dhs, dhm [B, H, N*Kp, Vp] (in the layout of the forward's per-chunk states) in the dot
      dtype; dS_0, dM_0 [B, H, Kp, Vp] float32.
    """
    b, tp, h, kp = prep.y.shape
    vp = do.shape[-1]
    n = tp // chunk
    full_k, full_c, full_v, gate, state, states = _sequence_specs(tp, kp, chunk, block_v, n)
    kernel = functools.partial(
        _state_bwd_kernel, chunk=chunk, n_chunks=n, kp=kp, precision=precision
    )
    return launch(
        kernel,
        (do, prep.qa, prep.qb, prep.attn, prep.y, prep.z, prep.kgs, prep.kgm, prep.a, prep.b,
         prep.u, dst, dmt),  # fmt: skip
        [full_v, full_k, full_k, full_c] + [full_k] * 4 + [gate] * 3 + [state, state],
        [full_v, states, states, state, state],
        _sequence_out_shapes(b, tp, h, kp, vp, n, dot_dtype(precision)),
        grid=(b, h, vp // block_v),
        config=config,
        name="mdn_state_bwd",
        kp=kp,
    )
