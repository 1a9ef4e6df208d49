"""Building blocks shared by every language model in ``jaxlib_ext.models``.

Each block is a thin Flax NNX module over a pure function, and every parameter carries
``logical_axes`` metadata that :mod:`jaxlib_ext.core.sharding` maps onto mesh axes.
"""

from __future__ import annotations

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
    "dense_init",
]

dense_init = nnx.initializers.normal(stddev=0.02)


def rms_norm(x: jax.Array, scale: jax.Array, eps: float = 1e-6) -> jax.Array:
    """``x / sqrt(mean(x**2) + eps) * scale`` over the last axis, computed in float32."""
    x32 = x.astype(jnp.float32)
    y = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)
    return (y * scale).astype(x.dtype)


class RMSNorm(nnx.Module):
    """Root-mean-square layer norm (Zhang & Sennrich 2019) with a learned scale."""

    def __init__(self, dim: int, *, eps: float = 1e-6, logical_axis: str | None = "norm"):
        self.eps = eps
        self.scale = nnx.Param(jnp.ones((dim,), jnp.float32), logical_axes=(logical_axis,))

    def __call__(self, x: jax.Array) -> jax.Array:
        return rms_norm(x, self.scale[...], self.eps)


def swiglu_hidden_size(d_model: int, ratio: float = 4.0, multiple_of: int = 256) -> int:
    """LLaMA-style SwiGLU width: ``multiple_of * ceil(ratio * d * 2/3 / multiple_of)``."""
    hidden = int(ratio * d_model * 2 / 3)
    return multiple_of * ((hidden + multiple_of - 1) // multiple_of)


class SwiGLU(nnx.Module):
    """Gated MLP ``W_down (silu(W_gate x) * W_up x)`` (Shazeer 2020)."""

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
        return self.down(jax.nn.silu(self.gate(x)) * self.up(x))


class Embedding(nnx.Module):
    """Token embedding table ``[vocab, d_model]``."""

    def __init__(self, vocab_size: int, d_model: int, *, rngs: nnx.Rngs):
        self.embedding = nnx.Param(
            dense_init(rngs.params(), (vocab_size, d_model), jnp.float32),
            logical_axes=("vocab", "embed"),
        )

    def __call__(self, tokens: jax.Array) -> jax.Array:
        return jnp.take(self.embedding[...], tokens, axis=0)


class LMHead(nnx.Module):
    """Untied output projection ``[d_model, vocab]``; logits in float32."""

    def __init__(self, d_model: int, vocab_size: int, *, rngs: nnx.Rngs):
        self.kernel = nnx.Param(
            dense_init(rngs.params(), (d_model, vocab_size), jnp.float32),
            logical_axes=("embed", "vocab"),
        )

    def __call__(self, x: jax.Array) -> jax.Array:
        return jnp.einsum("btd,dv->btv", x, self.kernel[...]).astype(jnp.float32)


def apply_rope(x: jax.Array, positions: jax.Array, theta: float = 10_000.0) -> jax.Array:
    """Rotary position embedding (Su et al. 2021, arXiv 2104.09864), half-split layout.

    Args:
      x: ``[..., T, H, D]`` with even ``D``.
      positions: ``[T]`` or broadcastable to ``x.shape[:-2]`` integer positions.
    """
    d = x.shape[-1]
    if d % 2:
        raise ValueError(f"apply_rope: head dim must be even, got {d}")
    freqs = theta ** (-jnp.arange(0, d, 2, dtype=jnp.float32) / d)  # [D/2]
    angles = positions.astype(jnp.float32)[..., None] * freqs  # [..., T, D/2]
    cos, sin = jnp.cos(angles)[..., None, :], jnp.sin(angles)[..., None, :]  # head axis
    x1, x2 = jnp.split(x.astype(jnp.float32), 2, axis=-1)
    out = jnp.concatenate([x1 * cos - x2 * sin, x1 * sin + x2 * cos], axis=-1)
    return out.astype(x.dtype)
