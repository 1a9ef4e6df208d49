"""Softmax attention: the pure grouped-query function and the attention token mixer.

One attention for every model of :mod:`jaxlib_ext.models`: :func:`attention` is scaled
dot-product softmax attention (Vaswani et al. 2017, arXiv 1706.03762) with grouped key/value
heads (Ainslie et al. 2023, arXiv 2305.13245) under a boolean mask; :func:`causal_attention` is
its causal, ungrouped case. :class:`Attention` is the ``"attention"`` token mixer of the
composable language model (:class:`AttentionConfig`: heads, key/value heads, RoPE base and pair
convention), with a key/value decode cache (:class:`KVCache`). The Transformer baseline and the
Llama presets (:mod:`~jaxlib_ext.models.llama`) use it as their mixer; the xLSTM students'
sliding-window attention (:mod:`~jaxlib_ext.models.xlstm`) calls the same :func:`attention` and
:func:`~jaxlib_ext.models.layers.apply_rope`.

:class:`TransformerConfig` and :data:`TRANSFORMER_PRESETS` are the size table of the Transformer
baseline (the ``attention + swiglu`` preset of :func:`~jaxlib_ext.models.build_lm`).
"""

from __future__ import annotations

import dataclasses
import math
from typing import ClassVar, NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

from jaxlib_ext.models.layers import ROPE_CONVENTIONS, apply_rope, swiglu_hidden_size

__all__ = [
    "attention",
    "causal_attention",
    "AttentionConfig",
    "Attention",
    "KVCache",
    "TransformerConfig",
    "TRANSFORMER_PRESETS",
]


def attention(q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array, *,
              scale: float | None = None) -> jax.Array:
    """Softmax attention with grouped key/value heads, ``softmax(q k^T * scale + mask) v``.

    Args:
      q: ``[B, T, H, D]`` queries (RoPE applied).
      k: ``[B, S, Hkv, D]`` keys, ``H`` a multiple of ``Hkv``: query head ``h`` reads
        key/value head ``h // (H // Hkv)``.
      v: ``[B, S, Hkv, Dv]`` values.
      mask: bool ``[T, S]`` or ``[B, T, S]``, True where query ``t`` may read key ``s``.
      scale: the score scale; ``None`` means ``D ** -0.5``.

    Returns:
      ``[B, T, H, Dv]`` in ``v``'s dtype; scores and the softmax in float32.

    Raises:
      ValueError: if ``H`` is not a multiple of ``Hkv``.

    References:
      Vaswani et al., Attention Is All You Need, arXiv 1706.03762.

      Ainslie et al., GQA: Training Generalized Multi-Query Transformer Models from
      Multi-Head Checkpoints, arXiv 2305.13245.
    """
    b, t, h, d = q.shape
    hkv = k.shape[2]
    if h % hkv:
        raise ValueError(f"attention: q heads {h} are not a multiple of k heads {hkv}")
    scale = d**-0.5 if scale is None else scale
    qg = q.reshape(b, t, hkv, h // hkv, d)
    scores = jnp.einsum("btkgd,bskd->bkgts", qg, k).astype(jnp.float32) * scale
    mask = mask if mask.ndim == 3 else mask[None]
    scores = jnp.where(mask[:, None, None], scores, jnp.finfo(jnp.float32).min)
    probs = jax.nn.softmax(scores, axis=-1).astype(v.dtype)
    return jnp.einsum("bkgts,bskd->btkgd", probs, v).reshape(b, t, h, v.shape[-1])


def causal_attention(q: jax.Array, k: jax.Array, v: jax.Array, *, scale: float | None = None):
    """Causal softmax attention: :func:`attention` with ``Hkv = H`` and a lower-triangular mask.

    Args:
      q: ``[B, T, H, D]`` queries (RoPE applied).
      k: ``[B, T, H, D]`` keys.
      v: ``[B, T, H, Dv]`` values.
      scale: the score scale; ``None`` means ``D ** -0.5``.

    Returns:
      ``[B, T, H, Dv]`` in ``v``'s dtype; the softmax is computed in float32.

    Raises:
      ValueError: if ``q`` is not 4-D, ``k`` does not have ``q``'s shape, or ``v`` does not
        share its first three axes.
    """
    if q.ndim != 4 or k.shape != q.shape or v.shape[:3] != q.shape[:3]:
        raise ValueError(
            f"causal_attention: expected q, k [B, T, H, D] and v [B, T, H, Dv], "
            f"got q {q.shape}, k {k.shape}, v {v.shape}"
        )
    t = q.shape[1]
    return attention(q, k, v, jnp.tril(jnp.ones((t, t), dtype=bool)), scale=scale)


@dataclasses.dataclass(frozen=True)
class AttentionConfig:
    """The attention token mixer of a language-model block.

    Attributes:
      kind: the registry name, ``"attention"``.
      n_heads: query heads, a positive int (default 4).
      head_dim: width ``D`` of each head, a positive even int (RoPE rotates pairs; default 32).
      n_kv_heads: key/value heads, a positive divisor of ``n_heads``; ``None`` means
        ``n_heads`` (multi-head attention), fewer is grouped-query attention (arXiv
        2305.13245).
      rope_theta: the RoPE base, positive (default 10 000).
      rope_convention: the RoPE pair layout, one of
        :data:`~jaxlib_ext.models.layers.ROPE_CONVENTIONS` (default ``"half"``).

    Raises:
      ValueError: if a field is out of range.
    """

    kind: ClassVar[str] = "attention"
    n_heads: int = 4
    head_dim: int = 32
    n_kv_heads: int | None = None
    rope_theta: float = 10_000.0
    rope_convention: str = "half"

    def __post_init__(self):
        for name in ("n_heads", "head_dim", "n_kv_heads"):
            value = getattr(self, name)
            if value is None and name == "n_kv_heads":
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"AttentionConfig.{name} must be a positive int, got {value!r}")
        if self.head_dim % 2:
            raise ValueError(f"AttentionConfig.head_dim must be even (RoPE), got {self.head_dim}")
        if self.n_heads % self.kv_heads:
            raise ValueError(f"AttentionConfig.n_heads ({self.n_heads}) must be a multiple of "
                             f"n_kv_heads ({self.kv_heads})")
        if self.rope_convention not in ROPE_CONVENTIONS:
            raise ValueError(f"AttentionConfig.rope_convention must be one of "
                             f"{ROPE_CONVENTIONS}, got {self.rope_convention!r}")
        if not self.rope_theta > 0:
            raise ValueError(f"AttentionConfig.rope_theta must be positive, got {self.rope_theta}")

    @property
    def kv_heads(self) -> int:
        """The number of key/value heads."""
        return self.n_heads if self.n_kv_heads is None else self.n_kv_heads


class KVCache(NamedTuple):
    """Decode cache of one :class:`Attention`.

    The keys and values of the first ``length`` tokens lie in slots ``0 .. length-1`` of fixed
    buffers.

    Attributes:
      k: ``[B, max_len, Hkv, D]`` keys, RoPE applied.
      v: ``[B, max_len, Hkv, D]`` values.
      length: int32 scalar, the number of cached tokens.
    """

    k: jax.Array
    v: jax.Array
    length: jax.Array  # int32 scalar


class Attention(nnx.Module):
    """Causal (grouped-query) attention with RoPE, as a token mixer.

    Parameters: ``qkv [d, (H + 2 Hkv) D]`` (the q, k and v columns side by side, head ``h`` of
    each the columns ``h D .. (h+1) D - 1``) and ``out [H D, d]``, the latter at the scaled init
    ``0.02 / sqrt(2 n_layers)`` (GPT-2 style, which keeps deep stacks stable). :meth:`q_k_v`
    gives the three projections.

    ``__call__(x [B, T, d], cache=None) -> (y [B, T, d], cache)``: without a cache, the tokens
    are positions ``0 .. T-1``, query ``t`` reads keys ``0 .. t`` and the returned cache is
    ``None``; with a :class:`KVCache` of ``length`` tokens (:meth:`init_cache`), the new tokens
    are positions ``length .. length+T-1``, their keys and values go into those slots, query
    ``t`` reads slots ``0 .. length+t`` and the cache comes back with ``length + T``.

    Args:
      cfg: the heads, head width and RoPE settings.
      d_model: the model width ``d``.
      n_layers: the number of blocks of the model, which sets the scaled init of ``out``.
      rngs: the parameter initialisation keys.
    """

    def __init__(self, cfg: AttentionConfig, *, d_model: int, n_layers: int, rngs: nnx.Rngs):
        self.cfg = cfg
        self.d_model = d_model
        d = cfg.head_dim

        def lin(i, o, axes, std=0.02):
            return nnx.Linear(
                i, o, use_bias=False, kernel_init=nnx.initializers.normal(std),
                kernel_metadata={"logical_axes": axes}, rngs=rngs,
            )

        self.qkv = lin(d_model, (cfg.n_heads + 2 * cfg.kv_heads) * d, ("embed", "heads"))
        self.out = lin(cfg.n_heads * d, d_model, ("heads", "embed"), 0.02 / math.sqrt(2 * n_layers))

    def init_cache(self, batch: int, max_len: int, dtype=jnp.float32) -> KVCache:
        """An empty :class:`KVCache` for ``batch`` sequences of up to ``max_len`` tokens.

        Args:
          batch: the number of sequences, a positive int.
          max_len: the number of cache slots, a positive int.
          dtype: the dtype of the key and value buffers.

        Returns:
          A :class:`KVCache` of zero buffers ``[batch, max_len, Hkv, D]`` and ``length = 0``.

        Raises:
          ValueError: if ``batch`` or ``max_len`` is not a positive int.
        """
        for name, value in (("batch", batch), ("max_len", max_len)):
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"Attention.init_cache: {name} must be a positive int, got "
                                 f"{value!r}")
        shape = (batch, max_len, self.cfg.kv_heads, self.cfg.head_dim)
        # two distinct buffers, so that a jitted step may donate the cache
        return KVCache(jnp.zeros(shape, dtype), jnp.zeros(shape, dtype), jnp.zeros((), jnp.int32))

    def q_k_v(self, x: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
        """The projections before RoPE.

        Args:
          x: ``[B, T, d]`` inputs.

        Returns:
          ``(q, k, v)``: ``q [B, T, H, D]``, ``k, v [B, T, Hkv, D]``.
        """
        b, t, _ = x.shape
        c = self.cfg
        hq, hkv, d = c.n_heads * c.head_dim, c.kv_heads * c.head_dim, c.head_dim
        qkv = self.qkv(x)
        return (qkv[..., :hq].reshape(b, t, c.n_heads, d),
                qkv[..., hq : hq + hkv].reshape(b, t, c.kv_heads, d),
                qkv[..., hq + hkv :].reshape(b, t, c.kv_heads, d))

    def __call__(self, x: jax.Array, cache: KVCache | None = None
                 ) -> tuple[jax.Array, KVCache | None]:
        """Attends causally over the tokens of ``x``, after the cached ones if any.

        Args:
          x: ``[B, T, d]`` inputs.
          cache: a :class:`KVCache` of earlier tokens (:meth:`init_cache`), or ``None``.

        Returns:
          ``(y, cache)``: ``y [B, T, d]`` and the cache with ``length + T`` tokens, or ``None``
          without one.

        Raises:
          ValueError: if ``cache`` is neither ``None`` nor a :class:`KVCache`.
        """
        if cache is not None and not isinstance(cache, KVCache):
            raise ValueError(f"Attention: cache must be a KVCache (init_cache) or None, got "
                             f"{type(cache).__name__}")
        b, t, _ = x.shape
        c = self.cfg
        start = jnp.zeros((), jnp.int32) if cache is None else cache.length
        positions = start + jnp.arange(t, dtype=jnp.int32)
        q, k, v = self.q_k_v(x)
        rope = dict(theta=c.rope_theta, convention=c.rope_convention)
        q, k = apply_rope(q, positions, **rope), apply_rope(k, positions, **rope)
        if cache is None:
            mask = jnp.tril(jnp.ones((t, t), dtype=bool))
        else:
            zero = jnp.zeros((), jnp.int32)
            k_all = jax.lax.dynamic_update_slice(cache.k, k.astype(cache.k.dtype),
                                                 (zero, start, zero, zero))
            v_all = jax.lax.dynamic_update_slice(cache.v, v.astype(cache.v.dtype),
                                                 (zero, start, zero, zero))
            mask = jnp.arange(cache.k.shape[1])[None, :] <= positions[:, None]
            cache = KVCache(k_all, v_all, start + t)
            k, v = k_all.astype(q.dtype), v_all.astype(q.dtype)
        return self.out(attention(q, k, v, mask).reshape(b, t, -1)), cache


@dataclasses.dataclass(frozen=True)
class TransformerConfig:
    """A size of the Transformer baseline (the ``attention + swiglu`` language model).

    Attributes:
      vocab_size: the vocabulary size (default 256).
      d_model: the model width (default 128).
      n_layers: the number of blocks (default 2).
      n_heads: the attention heads (default 4).
      head_dim: the width of each head, even (RoPE; default 32).
      mlp_hidden: the SwiGLU hidden width; ``None`` means the LLaMA width for ``d_model``
        (:func:`~jaxlib_ext.models.layers.swiglu_hidden_size`, a multiple of 32).
      max_seq_len: the longest sequence (default 256).
      rope_theta: the RoPE base (default 10 000).
      norm_eps: the RMSNorm epsilon (default 1e-6).

    Raises:
      ValueError: if a size is not positive or ``head_dim`` is odd.
    """

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
        """The SwiGLU hidden width: ``mlp_hidden``, or the LLaMA width for ``d_model``."""
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
