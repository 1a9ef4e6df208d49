"""A helper the energy modules share: per-sample values broadcast against a batch."""

from __future__ import annotations

import jax.numpy as jnp

__all__ = ["expand_batch"]


def expand_batch(v, x):
    """``v`` (a scalar or of ``x``'s leading batch shape, ``[B]``) with unit axes appended so
    that it broadcasts against ``x`` ``[B, ...]`` sample by sample.

    Args:
      v: a scalar or an array whose shape is a prefix of ``x``'s.
      x: the batch ``[B, ...]``.

    Returns:
      ``v`` reshaped to ``v.shape + (1,) * (x.ndim - v.ndim)``.
    """
    return jnp.reshape(v, jnp.shape(v) + (1,) * (jnp.ndim(x) - jnp.ndim(v)))
