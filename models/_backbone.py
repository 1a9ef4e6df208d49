"""The backbone of every composable language model: embedding, blocks, norm, head.

A block is pre-norm, ``x <- x + mixer(norm(x))`` then ``x <- x + ffn(norm(x))``; the model is an
embedding, ``n_layers`` blocks, a final RMSNorm and the output head, untied or the transposed
embedding (LLaMA-style, arXiv 2302.13971). The parts come from
:mod:`~jaxlib_ext.models.registry` by the config's names.

**The decode cache.** A mixer that can decode has ``init_cache(batch, max_len)``; its cache
counts the tokens it has consumed, which are the positions of the next ones (RoPE angles,
sliding windows). :class:`LMCache` holds one per block, and a model or a block fed a sequence
piece by piece through its caches gives the outputs of one full forward. Any module with the
mixer protocol may be assigned to ``blocks[i].attn``: that is how distillation students replace
a teacher's attention.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

from jaxlib_ext.models.layers import Embedding, LMHead, RMSNorm
from jaxlib_ext.models.registry import make_ffn, make_mixer

__all__ = ["Block", "LanguageModel", "LMCache"]


class LMCache(NamedTuple):
    """Decode state of a whole LM.

    Attributes:
      layers: one cache per block, each of its mixer's own type.
      position: int32 scalar, the number of tokens consumed.
    """

    layers: tuple
    position: jax.Array  # int32 scalar


class Block(nnx.Module):
    """Pre-norm block ``x + mixer(norm(x))``, then ``x + ffn(norm(x))``.

    ``mixer`` and ``ffn`` are factories ``rngs -> module``, called in that order (so the
    parameter draws follow the block's layout); the parts follow the protocols of
    :mod:`~jaxlib_ext.models.registry`. ``__call__(x, cache=None, *, train=False) ->
    (x, cache, metrics)``; ``train`` lets a mixture-of-experts FFN update its correction bias.

    Args:
      d_model: the model width ``d``.
      norm_eps: the epsilon of both RMSNorms.
      mixer: a factory ``rngs -> module`` of the token mixer, kept as ``attn``.
      ffn: a factory ``rngs -> module`` of the feed-forward part, kept as ``mlp``.
      rngs: the parameter initialisation keys.
    """

    def __init__(self, d_model: int, norm_eps: float, mixer: Callable, ffn: Callable, *,
                 rngs: nnx.Rngs):
        self.attn_norm = RMSNorm(d_model, eps=norm_eps)
        self.attn = mixer(rngs)
        self.mlp_norm = RMSNorm(d_model, eps=norm_eps)
        self.mlp = ffn(rngs)

    def __call__(self, x, cache=None, *, train: bool = False):
        """Applies the mixer and the FFN, each with its residual.

        Args:
          x: ``[B, T, d]`` inputs.
          cache: the mixer's decode cache, or ``None`` for a full uncached forward.
          train: whether the FFN may update its ``nnx.BatchStat`` state (a router's bias).

        Returns:
          ``(x, cache, metrics)``: ``x [B, T, d]``, the mixer's new cache (``None`` without
          one) and the FFN's metrics dict.
        """
        y, cache = self.attn(self.attn_norm(x), cache)
        x = x + y
        y, metrics = self.mlp.forward(self.mlp_norm(x), train=train)
        return x + y, cache, metrics


class LanguageModel(nnx.Module):
    """Embedding, ``n_layers`` x :class:`Block` (mixer + FFN), final norm, output head.

    ``__call__(tokens int32[B, T]) -> logits float32[B, T, vocab]``;
    :meth:`logits_and_metrics` also returns the FFNs' metrics; decoding with
    :meth:`init_cache` and :meth:`decode_step` (every registered mixer keeps a cache);
    :meth:`mixer_io` gives each block's mixer input and output. Parameters: ``embed``,
    ``blocks[i].attn_norm``, ``.attn`` (the mixer), ``.mlp_norm``, ``.mlp`` (the FFN),
    ``final_norm`` and ``lm_head`` (``None`` when ``cfg.tie_embeddings``: logits ``= h
    embedding^T``).

    Args:
      cfg: an :class:`~jaxlib_ext.models.LMConfig` (any config with ``vocab_size, d_model,
        n_layers, max_seq_len, norm_eps`` when ``mixer`` and ``ffn`` are given; a missing
        ``tie_embeddings`` means an untied head); kept as ``cfg``.
      mixer: a factory ``rngs -> module`` of each block's token mixer; ``None`` means the
        registry's part for ``cfg.mixer``.
      ffn: a factory ``rngs -> module`` of each block's feed-forward part; ``None`` means the
        registry's part for ``cfg.ffn``.
      rngs: the parameter initialisation keys.
    """

    def __init__(self, cfg, *, mixer: Callable | None = None, ffn: Callable | None = None,
                 rngs: nnx.Rngs):
        self.cfg = cfg
        self.max_seq_len = cfg.max_seq_len
        mixer = mixer or (lambda r: make_mixer(cfg, r))
        ffn = ffn or (lambda r: make_ffn(cfg, r))
        self.embed = Embedding(cfg.vocab_size, cfg.d_model, rngs=rngs)
        self.blocks = nnx.List(
            [Block(cfg.d_model, cfg.norm_eps, mixer, ffn, rngs=rngs) for _ in range(cfg.n_layers)]
        )
        self.final_norm = RMSNorm(cfg.d_model, eps=cfg.norm_eps)
        self.lm_head = nnx.data(None)
        if not getattr(cfg, "tie_embeddings", False):
            self.lm_head = LMHead(cfg.d_model, cfg.vocab_size, rngs=rngs)

    def logits(self, h: jax.Array) -> jax.Array:
        """The head on the last block's output: final norm, then ``lm_head`` or the transposed
        embedding.

        Args:
          h: ``[B, T, d]`` output of the last block.

        Returns:
          ``float32[B, T, vocab]`` logits.
        """
        h = self.final_norm(h)
        if self.lm_head is None:
            return jnp.einsum("btd,vd->btv", h, self.embed.embedding[...]).astype(jnp.float32)
        return self.lm_head(h)

    def _check_tokens(self, tokens, what):
        name = type(self).__name__
        if not hasattr(tokens, "ndim") or tokens.ndim != 2:
            shape = getattr(tokens, "shape", type(tokens).__name__)
            raise ValueError(f"{name}.{what}: tokens must be [B, T], got {shape}")
        if not jnp.issubdtype(tokens.dtype, jnp.integer):
            raise ValueError(f"{name}.{what}: tokens must be integer, got dtype {tokens.dtype}")
        if tokens.shape[1] > self.max_seq_len:
            raise ValueError(
                f"{name}.{what}: sequence length {tokens.shape[1]} exceeds max_seq_len "
                f"{self.max_seq_len}"
            )

    def logits_and_metrics(self, tokens: jax.Array, *, train: bool = False
                           ) -> tuple[jax.Array, dict[str, jax.Array]]:
        """Full-sequence forward with the FFNs' metrics.

        Args:
          tokens: ``int[B, T]`` token ids, ``T <= max_seq_len``.
          train: whether the FFNs may update their ``nnx.BatchStat`` state (a router's
            correction bias).

        Returns:
          ``(logits, metrics)``: ``logits float32[B, T, vocab]``; ``metrics`` maps each name an
          FFN reports to its mean over the blocks that report it.

        Raises:
          ValueError: if ``tokens`` is not an integer ``[B, T]`` array with
            ``T <= max_seq_len``.
        """
        self._check_tokens(tokens, "__call__")
        x = self.embed(tokens)
        reported: dict[str, list] = {}
        for block in self.blocks:
            x, _, metrics = block(x, train=train)
            for name, value in metrics.items():
                reported.setdefault(name, []).append(jnp.asarray(value, jnp.float32))
        metrics = {name: jnp.mean(jnp.stack(v)) for name, v in reported.items()}
        return self.logits(x), metrics

    def __call__(self, tokens: jax.Array) -> jax.Array:
        """Full-sequence forward.

        Args:
          tokens: ``int[B, T]`` token ids, ``T <= max_seq_len``.

        Returns:
          ``float32[B, T, vocab]`` logits.

        Raises:
          ValueError: if ``tokens`` is not an integer ``[B, T]`` array with
            ``T <= max_seq_len``.
        """
        return self.logits_and_metrics(tokens)[0]

    def mixer_io(self, tokens: jax.Array, *, with_logits: bool = False):
        """Each block's mixer input and output in a full uncached forward.

        These are the targets of layer-wise alignment (arXiv 2603.15590, stage I).

        Args:
          tokens: ``int[B, T]`` token ids, ``T <= max_seq_len``.
          with_logits: whether to return the logits of the same forward too.

        Returns:
          A list with one ``(x_in, y_out)`` per block: the mixer's input ``attn_norm(h)
          [B, T, d]`` and its output ``[B, T, d]`` (before the residual add); with
          ``with_logits``, ``(list, logits float32[B, T, vocab])``.

        Raises:
          ValueError: if ``tokens`` is not an integer ``[B, T]`` array with
            ``T <= max_seq_len``.
        """
        self._check_tokens(tokens, "mixer_io")
        x = self.embed(tokens)
        out = []
        for block in self.blocks:
            x_in = block.attn_norm(x)
            y, _ = block.attn(x_in)
            out.append((x_in, y))
            x = x + y
            x = x + block.mlp.forward(block.mlp_norm(x))[0]
        return (out, self.logits(x)) if with_logits else out

    def init_cache(self, batch: int, max_len: int | None = None) -> LMCache:
        """An empty :class:`LMCache` for ``batch`` sequences of up to ``max_len`` tokens.

        Args:
          batch: the number of sequences.
          max_len: the longest sequence, an int in ``[1, max_seq_len]``; ``None`` means
            ``max_seq_len`` (a recurrent mixer's state has one size at any length).

        Returns:
          An :class:`LMCache` of each block's empty mixer cache and ``position = 0``.

        Raises:
          ValueError: if ``max_len`` is out of range or a block's mixer keeps no decode cache.
        """
        max_len = self.max_seq_len if max_len is None else max_len
        if isinstance(max_len, bool) or not isinstance(max_len, int) or not (
                0 < max_len <= self.max_seq_len):
            raise ValueError(f"{type(self).__name__}.init_cache: max_len must be an int in "
                             f"[1, max_seq_len={self.max_seq_len}], got {max_len!r}")
        for i, block in enumerate(self.blocks):
            if not hasattr(block.attn, "init_cache"):
                raise ValueError(
                    f"{type(self).__name__}.init_cache: the token mixer of block {i}, "
                    f"{type(block.attn).__name__}, keeps no decode cache"
                )
        layers = tuple(block.attn.init_cache(batch, max_len) for block in self.blocks)
        return LMCache(layers, jnp.zeros((), jnp.int32))

    def decode_step(self, tokens: jax.Array, cache: LMCache) -> tuple[jax.Array, LMCache]:
        """Consumes ``tokens`` after the cached prefix; ``T' = 1`` is one decode step.

        Feeding a sequence piece by piece gives the logits of one full forward.

        Args:
          tokens: ``int[B, T']`` token ids.
          cache: the :class:`LMCache` of the prefix (:meth:`init_cache`).

        Returns:
          ``(logits float32[B, T', vocab], new_cache)``.

        Raises:
          ValueError: if ``tokens`` is not an integer ``[B, T']`` array with
            ``T' <= max_seq_len``, or ``cache`` is not an :class:`LMCache` of one cache per
            block.
        """
        self._check_tokens(tokens, "decode_step")
        if not isinstance(cache, LMCache) or len(cache.layers) != len(self.blocks):
            have = len(cache.layers) if isinstance(cache, LMCache) else type(cache).__name__
            raise ValueError(
                f"{type(self).__name__}.decode_step: cache must be an LMCache of "
                f"{len(self.blocks)} layers (init_cache), got {have}"
            )
        x = self.embed(tokens)
        new_layers = []
        for block, layer_cache in zip(self.blocks, cache.layers, strict=True):
            x, layer_cache, _ = block(x, layer_cache)
            new_layers.append(layer_cache)
        return self.logits(x), LMCache(tuple(new_layers), cache.position + tokens.shape[1])
