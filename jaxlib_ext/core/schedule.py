"""The learning-rate schedule of a run, as a record that checkpoints carry.

A :class:`WarmupCosine` is a plain frozen record (kind, peak learning rate, warm-up,
total steps, end value) that builds the optax schedule and round-trips through a
checkpoint's JSON metadata, so a resumed run can check that it follows the same curve::

    lr(t) = peak * t / warmup                                      for t < warmup
    lr(t) = end + (peak - end) * (1 + cos(pi * (t - warmup) / (total - warmup))) / 2
                                                                   for warmup <= t < total
    lr(t) = end                                                    for t >= total

(``optax.warmup_cosine_decay_schedule(0, peak, warmup, total, end)``). Past ``total`` the
schedule holds its end value; that is what lets a run be extended without changing the
curve it has already followed (:meth:`WarmupCosine.extended_to`).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

__all__ = ["WarmupCosine", "ScheduleMismatchError", "warmup_cosine"]


class ScheduleMismatchError(ValueError):
    """A resumed run asks for another schedule than the one its checkpoint recorded.

    Args:
      message: the error message.
      fields: the differing fields of :class:`WarmupCosine`.

    Attributes:
      fields: the differing fields of :class:`WarmupCosine`.
    """

    def __init__(self, message: str, fields: tuple[str, ...]):
        super().__init__(message)
        self.fields = fields


@dataclasses.dataclass(frozen=True)
class WarmupCosine:
    """Linear warm-up from 0 to ``peak_lr`` over ``warmup_steps``, cosine decay to
    ``end_lr`` at ``total_steps``, then ``end_lr`` held (equations in the module doc).

    Attributes:
      peak_lr: the peak learning rate, positive and finite.
      warmup_steps: the warm-up's length, ``>= 0``.
      total_steps: the step where the decay ends, ``> warmup_steps``.
      end_lr: the final learning rate.
      kind: the record's kind, ``"warmup_cosine"``.

    Raises:
      ValueError: if a field is out of range.
    """

    peak_lr: float
    warmup_steps: int
    total_steps: int
    end_lr: float
    kind: str = "warmup_cosine"

    def __post_init__(self):
        if self.kind != "warmup_cosine":
            raise ValueError(f"WarmupCosine.kind must be 'warmup_cosine', got {self.kind!r}")
        if not (math.isfinite(self.peak_lr) and self.peak_lr > 0):
            raise ValueError(f"peak_lr must be positive and finite, got {self.peak_lr}")
        if self.warmup_steps < 0:
            raise ValueError(f"warmup_steps must be >= 0, got {self.warmup_steps}")
        if self.total_steps <= self.warmup_steps:
            raise ValueError(
                f"total_steps ({self.total_steps}) must exceed warmup_steps "
                f"({self.warmup_steps})"
            )

    def to_optax(self):
        """The ``optax.warmup_cosine_decay_schedule`` of this record."""
        import optax

        return optax.warmup_cosine_decay_schedule(
            0.0, self.peak_lr, self.warmup_steps, self.total_steps, self.end_lr
        )

    def to_dict(self) -> dict[str, Any]:
        """The fields as a JSON-ready dict."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, record: dict[str, Any]) -> WarmupCosine:
        """The schedule of a :meth:`to_dict` record."""
        return cls(**record)

    def extended_to(self, steps: int) -> WarmupCosine:
        """The schedule for a run of ``steps`` that keeps this curve unchanged.

        The rule: every step up to ``total_steps`` gets the recorded value, every added
        step the recorded end value. The record itself is returned (the optax schedule
        already holds its end value past ``total_steps``); ``steps`` is only checked.

        Args:
          steps: the run's new length, positive.

        Returns:
          This schedule.

        Raises:
          ValueError: if ``steps`` is not positive.
        """
        if steps <= 0:
            raise ValueError(f"steps must be positive, got {steps}")
        return self

    def mismatch(self, recorded: WarmupCosine) -> tuple[str, ...]:
        """The fields in which this schedule differs from ``recorded``.

        Args:
          recorded: the schedule a checkpoint recorded.

        Returns:
          The names of the differing fields (empty when equal).
        """
        mine, theirs = self.to_dict(), recorded.to_dict()
        return tuple(k for k in mine if mine[k] != theirs[k])


def warmup_cosine(peak_lr: float, steps: int, warmup: int | None = None) -> WarmupCosine:
    """The default recipe for a run of ``steps``.

    Warm-up over 10% of the run (at least 1, at most 100 steps), cosine decay to 10% of
    ``peak_lr`` at the end of the run.

    Args:
      peak_lr: the peak learning rate.
      steps: the run's length, positive.
      warmup: the warm-up's length; ``None`` means the recipe's.

    Returns:
      The :class:`WarmupCosine`.

    Raises:
      ValueError: if ``steps`` is not positive, or as :class:`WarmupCosine`.
    """
    if steps <= 0:
        raise ValueError(f"steps must be positive, got {steps}")
    warmup = max(1, min(steps // 10, 100)) if warmup is None else warmup
    return WarmupCosine(
        peak_lr=float(peak_lr),
        warmup_steps=int(warmup),
        total_steps=max(int(steps), warmup + 1),
        end_lr=float(peak_lr) * 0.1,
    )
