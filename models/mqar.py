"""Synthetic sequence tasks that probe a token mixer's memory.

Multi-query associative recall (MQAR, Arora et al., arXiv 2312.04927): a sequence lists
``n_pairs`` key-value pairs, then asks for ``n_queries`` of those keys again; after each query key
the model must emit the value stored with it. Keys and values come from disjoint halves of the
vocabulary (keys ``[0, n_keys)``, values ``[n_keys, 2 n_keys)``) and the pairs are redrawn for
every sequence, so the only way to answer is to write the pairs into the recurrent state (or
attend back to them) and read them out. Chance accuracy is ``1 / n_keys``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

__all__ = ["mqar_batch", "mqar_length"]


def mqar_length(n_pairs: int, n_queries: int) -> int:
    """Tokens per MQAR sequence: ``2 n_pairs`` for the pairs, ``2 n_queries`` for the queries.

    Args:
      n_pairs: key-value pairs per sequence.
      n_queries: queries per sequence.

    Returns:
      The sequence length ``L``, an int.
    """
    return 2 * n_pairs + 2 * n_queries


def mqar_batch(key: jax.Array, *, batch: int, n_keys: int = 32, n_pairs: int = 12,
               n_queries: int | None = None) -> tuple[jax.Array, jax.Array]:
    """One MQAR batch: ``tokens int32[batch, L]`` and ``mask bool[batch, L - 1]``.

    ``L = mqar_length(n_pairs, n_queries)``. ``mask[:, t]`` marks the positions whose *next*
    token is an answer (the query keys), i.e. where ``logits[:, t]`` is scored against
    ``tokens[:, t + 1]``. The keys of one sequence are distinct; values are drawn with
    replacement; the queried keys are a random subset, in random order.

    Args:
      key: a PRNG key; the batch is a pure function of it.
      batch: number of sequences.
      n_keys: size of the key alphabet (the vocabulary is ``2 n_keys``).
      n_pairs: key-value pairs per sequence, at most ``n_keys``.
      n_queries: queries per sequence, at most ``n_pairs`` (``None``: ``n_pairs``).

    Returns:
      ``(tokens, mask)``: ``tokens int32[batch, L]`` and ``mask bool[batch, L - 1]``.

    Raises:
      ValueError: if a count is not a positive int, ``n_pairs > n_keys`` or
        ``n_queries > n_pairs``.

    References:
      Arora et al., Zoology: Measuring and Improving Recall in Efficient Language Models,
      arXiv 2312.04927.
    """
    n_queries = n_pairs if n_queries is None else n_queries
    for name, value in (("batch", batch), ("n_keys", n_keys), ("n_pairs", n_pairs),
                        ("n_queries", n_queries)):
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive int, got {value!r}")
    if n_pairs > n_keys:
        raise ValueError(
            f"n_pairs ({n_pairs}) must be at most n_keys ({n_keys}): keys are distinct")
    if n_queries > n_pairs:
        raise ValueError(f"n_queries ({n_queries}) must be at most n_pairs ({n_pairs})")
    kk, kv, kq = jax.random.split(key, 3)
    keys = jax.vmap(lambda k: jax.random.permutation(k, n_keys)[:n_pairs])(
        jax.random.split(kk, batch))
    values = n_keys + jax.random.randint(kv, (batch, n_pairs), 0, n_keys)
    order = jax.vmap(lambda k: jax.random.permutation(k, n_pairs)[:n_queries])(
        jax.random.split(kq, batch))
    q_keys = jnp.take_along_axis(keys, order, 1)
    q_values = jnp.take_along_axis(values, order, 1)
    context = jnp.stack([keys, values], -1).reshape(batch, -1)
    queries = jnp.stack([q_keys, q_values], -1).reshape(batch, -1)
    tokens = jnp.concatenate([context, queries], 1).astype(jnp.int32)
    length = mqar_length(n_pairs, n_queries)
    answer_next = jnp.zeros((length,), bool).at[2 * n_pairs::2].set(True)  # query-key positions
    return tokens, jnp.broadcast_to(answer_next[:-1], (batch, length - 1))
