"""A small decoder-only Transformer LM: the baseline every other model is compared with.

Pre-norm blocks of RMSNorm -> causal multi-head attention with RoPE -> residual, then
RMSNorm -> SwiGLU -> residual; untied input embedding and LM head (LLaMA-style,
Touvron et al. 2023, arXiv 2302.13971): the ``attention + swiglu`` preset of
:class:`~jaxlib_ext.models.lm.LanguageModel`. Attention is the pure function
:func:`causal_attention` beside the token mixer :class:`Attention`.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
from flax import nnx

from jaxlib_ext.models.layers import SwiGLU, apply_rope, swiglu_hidden_size
from jaxlib_ext.models.lm import LanguageModel
from jaxlib_ext.models.presets import config_from_preset

__all__ = [
    "TransformerConfig",
    "TransformerLM",
    "Attention",
    "TRANSFORMER_PRESETS",
    "build_transformer",
    "causal_attention",
]


def causal_attention(q: jax.Array, k: jax.Array, v: jax.Array, *, scale: float | None = None):
    """Causal softmax attention, ``softmax(q k^T * scale + mask) v``.

    Args:
      q, k, v: ``[B, T, H, D]``.
      scale: defaults to ``D ** -0.5``.

    Returns:
      ``[B, T, H, D]`` in ``q``'s dtype; the softmax is computed in float32.
    """
    if q.ndim != 4 or k.shape != q.shape or v.shape[:3] != q.shape[:3]:
        raise ValueError(
            f"causal_attention: expected q, k [B, T, H, D] and v [B, T, H, Dv], "
            f"got q {q.shape}, k {k.shape}, v {v.shape}"
        )
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    t = q.shape[1]
    logits = jnp.einsum("bqhd,bkhd->bhqk", q, k).astype(jnp.float32) * scale
    mask = jnp.tril(jnp.ones((t, t), dtype=bool))
    logits = jnp.where(mask, logits, jnp.finfo(jnp.float32).min)
    probs = jax.nn.softmax(logits, axis=-1).astype(v.dtype)
    return jnp.einsum("bhqk,bkhd->bqhd", probs, v)


@dataclasses.dataclass(frozen=True)
class TransformerConfig:
    vocab_size: int = 256
    d_model: int = 128
    n_layers: int = 2
    n_heads: int = 4
    head_dim: int = 32
    mlp_hidden: int | None = None  # None: LLaMA SwiGLU width for d_model
    max_seq_len: int = 256
    rope_theta: float = 10_000.0
    norm_eps: float = 1e-6

    def __post_init__(self):
        for name in ("vocab_size", "d_model", "n_layers", "n_heads", "head_dim", "max_seq_len"):
            value = getattr(self, name)
            if value <= 0:
                raise ValueError(f"TransformerConfig.{name} must be positive, got {value}")
        if self.head_dim % 2:
            raise ValueError(f"TransformerConfig.head_dim must be even (RoPE), got {self.head_dim}")

    @property
    def hidden(self) -> int:
        return self.mlp_hidden or swiglu_hidden_size(self.d_model, multiple_of=32)


#: Size presets. ``"tiny"`` is sized for CPU tests and demos; ``"400m"`` is the Transformer
#: baseline of arXiv 2605.05838 (24 layers, 16 heads at d = 1024).
TRANSFORMER_PRESETS: dict[str, TransformerConfig] = {
    "tiny": TransformerConfig(d_model=128, n_layers=2, n_heads=4, head_dim=32, max_seq_len=256),
    "small": TransformerConfig(d_model=256, n_layers=4, n_heads=4, head_dim=64, max_seq_len=512),
    "125m": TransformerConfig(d_model=768, n_layers=12, n_heads=12, head_dim=64, max_seq_len=2048),
    "400m": TransformerConfig(
        d_model=1024, n_layers=24, n_heads=16, head_dim=64, max_seq_len=4096,
        mlp_hidden=swiglu_hidden_size(1024),
    ),
}


class Attention(nnx.Module):
    """Causal multi-head attention with RoPE, as a token mixer.

    ``__call__(x [B, T, d], cache=None) -> (y [B, T, d], None)``: full sequences only (positions
    ``0 .. T-1``); there is no decode cache.
    """

    def __init__(self, cfg: TransformerConfig, *, rngs: nnx.Rngs):
        self.cfg = cfg
        inner = cfg.n_heads * cfg.head_dim

        def lin(i, o, axes, std=0.02):
            return nnx.Linear(
                i, o, use_bias=False, kernel_init=nnx.initializers.normal(std),
                kernel_metadata={"logical_axes": axes}, rngs=rngs,
            )

        self.qkv = lin(cfg.d_model, 3 * inner, ("embed", "heads"))
        # Scaled init of the residual projection (GPT-2 style) keeps deep stacks stable.
        self.out = lin(inner, cfg.d_model, ("heads", "embed"), 0.02 / math.sqrt(2 * cfg.n_layers))

    def __call__(self, x: jax.Array, cache=None) -> tuple[jax.Array, None]:
        if cache is not None:
            raise ValueError("Attention: cache must be None (this mixer keeps no decode cache)")
        b, t, _ = x.shape
        c = self.cfg
        positions = jnp.arange(t)
        q, k, v = jnp.split(self.qkv(x).reshape(b, t, 3 * c.n_heads, c.head_dim), 3, axis=2)
        q, k = apply_rope(q, positions, c.rope_theta), apply_rope(k, positions, c.rope_theta)
        return self.out(causal_attention(q, k, v).reshape(b, t, -1)), None


class TransformerLM(LanguageModel):
    """Decoder-only LM: ``tokens int32[B, T] -> logits float32[B, T, vocab]``; the
    ``attention + swiglu`` :class:`~jaxlib_ext.models.lm.LanguageModel` with ``cfg`` a
    :class:`TransformerConfig`."""

    def __init__(self, cfg: TransformerConfig, *, rngs: nnx.Rngs):
        super().__init__(
            cfg, mixer=lambda r: Attention(cfg, rngs=r),
            ffn=lambda r: SwiGLU(cfg.d_model, cfg.hidden, rngs=r), rngs=rngs,
        )


def build_transformer(
    preset: str = "tiny", *, vocab_size: int | None = None, rngs: nnx.Rngs, **overrides
) -> TransformerLM:
    """A :class:`TransformerLM` from a size preset of :data:`TRANSFORMER_PRESETS` (``"tiny"``,
    ``"small"``, ``"125m"``, ``"400m"``) with ``vocab_size`` (``None``: the preset's) and
    :class:`TransformerConfig` field overrides."""
    cfg = config_from_preset(
        TRANSFORMER_PRESETS, preset, model="transformer", vocab_size=vocab_size, **overrides
    )
    return TransformerLM(cfg, rngs=rngs)

