"""Tunables of the POET block-rotation Pallas kernels: ``PoetKernelConfig``.

It follows the kernel-config protocol of ``_common.KernelConfig``: a frozen (hashable)
dataclass, a static argument of the kernels (one compile per distinct config), validated in
``__post_init__``. ``PoetKernelConfig.default(block_size)`` (or ``for_shape`` of a config) fills
the tile sizes a field leaves ``None``: the largest power of two dividing ``b`` that is at most
64. The compiled (Triton) kernels need tiles that are powers of two of at least 16, so ``b`` a
multiple of 16; interpret mode takes any size. The defaults are untuned (no GPU clock has timed
them). ``interpret`` is a debugging and testing aid, not a tunable.
"""

from __future__ import annotations

import dataclasses

from jaxlib_ext.pallas_kernels._common import (
    check_interpret,
    check_positive_int,
    default_interpret,
)

__all__ = ["PoetKernelConfig", "pow2_tile"]


def pow2_tile(size: int, cap: int = 64) -> int:
    """Largest power of two dividing ``size`` and at most ``cap``.

    Args:
      size: the dimension to tile.
      cap: upper bound of the tile.

    Returns:
      The tile, a Python int ``>= 1``.
    """
    tile = 1
    while tile * 2 <= cap and size % (tile * 2) == 0:
        tile *= 2
    return tile


@dataclasses.dataclass(frozen=True)
class PoetKernelConfig:
    """Tile sizes and launch parameters of ``block_apply_pallas`` / ``block_gram_pallas``.

    Attributes:
      block_tokens: tokens per program (``block_apply``) and per loop step (``block_gram``);
        ``None``: 64.
      block_cols: output columns of a block per program, dividing the block size; ``None``:
        ``pow2_tile(b)``.
      block_k: contraction tile inside a block (``block_apply``) / rows of ``dG`` per program
        (``block_gram``), dividing the block size; ``None``: ``pow2_tile(b)``.
      num_warps, num_stages: Triton launch parameters.
      interpret: run the kernels in the Pallas interpreter; ``None``: when the default backend
        is not a GPU.
    """

    block_tokens: int | None = None
    block_cols: int | None = None
    block_k: int | None = None
    num_warps: int = 4
    num_stages: int = 2
    interpret: bool | None = None

    def __post_init__(self):
        for name in ("block_tokens", "block_cols", "block_k"):
            if getattr(self, name) is not None:
                check_positive_int(name, getattr(self, name))
        for name in ("num_warps", "num_stages"):
            check_positive_int(name, getattr(self, name))
        check_interpret(self.interpret)

    @classmethod
    def default(cls, block_size: int, **fields) -> PoetKernelConfig:
        """The config for blocks of ``block_size`` features, every field set; ``fields``
        override the defaults."""
        return cls(**fields).for_shape(block_size)

    def for_shape(self, block_size: int) -> PoetKernelConfig:
        """This config with every ``None`` field set to its default for ``block_size``.

        Raises:
          ValueError: ``block_cols`` or ``block_k`` does not divide ``block_size``.
        """
        tile = pow2_tile(block_size)
        config = dataclasses.replace(
            self,
            interpret=default_interpret() if self.interpret is None else self.interpret,
            block_tokens=self.block_tokens or 64,
            block_cols=self.block_cols or tile,
            block_k=self.block_k or tile,
        )
        for name in ("block_cols", "block_k"):
            if block_size % getattr(config, name):
                raise ValueError(
                    f"{name}: expected a divisor of the block size {block_size}, got "
                    f"{getattr(config, name)}"
                )
        return config
