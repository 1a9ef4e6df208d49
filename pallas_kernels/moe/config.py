"""Tunables of the grouped-matmul Pallas kernels: ``GMMKernelConfig``.

It follows the kernel-config protocol of ``_common.KernelConfig``: a frozen (hashable)
dataclass, a static argument of ``gmm_pallas`` / ``tgmm_pallas`` (one compile per distinct
config), validated in ``__post_init__``, with ``GMMKernelConfig.default(k, n)`` the config for
contraction size ``k`` and output width ``n``. The defaults are a plain Hopper-sized starting
point (64 x 64 output tiles, 32-deep contraction steps, 4 warps, 2 pipeline stages); they are
not tuned against a GPU clock. ``interpret`` is a debugging and testing aid, not a tunable.
"""

from __future__ import annotations

import dataclasses

from jaxlib_ext.pallas_kernels._common import (
    check_interpret,
    check_positive_int,
    default_interpret,
    pow2,
)

__all__ = ["GMMKernelConfig", "KERNELS"]

# The Pallas Triton kernels of the op: the grouped matmul (forward and input gradient) and the
# transposed grouped matmul (weight gradient).
KERNELS = ("moe_gmm", "moe_tgmm")


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
      interpret: run the kernels in the Pallas interpreter (CPU tests); ``None``: where the
        default backend is not a GPU (what the public ops pass).

    ``block_n`` and ``block_k`` shrink to the padded operand sizes when those are smaller
    (:meth:`for_shape`), so a small problem is not padded up to a large tile.
    """

    block_m: int = 64
    block_n: int = 64
    block_k: int = 32
    num_warps: int = 4
    num_stages: int = 2
    interpret: bool | None = False

    def __post_init__(self):
        for name in ("block_m", "block_n", "block_k"):
            _check_block(name, getattr(self, name))
        for name in ("num_warps", "num_stages"):
            check_positive_int(name, getattr(self, name))
        check_interpret(self.interpret)

    @classmethod
    def default(cls, k: int, n: int, **fields) -> GMMKernelConfig:
        """The config for contraction size ``k`` and output width ``n``, every field set;
        ``fields`` override the defaults (``interpret=None``: ``_common.default_interpret()``)."""
        return cls(**fields).for_shape(k, n)

    def for_shape(self, k: int, n: int) -> GMMKernelConfig:
        """This config for contraction size ``k`` and output width ``n``: ``block_k`` and
        ``block_n`` shrunk to the padded sizes where those are smaller, ``interpret`` set."""
        interpret = default_interpret() if self.interpret is None else self.interpret
        return dataclasses.replace(
            self, block_k=min(self.block_k, pow2(k)), block_n=min(self.block_n, pow2(n)),
            interpret=interpret,
        )  # fmt: skip
