"""Mosaic GPU (Hopper) variant of the forward state recurrence of the momentum delta rule
(Momentum DeltaNet, arXiv 2605.05838).

Same job as ``state._state_fwd_kernel`` (equations (11), (7), (8) of ``_chunk_algebra``, one
(batch, head, V-block) per block, a sequential loop over chunks), written for the Pallas Mosaic
GPU backend instead of Triton, which JAX deprecates from 0.11 on. Per chunk, with the states
(S, M) [K, BV] float32 in registers::

    Vt    = Uv - Y S + Z M                         (11)  two wgmma, [C, K] x [K, BV]
    S_new = A_C S - b_C M + Kgs^T Vt               (7)   wgmma, [K, C] x [C, BV]
    M_new = U_C M - Kgm^T Vt                       (8)   wgmma, [K, C] x [C, BV]

What differs from the Triton kernel: the chunk tiles (Uv, Y, Z, Kgs, Kgm) stream in by TMA
through a two-slot ``emit_pipeline``, so chunk n + 1 loads while chunk n computes (the Triton
kernel at ``num_stages=1`` waits for every load); the dots are warpgroup MMAs (wgmma) with the
operands in swizzled shared memory, and the bf16 copies of S and M that the dots read are the
same shared tiles that go to HBM as the per-chunk states (hs, hm); these and Vt are
double-buffered, and chunk n + 2 writes a slot only after the TMA stores of chunk n from it
have finished reading.

``stages`` (the ``num_stages`` of ``MDNKernelConfig.launch`` for ``mdn_state_fwd_mosaic``)
is the number of slots: 2 as above, or 1, where every buffer is single (chunk n + 1 loads
after chunk n, chunk n + 1 writes its states after chunk n's stores are done). One slot takes
half the shared memory (about 95 KiB at K = 128, block_v 32, against 185 KiB), so two blocks
fit on an SM, as two programs of the Triton kernel do: the other block's work hides the
loads instead of the prefetch. Which wins is for the GPU timings. The chunk-end gate products
(A_C, b_C, U_C) of the whole sequence are loaded once and read as scalars: a pipeline slot is
refilled by TMA right after its step, and GPU interpret mode's race detector flags scalar
reads of it.

Limits (checked by ``check_supported``): bfloat16 dot operands only (wgmma reads float32
operands as TF32 and cannot transpose them, and ``Kgs^T`` is a transposed operand); chunk a
multiple of 64 and padded K a multiple of 64 (the M side of a wgmma is 64 rows per
warpgroup); shared memory within the H200's 227 KiB (``smem_bytes``): K = 128 takes
block_v <= 32 at two stages, <= 64 at one. Interpret mode (``interpret=True``) runs JAX's
GPU interpreter with its race detector on; it fills unwritten outputs with NaN, so the tests
see any element the kernel skips.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from jaxlib_ext.pallas_kernels._common import like_varying

__all__ = ["check_supported", "smem_bytes", "state_fwd_mosaic"]

_F32 = jnp.float32
_SMEM_LIMIT = 227 * 1024  # H200: opt-in shared memory per block
_STAGES = (1, 2)  # slots of the input pipeline and of the output buffers
_TMA_ROWS = 256  # a TMA box spans at most 256 elements per dimension


def smem_bytes(chunk: int, kp: int, block_v: int, n_chunks: int, stages: int = 2) -> int:
    """Shared memory of ``state_fwd_mosaic`` (bfloat16 operands).

    ``stages`` slots of the pipeline's Uv (float32) and Y, Z, Kgs, Kgm tiles and of the outputs
    Vt, hs, hm, and the gate scalars (16 bytes per chunk). The float32 staging of the entering
    and final states is allocated outside the pipeline's lifetime and is smaller. Mosaic GPU's
    own count at chunk 64, K 128, 64 chunks, 2 stages: 246824 B at block_v 64 (this gives
    246848), refused; 185 KiB at block_v 32.

    Args:
      chunk: the chunk size C.
      kp: the padded K.
      block_v: the V-tile.
      n_chunks: the number of chunks N.
      stages: the slots of the pipeline and of the output buffers, 1 or 2.

    Returns:
      The bytes of shared memory per block.
    """
    inputs = chunk * block_v * 4 + 4 * chunk * kp * 2
    outputs = (chunk + 2 * kp) * block_v * 2
    return stages * (inputs + outputs) + 16 * n_chunks + 64  # + barriers, alignment


def check_supported(
    *, dot_dtype, chunk: int, kp: int, block_v: int, n_chunks: int, stages: int = 2
) -> None:
    """Check that the Mosaic GPU kernel can run with these settings.

    Args:
      dot_dtype: the dtype of the dot operands; only bfloat16 is supported.
      chunk: the chunk size, a multiple of 64.
      kp: the padded K, a multiple of 64.
      block_v: the V-tile.
      n_chunks: the number of chunks.
      stages: the slots of the pipeline, 1 or 2.

    Raises:
      ValueError: naming the argument (``launch``, ``state_kernel``, ``chunk_size``, ``k`` or
        ``block_v``), where the kernel cannot run: ``stages`` not 1 or 2, dot operands other
        than bfloat16, ``chunk`` or ``kp`` not a multiple of 64, or :func:`smem_bytes` over the
        H200's 227 KiB.
    """
    if stages not in _STAGES:
        raise ValueError(
            f"launch: mdn_state_fwd_mosaic takes num_stages in {_STAGES}, got {stages}"
        )
    if jnp.dtype(dot_dtype) != jnp.bfloat16:
        raise ValueError(
            "state_kernel='mosaic_gpu': needs bfloat16 inputs (wgmma takes float32 operands "
            f"as TF32 and cannot transpose them); got dot operands of {jnp.dtype(dot_dtype)}"
        )
    if chunk % 64:
        raise ValueError(
            f"chunk_size: state_kernel='mosaic_gpu' needs a multiple of 64, got {chunk}"
        )
    if kp % 64:
        raise ValueError(
            f"k: state_kernel='mosaic_gpu' needs K padded to a multiple of 64, got padded K {kp}"
        )
    if (need := smem_bytes(chunk, kp, block_v, n_chunks, stages)) > _SMEM_LIMIT:
        raise ValueError(
            f"block_v: state_kernel='mosaic_gpu' at chunk {chunk}, padded K {kp}, block_v "
            f"{block_v}, {stages} stage(s) and {n_chunks} chunks needs {need // 1024} KiB of "
            "shared memory, over the H200's 227 KiB; use a smaller block_v"
        )


def _operand_transforms(block_v, dtype):
    """Tiling and swizzle of every wgmma operand tile: one swizzle for A and B (Mosaic GPU's
    wgmma takes a single one), the widest that the [*, block_v] tiles allow."""
    itemsize = jnp.dtype(dtype).itemsize
    swizzle = plgpu.find_swizzle(block_v * itemsize * 8)
    return (plgpu.TilingTransform((8, swizzle // itemsize)), plgpu.SwizzleTransform(swizzle))


def _chunk_end(vec, chunk):
    """[B, Tp, H] -> its value at each chunk's last step, [B, H, N]."""
    b, tp, h = vec.shape
    return jnp.moveaxis(vec.reshape(b, tp // chunk, chunk, h)[:, :, -1, :], 1, 2)


def state_fwd_mosaic(prep, s0, m0, *, chunk, block_v, stages=2, interpret=False):
    """Forward state recurrence on the Mosaic GPU backend.

    Same results as the Triton ``state.state_fwd_call``.

    Args:
      prep: the outputs of the preparation kernel (``ChunkPrep``: Uv, Y, Z, Kgs, Kgm, ...,
        A_t, b_t, U_t), on [B, Tp, H, *] arrays in the dot dtype (bfloat16).
      s0, m0: the entering states, [B, H, Kp, Vp].
      chunk: the chunk size, a multiple of 64 dividing Tp.
      block_v: the V-tile, dividing Vp.
      stages: 2 (prefetch the next chunk, double-buffered outputs) or 1 (single buffers, half
        the shared memory); see the module docstring.
      interpret: run JAX's GPU interpreter with its race detector.

    Returns:
      ``(vt, hs, hm, st, mt)``: vt [B, Tp, H, Vp] and the per-chunk entering states hs, hm
      [B, H, N*Kp, Vp] in bfloat16; the final states st, mt [B, H, Kp, Vp] float32.

    Raises:
      ValueError: where :func:`check_supported` refuses the settings.
    """
    uv, y, z, kgs, kgm, _, _, _, avec, bvec, uvec = prep
    b, tp, h, kp = y.shape
    vp = uv.shape[-1]
    n = tp // chunk
    dot = y.dtype
    check_supported(
        dot_dtype=dot, chunk=chunk, kp=kp, block_v=block_v, n_chunks=n, stages=stages
    )
    # (A_C, b_C, U_C, 0) per chunk: one 16-byte row, the smallest TMA transfer.
    ends = [_chunk_end(x, chunk) for x in (avec, bvec, uvec)]
    coef = jnp.stack(ends + [jnp.zeros_like(ends[0])], axis=-1)  # [B, H, N, 4]
    operand = _operand_transforms(block_v, dot)
    wgmma_layout = plgpu.Layout.WGMMA
    state_staging = (plgpu.SMEM((kp, block_v), _F32), plgpu.SMEM((kp, block_v), _F32))

    def matmul(a_ref, b_ref):
        """a @ b of two shared-memory operands, float32 accumulation, as a register array."""

        def run(acc):
            plgpu.wgmma(acc, a_ref, b_ref)
            return acc[...]

        return pl.run_scoped(run, plgpu.ACC((a_ref.shape[0], b_ref.shape[1]), _F32))

    def body(uv_g, y_g, z_g, kgs_g, kgm_g, coef_g, s0_g, m0_g, vt_g, hs_g, hm_g, st_g, mt_g,
             vt_buf, hs_buf, hm_buf, coef_smem, coef_bar):  # fmt: skip
        bi, hi, li = lax.axis_index("b"), lax.axis_index("h"), lax.axis_index("v")
        vsl = pl.ds(li * block_v, block_v)
        for lo in range(0, n, _TMA_ROWS):
            rows = pl.ds(lo, min(_TMA_ROWS, n - lo))
            plgpu.copy_gmem_to_smem(coef_g.at[bi, hi, rows], coef_smem.at[rows], coef_bar.at[0])
            plgpu.barrier_wait(coef_bar.at[0])

        def load_state(s_smem, m_smem, bars):
            plgpu.copy_gmem_to_smem(s0_g.at[bi, hi, :, vsl], s_smem, bars.at[0])
            plgpu.copy_gmem_to_smem(m0_g.at[bi, hi, :, vsl], m_smem, bars.at[1])
            plgpu.barrier_wait(bars.at[0])
            plgpu.barrier_wait(bars.at[1])
            return plgpu.load(s_smem, layout=wgmma_layout), plgpu.load(m_smem, layout=wgmma_layout)

        s, m = pl.run_scoped(load_state, *state_staging, plgpu.Barrier(num_barriers=2))

        def step(idx, uv_s, y_s, z_s, kgs_s, kgm_s, carry):
            s, m = carry
            (i,) = idx
            slot = lax.rem(i, stages)
            vt_s, hs_s, hm_s = vt_buf.at[slot], hs_buf.at[slot], hm_buf.at[slot]
            # Each step commits three stores (hs, hm, vt): at most 3 (stages - 1) pending means
            # the stores of step i - stages, which read this slot, are done.
            plgpu.wait_smem_to_gmem(3 * (stages - 1), wait_read_only=True)
            hs_s[...] = s.astype(dot)
            hm_s[...] = m.astype(dot)
            plgpu.commit_smem()  # the register writes, visible to wgmma and TMA
            plgpu.copy_smem_to_gmem(hs_s, hs_g.at[bi, hi, pl.ds(i * kp, kp), vsl])
            plgpu.copy_smem_to_gmem(hm_s, hm_g.at[bi, hi, pl.ds(i * kp, kp), vsl])
            vt = plgpu.load(uv_s, layout=wgmma_layout) + matmul(z_s, hm_s) - matmul(y_s, hs_s)
            vt_s[...] = vt.astype(dot)  # (11)
            plgpu.commit_smem()
            plgpu.copy_smem_to_gmem(vt_s, vt_g.at[bi, pl.ds(i * chunk, chunk), hi, vsl])
            a_c, b_c, u_c = coef_smem[i, 0], coef_smem[i, 1], coef_smem[i, 2]
            s_new = a_c * s - b_c * m + matmul(kgs_s.transpose((1, 0)), vt_s)  # (7)
            m_new = u_c * m - matmul(kgm_s.transpose((1, 0)), vt_s)  # (8)
            return s_new, m_new

        tile = lambda d, tr: plgpu.BlockSpec((chunk, d), lambda i: (i, 0), transforms=tr)
        pipeline = plgpu.emit_pipeline(
            step,
            grid=(n,),
            in_specs=[tile(block_v, ()), *[tile(kp, operand)] * 4],
            max_concurrent_steps=stages,
            init_carry=(s, m),
        )
        seq = lambda x_g: x_g.at[bi, :, hi, :]
        s, m = pipeline(uv_g.at[bi, :, hi, vsl], seq(y_g), seq(z_g), seq(kgs_g), seq(kgm_g))

        def store_state(s_smem, m_smem):
            s_smem[...] = s
            m_smem[...] = m
            plgpu.commit_smem()
            plgpu.copy_smem_to_gmem(s_smem, st_g.at[bi, hi, :, vsl])
            plgpu.copy_smem_to_gmem(m_smem, mt_g.at[bi, hi, :, vsl])
            plgpu.wait_smem_to_gmem(0)

        pl.run_scoped(store_state, *state_staging)

    out_type = like_varying([
        jax.ShapeDtypeStruct((b, tp, h, vp), dot),
        jax.ShapeDtypeStruct((b, h, n * kp, vp), dot),
        jax.ShapeDtypeStruct((b, h, n * kp, vp), dot),
        jax.ShapeDtypeStruct((b, h, kp, vp), _F32),
        jax.ShapeDtypeStruct((b, h, kp, vp), _F32),
    ], uv, y, z, kgs, kgm, coef, s0, m0)
    scratch = [
        plgpu.SMEM((stages, chunk, block_v), dot, transforms=operand),
        plgpu.SMEM((stages, kp, block_v), dot, transforms=operand),
        plgpu.SMEM((stages, kp, block_v), dot, transforms=operand),
        plgpu.SMEM((n, 4), _F32),
        plgpu.Barrier(num_barriers=1),
    ]
    return plgpu.kernel(
        body,
        out_type=out_type,
        scratch_types=scratch,
        grid=(b, h, vp // block_v),
        grid_names=("b", "h", "v"),
        interpret=plgpu.InterpretGPUParams(detect_races=True) if interpret else None,
        kernel_name="mdn_state_fwd_mosaic",
    )(uv, y, z, kgs, kgm, coef, s0, m0)
