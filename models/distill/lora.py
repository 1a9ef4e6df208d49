"""Low-rank adapters (LoRA, Hu et al. 2021, arXiv 2106.09685) for the student's MLPs in stage II.

``LoRALinear`` wraps a frozen ``nnx.Linear`` ``W [in, out]`` as ``y = x W + (alpha / r) x A B``
with ``A [in, r]`` drawn small and ``B [r, out] = 0`` (so the wrapped layer starts equal to the
original). Only ``lora_a`` and ``lora_b`` are :class:`LoRAParam`\\ s, which the stage II trainer
selects; :func:`merge_lora` folds them back into plain ``nnx.Linear`` layers.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

__all__ = ["LoRAParam", "LoRALinear", "add_lora_to_mlps", "merge_lora"]


class LoRAParam(nnx.Param):
    """A trainable low-rank adapter factor."""


class LoRALinear(nnx.Module):
    """``base(x) + (alpha / rank) * (x @ lora_a) @ lora_b``; ``base`` is kept as given.

    ``lora_a [in, rank]`` is drawn from ``N(0, 1/in)`` and ``lora_b [rank, out]`` starts at
    zero, so the wrapped layer starts equal to ``base``.

    Args:
      base: the frozen ``nnx.Linear``.
      rank: the adapter's rank ``r``, a positive int.
      alpha: the scale numerator; ``None`` means ``rank`` (scale 1).
      rngs: the keys of ``lora_a``.

    Raises:
      ValueError: if ``rank`` is not a positive int.

    References:
      Hu et al., LoRA: Low-Rank Adaptation of Large Language Models, arXiv 2106.09685.
    """

    def __init__(self, base: nnx.Linear, rank: int, *, alpha: float | None = None,
                 rngs: nnx.Rngs):
        if not isinstance(rank, int) or rank < 1:
            raise ValueError(f"rank must be a positive int, got {rank!r}")
        d_in, d_out = base.kernel[...].shape
        self.base = base
        self.scale = (alpha if alpha is not None else rank) / rank
        self.lora_a = LoRAParam(jax.random.normal(rngs.params(), (d_in, rank)) * d_in**-0.5)
        self.lora_b = LoRAParam(jnp.zeros((rank, d_out), jnp.float32))

    def __call__(self, x: jax.Array) -> jax.Array:
        """Applies the adapted layer to ``x [..., in]``; returns ``[..., out]``."""
        return self.base(x) + self.scale * ((x @ self.lora_a[...]) @ self.lora_b[...])

    def merged(self) -> nnx.Linear:
        """The plain ``nnx.Linear`` with ``W + (alpha/r) A B``."""
        out = nnx.clone(self.base)
        delta = self.scale * (self.lora_a[...] @ self.lora_b[...])
        out.kernel.set_value(self.base.kernel[...] + delta.astype(self.base.kernel[...].dtype))
        return out


_MLP_LINEARS = ("gate", "up", "down")


def add_lora_to_mlps(model, rank: int, *, alpha: float | None = None, rngs: nnx.Rngs) -> None:
    """Wraps ``gate``, ``up``, ``down`` of every ``block.mlp`` in :class:`LoRALinear`, in place.

    Layers already wrapped are left as they are.

    Args:
      model: a Llama :class:`~jaxlib_ext.models.LanguageModel` (SwiGLU MLPs).
      rank: the adapters' rank, a positive int.
      alpha: the scale numerator; ``None`` means ``rank``.
      rngs: the keys of the adapters' ``lora_a``.
    """
    for block in model.blocks:
        for name in _MLP_LINEARS:
            lin = getattr(block.mlp, name)
            if not isinstance(lin, LoRALinear):
                setattr(block.mlp, name, LoRALinear(lin, rank, alpha=alpha, rngs=rngs))


def merge_lora(model) -> None:
    """Replaces every :class:`LoRALinear` in the blocks' MLPs by its merged ``nnx.Linear``, in
    place.

    Args:
      model: a :class:`~jaxlib_ext.models.LanguageModel` of :func:`add_lora_to_mlps`.
    """
    for block in model.blocks:
        for name in _MLP_LINEARS:
            lin = getattr(block.mlp, name)
            if isinstance(lin, LoRALinear):
                setattr(block.mlp, name, lin.merged())
