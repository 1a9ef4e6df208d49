"""How the momentum delta rule's Pallas Triton kernels launch on Hopper: the V-tile, which
backward variant, warps, pipeline stages and register bound per kernel, and the
``pallas_call`` wrapper that can poison every output buffer (a testing aid).

Every default here comes from XLA's own compile of the programs for an H200 without a GPU
(``benchmarks/xla_aot.py``: jaxlib's Triton, then ptxas), not from GPU timings;
``benchmarks/mdn_gpu.py --tune`` times the alternatives on a GPU.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from jaxlib_ext.pallas_kernels._registers import max_registers

_F32 = jnp.float32


def _default_block_v(kp: int) -> int:
    """V-tile of the sequence kernels for a padded K: two float32 [K, block_v] states plus the
    dot operands fit 8 warps' registers (K = 128: 32 has no spills, 64 spills; see
    ``_launch_params``)."""
    return 64 if kp <= 64 else 32 if kp <= 128 else 16


def _default_backward(kp: int) -> str:
    """Fused chunk-parallel backward up to padded K = 128, split beyond. Offline compile for
    sm_90a (pip Triton 3.9), shared KiB / spill bytes per thread, fused vs the split's two
    kernels (mdn_chunk_bwd_v, mdn_prep_bwd):

    ======================  ==================  ===============================
    case                    fused               split
    ======================  ==================  ===============================
    K=128 V=256 bf16, C=64  112 / 3112          48 / 320, 80 / 3608
    K=256 V=256 bf16, C=64  208 / 6640          64 / 2864, 144 / 6516
    K=256 V=256 f32, C=32   196 / 125040        16 / 1496, 64 / 129068
    ======================  ==================  ===============================

    The split costs a round trip of the contracted cotangents through HBM (float32: four
    [C, K], two [C, C] and five [C] tiles per chunk; about 1 GB at B=8 T=4096 H=6 K=128) and
    did not reduce the spills (they came from the reverse of the preparation, which both
    variants run), so at K <= 128 the fused kernel is the default; at K = 256 the fused
    kernel comes within 12% of the 227 KiB limit, so the split is the safe default there.
    XLA's own compile (``benchmarks/xla_aot.py``, jaxlib 0.11.2) gives the same picture:
    K=128 fused 104 / 4080, split 40 / 612 and 88 / 4604; K=256 fused 200 / 10336, split
    64 / 3370 and 168 / 9480. Since p is reloaded in the reverse of the preparation (session
    6): K=128 fused 88 / 3928, split 40 / 612 and 72 / 4616; K=256 bf16 fused 168 / 9350, split
    64 / 3370 and 136 / 9656; but K=256 float32 (C=32) fused still 200 KiB, so the split stays
    the default beyond K=128. Since the V loops sum bare products and the reverse reloads
    what it reads late (session 7; ``xla_aot.py``'s SASS columns, per thread, loops weighted
    by trip count, jaxlib 0.11.2): K=128 fused 31.8 K instructions and 12.2 KB of spill
    traffic, split 6.5 K + 32.4 K and 1.7 + 5.1 KB; K=256 fused 49.3 K and 63.1 KB, split
    17.3 K + 36.9 K and 41.4 + 12.2 KB. The split now spills half as much at K=128, against
    more instructions and its HBM round trip: no offline figure settles it, so the default
    stays; ``benchmarks/mdn_gpu.py --tune`` times both on a GPU.
    """
    return "pallas" if kp <= 128 else "pallas_split"


def _launch_params(name: str, kp: int, launch=()) -> tuple[int, int]:
    """(num_warps, num_stages) of each kernel on Hopper, chosen from XLA's own compile for an
    H200 (``benchmarks/xla_aot.py --sweep``: jaxlib 0.11.2's Triton, ptxas 13.0, no GPU), not
    from GPU timings (none yet; ``benchmarks/mdn_gpu.py --tune`` times alternatives).
    ``launch`` entries ``(name, warps, stages)`` override these.

    Constraints: at most 227 KB of shared memory per block (XLA refuses to compile more), no
    register spills where avoidable, and for the latency-bound sequential state kernels as
    many programs resident per SM as registers allow. At B=8 T=4096 H=6 K=128 V=256 bfloat16,
    block_v 32 (shared KB / registers / spill-store bytes per thread):

    ===============  ===========  ====================================================
    kernel           chosen       measured, and why
    ===============  ===========  ====================================================
    mdn_prep         8 w, 1 st    64 / 255 / 272; 4 warps spill 3.8 KB
    mdn_state_fwd    4 w, 1 st    32 / 236 / 0: two programs per SM (8 warps: 172
                                  registers, but one 256-thread program per SM)
    mdn_out          4 w, 1 st    24 / 78 / 0; no loop to pipeline
    mdn_state_bwd    4 w, 1 st    36 / 209 / 0; 2 stages need 232 KB: XLA refuses
    mdn_chunk_bwd    8 w, 1 st    88 / 255 / 4284: some 20 C x C and C x K float32 tiles
                                  are live at once; the weakest kernel (4 warps: 9.5 KB
                                  spills, 2 or 3 stages: more; session 6: 3928)
    mdn_chunk_bwd_v  8 w, 1 st    40 / 255 / 436 (4 warps: 3.4 KB spills; before: 612)
    mdn_prep_bwd     8 w, 1 st    72 / 255 / 2228 (4 warps: 8.8 KB spills; before: 4616)
    mdn_step         4 w, 1 st    1 / 254 / 0
    ===============  ===========  ====================================================

    (Session 7's backward restructure changed these static counts; its dynamic figures, with
    loops weighted by trip count, are in ``_default_backward``. The 4-warp figures predate it.)

    16 warps cap registers at 128 per thread: mdn_chunk_bwd then spills 4.7 KB per thread,
    2.4 MB per program against 0.9 MB at 8 warps (jaxlib 0.12.0.1), and likewise the others.

    K = 256 (block_v 16): the state kernels take 8 warps (254 and 232 registers, no spills);
    the fused mdn_chunk_bwd needs 200 KB, near the limit, and spills 10 KB; the split
    backward's two kernels need 64 and 168 KB (3.4 and 9.5 KB of spills), hence the split
    there (``_default_backward``). Float32 inputs (3xTF32 dots, chunks capped at 32 for
    K > 64) fit too, with spills (performance is not a target).

    ptxas caveat: without a register bound in the PTX (Triton emits only ``.reqntid``; Pallas
    cannot pass Triton's ``maxnreg``), ptxas at -O3 sometimes settles on 32 registers and
    spills tens of KB per thread. In XLA's compile this hits the float32 backward kernels at
    C = 32 (mdn_chunk_bwd_v and mdn_prep_bwd; mdn_chunk_bwd too with jaxlib 0.11.2). The same
    PTX with ``.maxnreg 255`` or ``.minnctapersm 1``, or at ptxas -O1, gets 255 registers and
    a tenth of the spills. No bf16 kernel at C = 64 is affected. Since session 7 those kernels
    carry the bound themselves (``_max_registers``).

    ``mdn_state_fwd_mosaic`` (``state_kernel="mosaic_gpu"``) is one warpgroup (4 warps) and
    its stages are the slots of its TMA pipeline and output buffers: 2 by default, 1 for two
    blocks per SM (``mosaic.py``).
    """
    for kernel, warps, stages in launch:  # caller's overrides, e.g. from a tuning run
        if kernel == name:
            return warps, stages
    if name == "mdn_state_fwd_mosaic":
        return 4, 2
    if name in ("mdn_state_fwd", "mdn_state_bwd"):
        return (4, 1) if kp <= 128 else (8, 1)
    return {"mdn_out": (4, 1), "mdn_step": (4, 1)}.get(name, (8, 1))


def _max_registers(name: str, chunk: int | None) -> int | None:
    """A ``.maxnreg`` bound for the kernel (``pallas_kernels/_registers.py``), or None to
    leave ptxas its own choice.

    Without a bound ptxas at -O3 gives some kernels 32 (or 128) registers and spills tens of
    KB per thread. In XLA's compile for an H200 (jaxlib 0.11.2, B=8 T=4096 H=6 K=128 V=256)
    that happened to the chunk-parallel backward kernels at C = 32 and to no kernel at C = 64:
    float32 (C = 32 there): mdn_chunk_bwd, mdn_chunk_bwd_v and mdn_prep_bwd all at 32
    registers; bfloat16 at C = 32: mdn_prep_bwd at 32, later 128. With ``.maxnreg 255`` each
    gets 255; spill traffic per thread, loops weighted by trip count (mdn_chunk_bwd,
    mdn_chunk_bwd_v, mdn_prep_bwd), before session 7 and now (with the V loops of
    ``kernel._contract_over_v`` as chosen by chunk size): float32 290, 184, 151 KB to 67, 26,
    31 KB; bfloat16 C = 32 8.2, 0.6, 41 KB to 6.0, 0.0, 6.6 KB. At C = 64 the bound changes
    little and not for the better (bfloat16 mdn_chunk_bwd 12.5 to 13.7 KB), so it is left off
    there."""
    if chunk is not None and chunk < 64 and name in _CHUNK_BWD_KERNELS:
        return 255
    return None


_CHUNK_BWD_KERNELS = ("mdn_chunk_bwd", "mdn_chunk_bwd_v", "mdn_prep_bwd")


class _Run(NamedTuple):
    """How every kernel of one call runs: ``interpret`` (Pallas interpreter), ``poison``
    (outputs start as NaN, a testing aid) and the ``launch`` overrides of ``_launch_params``."""

    interpret: bool
    poison: bool
    launch: tuple = ()


def _launch(kernel, args, in_specs, out_specs, out_shape, *, grid, name, kp, run, chunk=None):
    """pallas_call; with ``run.poison`` every output buffer starts as NaN (aliased input), so
    an element the kernel never writes stays NaN and a test can see it. ``kp``: the padded K;
    ``chunk``: the chunk size, for ``_max_registers``."""
    interpret, poison = run.interpret, run.poison
    warps, stages = _launch_params(name, kp, run.launch)
    compiler_params = plgpu.CompilerParams(num_warps=warps, num_stages=stages)
    if not interpret and (registers := _max_registers(name, chunk)) is not None:
        kernel = _bounded(kernel, registers)
    if not poison:
        return pl.pallas_call(
            kernel,
            out_shape=out_shape,
            grid=grid,
            in_specs=in_specs,
            out_specs=out_specs,
            compiler_params=compiler_params,
            interpret=interpret,
            name=name,
        )(*args)
    n_in, n_out = len(args), len(out_shape)
    bufs = [jnp.full(s.shape, jnp.nan, s.dtype) for s in out_shape]

    def poisoned(*refs):
        kernel(*refs[:n_in], *refs[n_in + n_out :])

    return pl.pallas_call(
        poisoned,
        out_shape=out_shape,
        grid=grid,
        in_specs=list(in_specs) + list(out_specs),
        out_specs=out_specs,
        input_output_aliases={n_in + i: i for i in range(n_out)},
        compiler_params=compiler_params,
        interpret=interpret,
        name=name,
    )(*args, *bufs)


def _bounded(kernel, registers):
    def bounded(*refs):
        max_registers(registers)
        kernel(*refs)

    return bounded


_KERNELS = (
    "mdn_prep",
    "mdn_state_fwd",
    "mdn_out",
    "mdn_state_bwd",
    "mdn_chunk_bwd",
    "mdn_chunk_bwd_v",
    "mdn_prep_bwd",
)
_MOSAIC_KERNELS = ("mdn_state_fwd_mosaic",)  # one warpgroup: num_warps must be 4


def _check_launch(launch):
    """Validate the ``launch`` overrides; returns them as a hashable tuple of triples."""
    out = []
    for entry in launch:
        if (
            not isinstance(entry, tuple | list)
            or len(entry) != 3
            or entry[0] not in _KERNELS + _MOSAIC_KERNELS
            or not all(isinstance(x, int) and x >= 1 for x in entry[1:])
            or (entry[0] in _MOSAIC_KERNELS and entry[1] != 4)
        ):
            raise ValueError(
                "launch: expected ((kernel_name, num_warps, num_stages), ...) with kernel_name "
                f"in {_KERNELS + _MOSAIC_KERNELS} and positive ints (num_warps 4 for "
                f"{_MOSAIC_KERNELS[0]}), got entry {entry!r}"
            )
        out.append((entry[0], int(entry[1]), int(entry[2])))
    return tuple(out)


def _sds(shape, dtype=_F32):
    return jax.ShapeDtypeStruct(shape, dtype)
