"""Building blocks shared by every language model in ``jaxlib_ext.models``.

Each block is a thin Flax NNX module over a pure function, and every parameter carries
``logical_axes`` metadata that :mod:`jaxlib_ext.core.sharding` maps onto mesh axes.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import jax
import jax.numpy as jnp
from flax import nnx

__all__ = [
    "RMSNorm",
    "SwiGLU",
    "Embedding",
    "LMHead",
    "rms_norm",
    "swiglu_hidden_size",
    "apply_rope",
    "ROPE_CONVENTIONS",
    "SwiGLUConfig",
    "dense_init",
]

#: RoPE pair layouts: ``"half"`` pairs ``(x[i], x[i + D/2])`` (GPT-NeoX, Hugging Face),
#: ``"interleaved"`` pairs ``(x[2i], x[2i+1])`` (GPT-J, Meta's code, llama.cpp).
ROPE_CONVENTIONS = ("half", "interleaved")

dense_init = nnx.initializers.normal(stddev=0.02)


def rms_norm(x: jax.Array, scale: jax.Array, eps: float = 1e-6) -> jax.Array:
    """Root-mean-square normalisation, ``x / sqrt(mean(x**2) + eps) * scale``.

    Args:
      x: ``[..., D]`` inputs, normalised over the last axis.
      scale: ``[D]`` (or broadcastable) learned scale.
      eps: added to the mean square.

    Returns:
      An array of ``x``'s shape and dtype, computed in float32.

    References:
      Zhang & Sennrich, Root Mean Square Layer Normalization, arXiv 1910.07467.
    """
    x32 = x.astype(jnp.float32)
    y = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)
    return (y * scale).astype(x.dtype)


class RMSNorm(nnx.Module):
    """Root-mean-square layer norm (Zhang & Sennrich 2019) with a learned scale.

    Args:
      dim: the normalised width ``D``; the scale is ``float32[D]``, initialised to ones.
      eps: added to the mean square.
      logical_axis: the scale's logical axis name for sharding.

    References:
      Zhang & Sennrich, Root Mean Square Layer Normalization, arXiv 1910.07467.
    """

    def __init__(self, dim: int, *, eps: float = 1e-6, logical_axis: str | None = "norm"):
        self.eps = eps
        self.scale = nnx.Param(jnp.ones((dim,), jnp.float32), logical_axes=(logical_axis,))

    def __call__(self, x: jax.Array) -> jax.Array:
        """Normalises ``x [..., D]`` (:func:`rms_norm`); returns ``x``'s shape and dtype."""
        return rms_norm(x, self.scale[...], self.eps)


def swiglu_hidden_size(d_model: int, ratio: float = 4.0, multiple_of: int = 256) -> int:
    """LLaMA-style SwiGLU width: ``multiple_of * ceil(ratio * d * 2/3 / multiple_of)``.

    Args:
      d_model: the model width ``d``.
      ratio: the width of the ungated MLP that the SwiGLU matches, in units of ``d``.
      multiple_of: the width is rounded up to a multiple of this.

    Returns:
      The hidden width, an int.

    References:
      Touvron et al., LLaMA: Open and Efficient Foundation Language Models, arXiv 2302.13971.
    """
    hidden = int(ratio * d_model * 2 / 3)
    return multiple_of * ((hidden + multiple_of - 1) // multiple_of)


@dataclasses.dataclass(frozen=True)
class SwiGLUConfig:
    """The SwiGLU feed-forward part of a language-model block.

    Attributes:
      kind: the registry name, ``"swiglu"``.
      hidden: the hidden width, a positive int; ``None`` means
        ``swiglu_hidden_size(d_model, 4, multiple_of)``.
      multiple_of: the rounding of the default width, a positive int (default 32).

    Raises:
      ValueError: if ``hidden`` or ``multiple_of`` is not a positive int.
    """

    kind: ClassVar[str] = "swiglu"
    hidden: int | None = None
    multiple_of: int = 32

    def __post_init__(self):
        for name in ("hidden", "multiple_of"):
            value = getattr(self, name)
            if value is None and name == "hidden":
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"SwiGLUConfig.{name} must be a positive int, got {value!r}")

    def width(self, d_model: int) -> int:
        """The hidden width for a model of width ``d_model``.

        Args:
          d_model: the model width.

        Returns:
          ``hidden``, or the LLaMA width for ``d_model`` when ``hidden`` is ``None``.
        """
        return self.hidden or swiglu_hidden_size(d_model, 4.0, self.multiple_of)


class SwiGLU(nnx.Module):
    """Gated MLP ``W_down (silu(W_gate x) * W_up x)`` (Shazeer 2020).

    ``__call__(x) -> y``; :meth:`forward` is the FFN protocol of a block,
    ``forward(x, *, train=False) -> (y, metrics)`` (no metrics here).

    Args:
      d_model: the model width ``d``.
      hidden: the hidden width of ``gate`` and ``up``.
      rngs: the parameter initialisation keys.

    References:
      Shazeer, GLU Variants Improve Transformer, arXiv 2002.05202.
    """

    def __init__(self, d_model: int, hidden: int, *, rngs: nnx.Rngs):
        def lin(i, o, axes):
            return nnx.Linear(
                i, o, use_bias=False, kernel_init=dense_init,
                kernel_metadata={"logical_axes": axes}, rngs=rngs,
            )

        self.gate = lin(d_model, hidden, ("embed", "mlp"))
        self.up = lin(d_model, hidden, ("embed", "mlp"))
        self.down = lin(hidden, d_model, ("mlp", "embed"))

    def __call__(self, x: jax.Array) -> jax.Array:
        """Applies the gated MLP to ``x [..., d]``; returns ``[..., d]``."""
        return self.down(jax.nn.silu(self.gate(x)) * self.up(x))

    def forward(self, x: jax.Array, *, train: bool = False) -> tuple[jax.Array, dict]:
        """The FFN protocol of a block.

        Args:
          x: ``[..., d]`` inputs.
          train: unused; the layer has no state to update.

        Returns:
          ``(y, {})``: ``y [..., d]`` and no metrics.
        """
        del train  # no state to update
        return self(x), {}


class Embedding(nnx.Module):
    """Token embedding table ``float32[vocab, d_model]``, initialised from ``N(0, 0.02^2)``.

    Args:
      vocab_size: the number of rows.
      d_model: the embedding width.
      rngs: the parameter initialisation keys.
    """

    def __init__(self, vocab_size: int, d_model: int, *, rngs: nnx.Rngs):
        self.embedding = nnx.Param(
            dense_init(rngs.params(), (vocab_size, d_model), jnp.float32),
            logical_axes=("vocab", "embed"),
        )

    def __call__(self, tokens: jax.Array) -> jax.Array:
        """Looks up ``tokens int[...]``; returns ``float32[..., d_model]``."""
        return jnp.take(self.embedding[...], tokens, axis=0)


class LMHead(nnx.Module):
    """Untied output projection ``float32[d_model, vocab]``, initialised from ``N(0, 0.02^2)``.

    Args:
      d_model: the model width.
      vocab_size: the number of logits.
      rngs: the parameter initialisation keys.
    """

    def __init__(self, d_model: int, vocab_size: int, *, rngs: nnx.Rngs):
        self.kernel = nnx.Param(
            dense_init(rngs.params(), (d_model, vocab_size), jnp.float32),
            logical_axes=("embed", "vocab"),
        )

    def __call__(self, x: jax.Array) -> jax.Array:
        """Projects ``x [B, T, d_model]`` to ``float32[B, T, vocab]`` logits."""
        return jnp.einsum("btd,dv->btv", x, self.kernel[...]).astype(jnp.float32)


def apply_rope(x: jax.Array, positions: jax.Array, theta: float = 10_000.0, *,
               convention: str = "half") -> jax.Array:
    """Rotary position embedding (Su et al. 2021, arXiv 2104.09864, eq. 34).

    Pair ``i < D/2`` of each head rotates by ``position * theta ** (-2i / D)``; ``convention``
    picks the pairs (:data:`ROPE_CONVENTIONS`). The two layouts differ by a fixed permutation
    of each head's coordinates, so the same attention needs permuted q/k weights
    (:func:`jaxlib_ext.models.llama.permute_rope_rows`).

    Args:
      x: ``[..., T, H, D]`` with even ``D``.
      positions: ``[T]`` or broadcastable to ``x.shape[:-2]`` integer positions.
      theta: the frequency base.
      convention: ``"half"`` or ``"interleaved"``.

    Returns:
      ``x`` rotated, computed in float32 and returned in ``x``'s dtype.

    Raises:
      ValueError: if ``convention`` is unknown or ``D`` is odd.

    References:
      Su et al., RoFormer: Enhanced Transformer with Rotary Position Embedding,
      arXiv 2104.09864.
    """
    if convention not in ROPE_CONVENTIONS:
        raise ValueError(f"convention must be one of {ROPE_CONVENTIONS}, got {convention!r}")
    d = x.shape[-1]
    if d % 2:
        raise ValueError(f"apply_rope: head dim must be even, got {d}")
    freqs = theta ** (-jnp.arange(0, d, 2, dtype=jnp.float32) / d)  # [D/2]
    angles = positions.astype(jnp.float32)[..., None] * freqs  # [..., T, D/2]
    cos, sin = jnp.cos(angles)[..., None, :], jnp.sin(angles)[..., None, :]  # head axis
    x32 = x.astype(jnp.float32)
    if convention == "half":
        x1, x2 = x32[..., : d // 2], x32[..., d // 2 :]
        out = jnp.concatenate([x1 * cos - x2 * sin, x1 * sin + x2 * cos], axis=-1)
    else:
        x1, x2 = x32[..., 0::2], x32[..., 1::2]
        out = jnp.stack([x1 * cos - x2 * sin, x1 * sin + x2 * cos], axis=-1).reshape(x.shape)
    return out.astype(x.dtype)
