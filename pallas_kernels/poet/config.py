"""Tunables of the POET block-rotation Pallas kernels: ``PoetKernelConfig``.

A frozen (hashable) dataclass, a static argument of the kernels: one compile per distinct
config. ``PoetKernelConfig.default(block_size)`` fills the tile sizes a field leaves ``None``:
the largest power of two dividing ``b`` that is at most 64. The compiled (Triton) kernels need
tiles that are powers of two of at least 16, so ``b`` a multiple of 16; interpret mode takes any
size. The defaults are untuned (no GPU clock has timed them). ``interpret`` is a debugging and
testing aid, not a tunable.
"""

from __future__ import annotations

import dataclasses

__all__ = ["PoetKernelConfig", "pow2_tile"]


def pow2_tile(size: int, cap: int = 64) -> int:
    """Largest power of two dividing ``size`` and at most ``cap``."""
    tile = 1
    while tile * 2 <= cap and size % (tile * 2) == 0:
        tile *= 2
    return tile


@dataclasses.dataclass(frozen=True)
class PoetKernelConfig:
    """Tile sizes and launch parameters of ``block_apply_pallas`` / ``block_gram_pallas``.

    Attributes:
      block_tokens: tokens per program (``block_apply``) and per loop step (``block_gram``).
      block_cols: output columns of a block per program.
      block_k: contraction tile inside a block (``block_apply``) / rows of ``dG`` per program
        (``block_gram``).
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

    def resolved(self, block_size: int) -> PoetKernelConfig:
        """This config with every ``None`` field set to its default for ``block_size``."""
        import jax

        tile = pow2_tile(block_size)
        interpret = self.interpret
        if interpret is None:
            interpret = jax.default_backend() != "gpu"
        return dataclasses.replace(
            self,
            interpret=interpret,
            block_tokens=self.block_tokens or 64,
            block_cols=self.block_cols or tile,
            block_k=self.block_k or tile,
        )

    @classmethod
    def default(cls, block_size: int, *, interpret: bool | None = None) -> PoetKernelConfig:
        return cls(interpret=interpret).resolved(block_size)
