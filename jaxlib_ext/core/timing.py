"""Wall-clock timing of compiled JAX work: warm-up, then the median and spread of repeats.

Every call is blocked (``jax.block_until_ready``) before the clock stops, so the time is that of
the device work, not of the asynchronous dispatch. The first call (or ``warmup`` calls) compiles
and is not counted.

Three shapes of measurement cover the library's benchmarks:

- :func:`time_call`: a pure function called again and again on the same arguments;
- :func:`time_steps`: a step that carries its state, ``carry = step(carry)``;
- :func:`timed`: one blocked call and its seconds, for loops that interleave several
  contenders (then :func:`summarize` the collected seconds).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import jax
import numpy as np

__all__ = ["Timing", "summarize", "timed", "time_call", "time_steps"]


class Timing(NamedTuple):
    """Seconds per call over ``repeats`` timed calls: the median and the interquartile range.

    ``str(timing)`` reads ``"1.234 ms (IQR 1.200-1.300)"``.

    Attributes:
      median: the median seconds per call.
      q25: the 25th percentile.
      q75: the 75th percentile.
      repeats: the number of timed calls.
    """

    median: float
    q25: float
    q75: float
    repeats: int

    def __str__(self) -> str:
        return f"{self.median * 1e3:.3f} ms (IQR {self.q25 * 1e3:.3f}-{self.q75 * 1e3:.3f})"


def summarize(seconds: Sequence[float]) -> Timing:
    """The :class:`Timing` of a list of measured seconds.

    Args:
      seconds: the measurements, at least one.

    Returns:
      The :class:`Timing`.

    Raises:
      ValueError: if ``seconds`` is empty.
    """
    if len(seconds) < 1:
        raise ValueError("seconds must hold at least one measurement")
    s = np.asarray(seconds, np.float64)
    q25, median, q75 = np.percentile(s, [25, 50, 75])
    return Timing(float(median), float(q25), float(q75), int(s.size))


def _check_counts(warmup: int, repeats: int) -> None:
    if int(warmup) < 0:
        raise ValueError(f"warmup must be >= 0, got {warmup}")
    if int(repeats) < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")


def timed(fn: Callable, *args) -> tuple[Any, float]:
    """One blocked call and its seconds.

    Args:
      fn: the function.
      *args: its arguments.

    Returns:
      ``(fn(*args), seconds)``, the result blocked until ready before the clock stops.
    """
    t0 = time.perf_counter()
    out = jax.block_until_ready(fn(*args))
    return out, time.perf_counter() - t0


def time_call(fn: Callable, *args, warmup: int = 1, repeats: int = 5) -> Timing:
    """Time ``fn(*args)``: ``warmup`` untimed calls (compilation), then ``repeats`` timed ones.

    Args:
      fn: a function of arrays, usually jitted.
      *args: its arguments, the same for every call.
      warmup: untimed calls first.
      repeats: timed calls.

    Returns:
      The :class:`Timing` of the timed calls.

    Raises:
      ValueError: if ``warmup < 0`` or ``repeats < 1``.
    """
    _check_counts(warmup, repeats)
    for _ in range(int(warmup)):
        jax.block_until_ready(fn(*args))
    return summarize([timed(fn, *args)[1] for _ in range(int(repeats))])


def time_steps(step: Callable, carry, *, warmup: int = 1, repeats: int = 5):
    """Time a stateful step ``carry = step(carry)`` (a training or decoding step).

    Args:
      step: maps the carry to the next carry (any pytree).
      carry: the first carry.
      warmup: untimed steps first.
      repeats: timed steps.

    Returns:
      ``(timing, carry)``: the :class:`Timing` of the timed steps and the last carry.

    Raises:
      ValueError: if ``warmup < 0`` or ``repeats < 1``.
    """
    _check_counts(warmup, repeats)
    for _ in range(int(warmup)):
        carry = jax.block_until_ready(step(carry))
    seconds = []
    for _ in range(int(repeats)):
        carry, s = timed(step, carry)
        seconds.append(s)
    return summarize(seconds), carry
