"""Tunables of the momentum delta rule's Pallas path: ``MDNKernelConfig`` and the launch table.

``MDNKernelConfig`` follows the kernel-config protocol of ``_common.KernelConfig``: a frozen
(hashable) dataclass, a static argument of ``momentum_delta_rule_pallas`` (one compile per
distinct config), validated in ``__post_init__``. ``MDNKernelConfig.default(K, V)`` gives the
default for a head size; fields left ``None`` are filled by it (``for_shape``). ``interpret``
and ``poison_outputs`` are debugging and testing aids, not tunables.

``LAUNCH`` holds ``(num_warps, num_stages)`` per kernel on Hopper (padded K <= 128),
``LAUNCH_WIDE_K`` the entries that differ beyond, and ``MAX_REGISTERS`` the ``.maxnreg`` bound
the chunk-parallel backward kernels take below chunk size ``REGISTER_BOUND_BELOW_CHUNK``
(``pallas_kernels/_registers.py``). They come from XLA's compile of the kernels for an H200
(shared memory within 227 KiB per block, register spills avoided where possible); BENCHMARKS.md
has the figures.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from jaxlib_ext.pallas_kernels._common import check_interpret, default_interpret, pow2

__all__ = [
    "BACKWARDS",
    "INVERSES",
    "KERNELS",
    "LAUNCH",
    "LAUNCH_WIDE_K",
    "MAX_REGISTERS",
    "MOSAIC_KERNELS",
    "MDNKernelConfig",
    "STATE_KERNELS",
    "default_backward",
    "default_block_v",
    "launch_params",
    "register_bound",
]

BACKWARDS = ("pallas", "pallas_split", "xla")
INVERSES = ("substitution", "neumann")
STATE_KERNELS = ("triton", "mosaic_gpu")

# (num_warps, num_stages) per kernel, padded K <= 128.
LAUNCH: dict[str, tuple[int, int]] = {
    "mdn_prep": (8, 1),
    "mdn_state_fwd": (4, 1),  # two programs per SM
    "mdn_out": (4, 1),
    "mdn_state_bwd": (4, 1),  # two stages exceed 227 KiB
    "mdn_chunk_bwd": (8, 1),
    "mdn_chunk_bwd_v": (8, 1),
    "mdn_prep_bwd": (8, 1),
    "mdn_step": (4, 1),
    "mdn_state_fwd_mosaic": (4, 2),  # one warpgroup; stages: slots of its TMA pipeline
}
# Entries that differ for padded K > 128.
LAUNCH_WIDE_K: dict[str, tuple[int, int]] = {
    "mdn_state_fwd": (8, 1),
    "mdn_state_bwd": (8, 1),
}
# ``.maxnreg`` bound below chunk size REGISTER_BOUND_BELOW_CHUNK (without it ptxas at -O3 gave
# these kernels 32 registers there and spilled tens of KB per thread).
MAX_REGISTERS: dict[str, int] = {
    "mdn_chunk_bwd": 255,
    "mdn_chunk_bwd_v": 255,
    "mdn_prep_bwd": 255,
}
REGISTER_BOUND_BELOW_CHUNK = 64

# The Pallas Triton kernels of the sequence op (forward and backward) and the Mosaic GPU one.
KERNELS = (
    "mdn_prep",
    "mdn_state_fwd",
    "mdn_out",
    "mdn_state_bwd",
    "mdn_chunk_bwd",
    "mdn_chunk_bwd_v",
    "mdn_prep_bwd",
)
MOSAIC_KERNELS = ("mdn_state_fwd_mosaic",)


def default_block_v(kp: int) -> int:
    """V-tile of the sequence kernels for a padded K.

    The two float32 [K, block_v] states and the dot operands stay in registers.

    Args:
      kp: the padded K.

    Returns:
      64 for ``kp <= 64``, 32 for ``kp <= 128``, else 16.
    """
    return 64 if kp <= 64 else 32 if kp <= 128 else 16


def default_backward(kp: int) -> str:
    """The chunk-parallel backward for a padded K.

    The fused one up to padded K = 128; beyond, the split one, whose two kernels each need less
    shared memory.

    Args:
      kp: the padded K.

    Returns:
      ``"pallas"`` for ``kp <= 128``, else ``"pallas_split"``.
    """
    return "pallas" if kp <= 128 else "pallas_split"


def launch_params(name: str, kp: int, launch=()) -> tuple[int, int]:
    """``(num_warps, num_stages)`` of a kernel.

    Args:
      name: the kernel name, one of ``KERNELS`` or ``MOSAIC_KERNELS``.
      kp: the padded K; above 128 ``LAUNCH_WIDE_K`` takes precedence over ``LAUNCH``.
      launch: entries ``(name, warps, stages)`` that override the tables.

    Returns:
      ``(num_warps, num_stages)``.
    """
    for kernel, warps, stages in launch:
        if kernel == name:
            return warps, stages
    if kp > 128 and name in LAUNCH_WIDE_K:
        return LAUNCH_WIDE_K[name]
    return LAUNCH[name]


def register_bound(name: str, chunk: int | None) -> int | None:
    """The ``.maxnreg`` bound of a kernel at a chunk size.

    Args:
      name: the kernel name.
      chunk: the chunk size, or ``None``.

    Returns:
      ``MAX_REGISTERS[name]`` below chunk size ``REGISTER_BOUND_BELOW_CHUNK``, else ``None``
      (ptxas chooses).
    """
    if chunk is not None and chunk < REGISTER_BOUND_BELOW_CHUNK:
        return MAX_REGISTERS.get(name)
    return None


def _launch_entries(launch) -> tuple[tuple[str, int, int], ...]:
    """``launch`` as a tuple of ``(kernel, num_warps, num_stages)``; a mapping
    ``{kernel: (num_warps, num_stages)}`` is accepted too."""
    if isinstance(launch, Mapping):
        launch = tuple((name, *params) for name, params in launch.items())
    out = []
    for entry in launch:
        if (
            not isinstance(entry, tuple | list)
            or len(entry) != 3
            or entry[0] not in KERNELS + MOSAIC_KERNELS
            or not all(isinstance(x, int) and not isinstance(x, bool) and x >= 1 for x in entry[1:])
            or (entry[0] in MOSAIC_KERNELS and entry[1] != 4)
        ):
            raise ValueError(
                "launch: expected ((kernel_name, num_warps, num_stages), ...) with kernel_name "
                f"in {KERNELS + MOSAIC_KERNELS} and positive ints (num_warps 4 for "
                f"{MOSAIC_KERNELS[0]}), got entry {entry!r}"
            )
        out.append((entry[0], int(entry[1]), int(entry[2])))
    return tuple(out)


@dataclasses.dataclass(frozen=True)
class MDNKernelConfig:
    """How ``momentum_delta_rule_pallas`` runs; no field changes the mathematics.

    Attributes:
      block_v: V-tile of the state kernels, a power of two >= 16 dividing the padded V;
        ``None``: ``default_block_v`` of the padded K, capped at the padded V.
      backward: the chunk-parallel half of the backward: ``"pallas"``, one fused kernel
        (mdn_chunk_bwd); ``"pallas_split"``, two kernels (mdn_chunk_bwd_v, then mdn_prep_bwd)
        with the contracted cotangents passing through HBM; ``"xla"``, XLA einsums and
        ``jax.vjp`` of the XLA mirror of the preparation. ``None``: ``default_backward``.
      inverse: the in-kernel unit-lower-triangular inverse of equation (9): ``"substitution"``
        (forward substitution, C - 1 dependent row updates) or ``"neumann"`` (the nilpotent
        Neumann series in product form, 2 log2(C) - 2 chained C x C matmuls in float32-grade
        precision). Both agree to float32 rounding.
      state_kernel: the forward state recurrence (mdn_state_fwd) in ``"triton"`` or
        ``"mosaic_gpu"`` (``mosaic.py``: Hopper, bfloat16 inputs, chunk a multiple of 64, padded
        K a multiple of 64, tiles within shared memory; a ValueError otherwise). The backward is
        Triton either way.
      launch: ``((kernel_name, num_warps, num_stages), ...)`` or ``{kernel_name: (num_warps,
        num_stages)}`` overriding ``LAUNCH`` (for tuning on a GPU). No effect in interpret mode,
        but for ``mdn_state_fwd_mosaic`` (4 warps; 2 stages, or 1: the slots of its pipeline).
      interpret: run the kernels in the Pallas interpreter (the only way on a CPU); ``None``:
        where the default backend is not a GPU (what the public ops pass).
      poison_outputs: testing aid: every kernel output buffer starts as NaN, so an element a
        kernel never writes shows.
    """

    block_v: int | None = None
    backward: str | None = None
    inverse: str = "substitution"
    state_kernel: str = "triton"
    launch: tuple = ()
    interpret: bool | None = False
    poison_outputs: bool = False

    def __post_init__(self):
        bv = self.block_v
        if bv is not None and (
            isinstance(bv, bool) or not isinstance(bv, int) or bv < 16 or bv & (bv - 1)
        ):
            raise ValueError(f"block_v: expected None or a power of two >= 16, got {bv!r}")
        if self.backward is not None and self.backward not in BACKWARDS:
            raise ValueError(
                f"backward: expected None or one of {BACKWARDS}, got {self.backward!r}"
            )
        if self.inverse not in INVERSES:
            raise ValueError(f"inverse: expected one of {INVERSES}, got {self.inverse!r}")
        if self.state_kernel not in STATE_KERNELS:
            raise ValueError(
                f"state_kernel: expected one of {STATE_KERNELS}, got {self.state_kernel!r}"
            )
        object.__setattr__(self, "launch", _launch_entries(self.launch))
        check_interpret(self.interpret)
        if not isinstance(self.poison_outputs, bool):
            raise ValueError(f"poison_outputs: expected a bool, got {self.poison_outputs!r}")

    @classmethod
    def default(cls, K: int, V: int, **fields) -> MDNKernelConfig:
        """The config for head sizes ``K`` and ``V`` (unpadded), every field set; ``fields``
        override (a ``None`` keeps the default; ``interpret=None`` becomes
        ``_common.default_interpret()``)."""
        kp, vp = pow2(K), pow2(V)
        defaults = dict(block_v=min(vp, default_block_v(kp)), backward=default_backward(kp))
        given = {name: value for name, value in fields.items() if value is not None}
        if "interpret" in fields and fields["interpret"] is None:
            given["interpret"] = default_interpret()
        return cls(**{**defaults, **given})

    def for_shape(self, K: int, V: int) -> MDNKernelConfig:
        """This config with its ``None`` fields set to the defaults for ``K`` and ``V``."""
        return MDNKernelConfig.default(K, V, **dataclasses.asdict(self))
