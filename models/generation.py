"""Autoregressive generation with a language model's decode cache.

Greedy or sampled continuation of a prompt by any :class:`~jaxlib_ext.models.LanguageModel`
whose mixers keep a decode cache (every registered mixer, and the distillation students): the
prompt in one cached call (prefill), then one token per step inside one compiled ``lax.scan``.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxlib_ext.models._backbone import LanguageModel

__all__ = ["generate", "generate_text"]


def _sample(logits, key, temperature):
    if key is None:
        return jnp.argmax(logits, axis=-1).astype(jnp.int32)
    return jax.random.categorical(key, logits / temperature, axis=-1).astype(jnp.int32)


def generate(model: LanguageModel, prompt, max_new_tokens: int, *, key: jax.Array | None = None,
             temperature: float = 1.0) -> np.ndarray:
    """Continues ``prompt`` by ``max_new_tokens`` tokens with the model's decode cache.

    The prompt is consumed in one cached call (prefill), then one token per step inside one
    compiled ``lax.scan``.

    Args:
      model: a language model whose mixers keep a decode cache.
      prompt: non-empty integer token ids ``[T]`` or ``[B, T]`` (array-like).
      max_new_tokens: the number ``N`` of tokens to generate, a positive int;
        ``T + N <= model.max_seq_len``.
      key: a PRNG key for sampling; ``None`` means greedy decoding.
      temperature: the sampling temperature, positive; unused when ``key`` is ``None``.

    Returns:
      The new ids, a NumPy ``int32[B, N]`` (``[N]`` for a 1-D prompt).

    Raises:
      ValueError: if ``prompt`` is empty, not integer or not 1-D/2-D, ``max_new_tokens`` is
        not a positive int, ``temperature`` is not positive while sampling, or
        ``T + N > model.max_seq_len``.
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
    if total > model.max_seq_len:
        raise ValueError(
            f"prompt length + max_new_tokens = {total} exceeds max_seq_len {model.max_seq_len}"
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
    logits, cache = model.decode_step(prompt, cache)
    keys = None if key is None else jax.random.split(key, n_new)
    first = _sample(logits[:, -1], None if keys is None else keys[0], temperature)

    def step(carry, k):
        token, cache = carry
        logits, cache = model.decode_step(token[:, None], cache)
        nxt = _sample(logits[:, -1], k, temperature)
        return (nxt, cache), token

    xs = None if keys is None else keys[1:]
    (last, _), tokens = jax.lax.scan(step, (first, cache), xs, length=n_new - 1)
    return jnp.concatenate([tokens.T, last[:, None]], axis=1)


def generate_text(model: LanguageModel, tokenizer, prompt: str, max_new_tokens: int, *,
                  key: jax.Array | None = None, temperature: float = 1.0,
                  stop_at_eos: bool = True) -> str:
    """The decoded continuation of the string ``prompt`` (:func:`generate`).

    Args:
      model: a language model whose mixers keep a decode cache.
      tokenizer: an object with ``encode(str) -> ids`` and ``decode(ids) -> str``, and an
        optional ``eos_id``.
      prompt: the text to continue.
      max_new_tokens: the number of tokens to generate, a positive int.
      key: a PRNG key for sampling; ``None`` means greedy decoding.
      temperature: the sampling temperature, positive.
      stop_at_eos: whether to cut the continuation at the first ``tokenizer.eos_id``.

    Returns:
      The decoded new tokens, a str.

    Raises:
      TypeError: if ``prompt`` is not a str.
      ValueError: as :func:`generate`.
    """
    if not isinstance(prompt, str):
        raise TypeError(f"prompt must be a str, got {type(prompt).__name__}")
    ids = tokenizer.encode(prompt)
    new = list(generate(model, ids, max_new_tokens, key=key, temperature=temperature))
    eos = getattr(tokenizer, "eos_id", None)
    if stop_at_eos and eos is not None and eos in new:
        new = new[: new.index(eos)]
    return tokenizer.decode(new)


