"""Tunables of the grouped-matmul Pallas kernels: ``GMMKernelConfig``.

A frozen (hashable) dataclass, a static argument of ``gmm_pallas`` / ``tgmm_pallas``: one
compile per distinct config. The defaults are a plain Hopper-sized starting point (64 x 64
output tiles, 32-deep contraction steps, 4 warps, 2 pipeline stages); they are not tuned
against a GPU clock. ``interpret`` is a debugging and testing aid, not a tunable.
"""

from __future__ import annotations

import dataclasses

__all__ = ["GMMKernelConfig", "KERNELS", "pow2"]

# The Pallas Triton kernels of the op: the grouped matmul (forward and input gradient) and the
# transposed grouped matmul (weight gradient).
KERNELS = ("moe_gmm", "moe_tgmm")


def pow2(n: int, minimum: int = 16) -> int:
    """The next power of two of ``n``, at least ``minimum`` (Triton block dimensions)."""
    return max(minimum, 1 << (int(n) - 1).bit_length())


def _check_block(name: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 16 or value & (value - 1):
        raise ValueError(f"{name} must be a power of two >= 16, got {value!r}")


@dataclasses.dataclass(frozen=True)
class GMMKernelConfig:
    """Tile sizes and launch parameters of the grouped-matmul kernels.

    Attributes:
      block_m: rows per tile of the ragged (token) axis ``M``; group boundaries fall inside
        tiles, and a tile shared by ``j`` groups is visited ``j`` times (once per group).
      block_n: output columns per program.
      block_k: depth of one contraction step (the loop over ``K`` inside a program).
      num_warps, num_stages: Triton launch parameters of both kernels.
      interpret: run the kernels in the Pallas interpreter (CPU tests).

    ``block_n`` and ``block_k`` shrink to the padded operand sizes when those are smaller, so a
    small problem is not padded up to a large tile.
    """

    block_m: int = 64
    block_n: int = 64
    block_k: int = 32
    num_warps: int = 4
    num_stages: int = 2
    interpret: bool = False

    def __post_init__(self):
        for name in ("block_m", "block_n", "block_k"):
            _check_block(name, getattr(self, name))
        for name in ("num_warps", "num_stages"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")

    def blocks(self, k: int, n: int) -> tuple[int, int, int]:
        """``(block_m, block_k, block_n)`` for contraction size ``k`` and output width ``n``."""
        return self.block_m, min(self.block_k, pow2(k)), min(self.block_n, pow2(n))
