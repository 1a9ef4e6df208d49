"""A helper the sampler modules share: per-sample values broadcast against a batch."""

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
      ``v`` itself when it is a scalar (a Python number stays one: it keeps its weak type and
      Python's arithmetic), else ``v`` reshaped to ``v.shape + (1,) * (x.ndim - v.ndim)``.
    """
    if jnp.ndim(v) == 0:
        return v
    return jnp.reshape(v, jnp.shape(v) + (1,) * (jnp.ndim(x) - jnp.ndim(v)))
