"""The tuning candidates of the momentum delta rule Pallas kernels: ``(label, options)``, the
options being ``chunk_size`` and fields of ``MDNKernelConfig`` as keywords (the form
``mdn_probes.pallas_op`` takes), most informative first (a time budget may cut the tail).

The kernels' defaults come from XLA's offline compile for sm_90a (shared memory, registers,
spills; ``xla_aot``), not from GPU timings; ``tuning`` times these alternatives on a GPU and
``xla_aot --candidates`` checks offline that XLA compiles every one of them, so that none
wastes GPU time on a refused launch.

The state recurrences are latency-bound, so the candidates trade the V tile (programs in
flight) against warps and software pipelining; the backward's chunk-parallel half runs fused
(one kernel, more spills per thread) or split in two (fewer spills, one HBM round trip of the
contracted cotangents); the triangular inverse is solved by forward substitution or by a
Neumann product; the forward state recurrence runs in Pallas Triton or Pallas Mosaic GPU.
"""

_STATE_8W = (("mdn_state_fwd", 8, 1), ("mdn_state_bwd", 8, 1))
_MOSAIC = {"state_kernel": "mosaic_gpu", "block_v": 32}

MOSAIC_CANDIDATES = (
    # TMA-pipelined chunk tiles and wgmma with two pipeline slots: one block per SM against
    # two for Triton's state kernel
    ("mosaic state_fwd", _MOSAIC),
    # single buffers: two blocks per SM, no prefetch
    ("mosaic state_fwd 1 stage", _MOSAIC | {"launch": (("mdn_state_fwd_mosaic", 4, 1),)}),
)

TUNE_CANDIDATES = (
    ("default", {}),
    # T = (I + L)^{-1} by chained C x C matmuls instead of C - 1 dependent row updates (each
    # two cross-thread reductions); runs in mdn_prep and both backward kernels
    ("neumann inverse", {"inverse": "neumann"}),
    *MOSAIC_CANDIDATES,
    ("split backward", {"backward": "pallas_split"}),
    ("state 8 warps", {"launch": _STATE_8W}),
    ("block_v=16", {"block_v": 16}),
    ("state_fwd 8w/2 stages", {"launch": (("mdn_state_fwd", 8, 2), ("mdn_state_bwd", 8, 1))}),
    ("block_v=64, state 8 warps", {"block_v": 64, "launch": _STATE_8W}),
    ("chunk_bwd 4 warps", {"launch": (("mdn_chunk_bwd", 4, 1),)}),
    # C = 32: fewer spills in mdn_prep and mdn_chunk_bwd against twice the chunk states in HBM
    ("chunk_size=32", {"chunk_size": 32}),
)
