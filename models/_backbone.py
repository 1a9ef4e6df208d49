"""The backbone of every composable language model: embedding, blocks, norm, head.

A block is pre-norm, ``x <- x + mixer(norm(x))`` then ``x <- x + ffn(norm(x))``; the model is an
embedding, ``n_layers`` blocks, a final RMSNorm and an untied head (LLaMA-style, arXiv
2302.13971). The parts come from :mod:`~jaxlib_ext.models.registry` by the config's names.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
from flax import nnx

from jaxlib_ext.models._delta_mixer import LMCache
from jaxlib_ext.models.layers import Embedding, LMHead, RMSNorm
from jaxlib_ext.models.registry import make_ffn, make_mixer

__all__ = ["Block", "LanguageModel"]


class Block(nnx.Module):
    """Pre-norm block ``x + mixer(norm(x))``, then ``x + ffn(norm(x))``.

    ``mixer`` and ``ffn`` are factories ``rngs -> module``, called in that order (so the
    parameter draws follow the block's layout); the parts follow the protocols of
    :mod:`~jaxlib_ext.models.registry`. ``__call__(x, cache=None, *, train=False) ->
    (x, cache, metrics)``; ``train`` lets a mixture-of-experts FFN update its correction bias.
    """

    def __init__(self, d_model: int, norm_eps: float, mixer: Callable, ffn: Callable, *,
                 rngs: nnx.Rngs):
        self.attn_norm = RMSNorm(d_model, eps=norm_eps)
        self.attn = mixer(rngs)
        self.mlp_norm = RMSNorm(d_model, eps=norm_eps)
        self.mlp = ffn(rngs)

    def __call__(self, x, cache=None, *, train: bool = False):
        y, cache = self.attn(self.attn_norm(x), cache)
        x = x + y
        y, metrics = self.mlp.forward(self.mlp_norm(x), train=train)
        return x + y, cache, metrics


class LanguageModel(nnx.Module):
    """Embedding, ``n_layers`` x :class:`Block` (mixer + FFN), final norm, untied head.

    ``__call__(tokens int32[B, T]) -> logits float32[B, T, vocab]``;
    :meth:`logits_and_metrics` also returns the FFNs' metrics; decoding with
    :meth:`init_cache` and :meth:`decode_step` when the mixer keeps a cache (mdn, gdn, mlstm).

    Args:
      cfg: an :class:`~jaxlib_ext.models.LMConfig` (any config with ``vocab_size, d_model,
        n_layers, max_seq_len, norm_eps`` when ``mixer`` and ``ffn`` are given); kept as
        ``cfg``.
      mixer, ffn: factories ``rngs -> module`` of one block's parts (default: the registry's
        parts of ``cfg.mixer`` and ``cfg.ffn``).
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
        self.lm_head = LMHead(cfg.d_model, cfg.vocab_size, rngs=rngs)

    def _check_tokens(self, tokens, what):
        name = type(self).__name__
        if not hasattr(tokens, "ndim") or tokens.ndim != 2:
            shape = getattr(tokens, "shape", type(tokens).__name__)
            raise ValueError(f"{name}.{what}: tokens must be [B, T], got {shape}")
        if not jnp.issubdtype(tokens.dtype, jnp.integer):
            raise ValueError(f"{name}.{what}: tokens must be integer, got dtype {tokens.dtype}")

    def logits_and_metrics(self, tokens: jax.Array, *, train: bool = False
                           ) -> tuple[jax.Array, dict[str, jax.Array]]:
        """Full-sequence forward: ``(logits float32[B, T, vocab], metrics)``; ``metrics`` maps
        each name an FFN reports to its mean over the blocks that report it. ``train=True``
        lets the FFNs update their ``nnx.BatchStat`` state (a router's correction bias)."""
        self._check_tokens(tokens, "__call__")
        if tokens.shape[1] > self.max_seq_len:
            raise ValueError(
                f"{type(self).__name__}: sequence length {tokens.shape[1]} exceeds max_seq_len "
                f"{self.max_seq_len}"
            )
        x = self.embed(tokens)
        reported: dict[str, list] = {}
        for block in self.blocks:
            x, _, metrics = block(x, train=train)
            for name, value in metrics.items():
                reported.setdefault(name, []).append(jnp.asarray(value, jnp.float32))
        metrics = {name: jnp.mean(jnp.stack(v)) for name, v in reported.items()}
        return self.lm_head(self.final_norm(x)), metrics

    def __call__(self, tokens: jax.Array) -> jax.Array:
        """Full-sequence forward: ``int32[B, T] -> float32 logits [B, T, vocab]``."""
        return self.logits_and_metrics(tokens)[0]

    def init_cache(self, batch: int) -> LMCache:
        """A zero :class:`LMCache` for ``batch`` sequences (states float32)."""
        if not all(hasattr(block.attn, "init_cache") for block in self.blocks):
            raise ValueError(
                f"{type(self).__name__}.init_cache: the token mixer "
                f"{type(self.blocks[0].attn).__name__} keeps no decode cache"
            )
        layers = tuple(block.attn.init_cache(batch) for block in self.blocks)
        return LMCache(layers, jnp.zeros((), jnp.int32))

    def decode_step(self, tokens: jax.Array, cache: LMCache) -> tuple[jax.Array, LMCache]:
        """Consume ``tokens [B, T']`` after the cached prefix; ``T' = 1`` is one decode step.

        Returns ``(logits [B, T', vocab], new_cache)``. Feeding a sequence piece by piece gives
        the logits of one full forward.
        """
        self._check_tokens(tokens, "decode_step")
        if len(cache.layers) != len(self.blocks):
            raise ValueError(
                f"{type(self).__name__}.decode_step: cache has {len(cache.layers)} layers, model "
                f"has {len(self.blocks)}"
            )
        x = self.embed(tokens)
        new_layers = []
        for block, layer_cache in zip(self.blocks, cache.layers, strict=True):
            x, layer_cache, _ = block(x, layer_cache)
            new_layers.append(layer_cache)
        logits = self.lm_head(self.final_norm(x))
        return logits, LMCache(tuple(new_layers), cache.position + tokens.shape[1])
