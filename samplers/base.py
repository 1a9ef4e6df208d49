"""The sampler contract every family in :mod:`jaxlib_ext.samplers` follows (BlackJAX's shape).

A sampler module offers three layers:

- ``init(position, ...) -> State``: the chain's state from a position (a key only where the
  state itself holds randomness, and then as ``rng_key``).
- ``build_kernel(...) -> kernel`` with ``kernel(rng_key, state, ...) -> (state, info)``: one
  transition, pure and jit-able. ``State`` and ``Info`` are NamedTuples of arrays; ``Info``
  holds diagnostics only (nothing the next step reads).
- a top-level constructor that closes over the target and the settings and returns a
  :class:`SamplingAlgorithm` ``(init, step)`` with ``step(rng_key, state) -> (state, info)``.

So any sampler runs in the same loop::

    algo = sampler(...)
    state = algo.init(position)
    def body(state, key):
        state, info = algo.step(key, state)
        return state, info
    state, infos = jax.lax.scan(body, state, jax.random.split(rng_key, num_steps))

Drivers (``sample``, ``run``, ``solve``) are built on these pieces.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import jax

__all__ = ["SamplingAlgorithm", "scan_kernel"]


class SamplingAlgorithm(NamedTuple):
    """A sampler with its target and settings bound: ``init(position, ...) -> state`` and
    ``step(rng_key, state) -> (state, info)``."""

    init: Callable
    step: Callable


def scan_kernel(step: Callable, rng_key, state, num_steps: int):
    """Run a transition kernel for ``num_steps`` steps under ``lax.scan``.

    Each step gets its own key, split from ``rng_key``.

    Args:
      step: the kernel, ``step(rng_key, state) -> (state, info)``.
      rng_key: a PRNG key.
      state: the initial state.
      num_steps: the number of steps, ``>= 1``.

    Returns:
      ``(state, infos)``: the last state and the infos stacked along a leading ``num_steps``
      axis.

    Raises:
      ValueError: when ``num_steps < 1``.
    """
    if int(num_steps) < 1:
        raise ValueError(f"num_steps must be >= 1, got {num_steps}")

    def body(state, key):
        return step(key, state)

    return jax.lax.scan(body, state, jax.random.split(rng_key, int(num_steps)))
