"""The training-loop engine: a step function, a state and batches in; steps, logs and
checkpoints out. Every trainer of the library runs on it, so every trainer has the same
guarantees:

* **Steps.** ``state, metrics = step_fn(state, batch_fn(step))`` for ``step`` in
  ``[start, config.steps)``. ``batch_fn`` must be a pure function of the step (draw the batch
  from ``jax.random.fold_in(key, step)`` or a NumPy generator seeded by the step), and
  ``step_fn`` a pure function of its arguments: then a resumed run ends equal to an
  uninterrupted one, bit for bit.
* **Logging.** A tqdm bar (loss and throughput) and, every ``log_every`` steps and at the end,
  a row ``{"step", "loss", <every metric>, "<items>_per_s"}`` appended to ``history`` and, on
  process 0, to the JSONL file ``metrics_path``. On resume, the file's rows past the restored
  step are dropped first.
* **Checkpoints.** Orbax (:class:`~jaxlib_ext.core.checkpoint.Checkpointer`) every
  ``checkpoint_every`` steps and at the last step: the state as ``gather`` returns it (the pair
  ``(state, ema)`` with an EMA), with ``meta``, the step, the run's length and the
  learning-rate schedule recorded as JSON. A save that a crash interrupted is never read.
* **Resume.** With ``resume`` (the default), the run starts from the newest *committed*
  checkpoint in ``checkpoint_dir``, or from the given state when there is none. A resume whose
  schedule differs from the recorded one raises
  :class:`~jaxlib_ext.core.schedule.ScheduleMismatchError`; a longer run on the same curve
  passes (a :class:`~jaxlib_ext.core.schedule.WarmupCosine` holds its final value past its end:
  the recorded rule of :meth:`~jaxlib_ext.core.schedule.WarmupCosine.extended_to`).
* **Non-finite loss.** A NaN or Inf loss stops the run with :class:`NonFiniteLossError`,
  which names the step and the last good checkpoint; the bad state is never saved.
* **EMA.** With ``ema`` the engine keeps an exponential moving average of
  ``ema.select(state)`` (``decay`` fixed, or ``min(decay, (1 + t) / (10 + t))`` with
  ``warmup``), checkpointed beside the state and returned in :class:`LoopResult`.
* **Time limit.** ``max_seconds`` stops the run early, after a checkpoint.

Several processes: every process calls :func:`run_loop` alike (the checkpoint saves are
collective); process 0 writes the metrics file and shows the bar.
"""

from __future__ import annotations

import dataclasses
import json
import math
import pathlib
import time
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxlib_ext.core.checkpoint import Checkpointer
from jaxlib_ext.core.schedule import ScheduleMismatchError

__all__ = ["EMA", "LoopConfig", "LoopResult", "NonFiniteLossError", "run_loop"]


class NonFiniteLossError(FloatingPointError):
    """The loss became NaN or Inf.

    Args:
      message: the error message.
      step: the step whose update produced it.
      last_good: the newest committed checkpoint's step, or ``None``.

    Attributes:
      step: the step whose update produced it (1-based: the number of steps done).
      last_good: the newest committed checkpoint's step, or ``None``.
    """

    def __init__(self, message: str, *, step: int | None = None, last_good: int | None = None):
        super().__init__(message)
        self.step, self.last_good = step, last_good


@dataclasses.dataclass(frozen=True)
class EMA:
    """An exponential moving average of part of the training state.

    ``ema <- d * ema + (1 - d) * select(state)`` after every step ``t`` (0-based), with
    ``d = decay``, or ``d = min(decay, (1 + t) / (10 + t))`` when ``warmup`` (the ramp of
    Tensorflow's ``ExponentialMovingAverage(num_updates=t)``, which lets the first steps count
    while the average is young). The average starts at ``select`` of the initial state.

    Attributes:
      decay: the decay ``d``, in ``[0, 1)``.
      warmup: whether ``d`` ramps up as ``min(decay, (1 + t) / (10 + t))``.
      select: ``state -> pytree``, the part of the state that is averaged (default all).

    Raises:
      ValueError: if ``decay`` is not in ``[0, 1)``.
    """

    decay: float
    warmup: bool = False
    select: Callable[[Any], Any] = lambda state: state

    def __post_init__(self):
        if not 0.0 <= self.decay < 1.0:
            raise ValueError(f"EMA.decay must be in [0, 1), got {self.decay}")

    def update(self, ema, state, t):
        """The average after step ``t`` has produced ``state``.

        Args:
          ema: the average so far, a pytree of ``select(state)``'s structure.
          state: the state after step ``t``.
          t: the 0-based step, an int32 scalar.

        Returns:
          The new average, each leaf in ``ema``'s dtype.
        """
        # a fixed decay stays a Python float, so that ``1 - decay`` is rounded once, from
        # double precision, into the leaves' dtype
        decay = self.decay
        if self.warmup:
            tf = t.astype(jnp.float32)
            decay = jnp.minimum(jnp.float32(self.decay), (1.0 + tf) / (10.0 + tf))
        return jax.tree.map(lambda e, p: (decay * e + (1.0 - decay) * p).astype(e.dtype),
                            ema, self.select(state))


@dataclasses.dataclass(frozen=True)
class LoopConfig:
    """What :func:`run_loop` does besides stepping (see the module docstring).

    Attributes:
      steps: the run's length; a resumed run continues up to it.
      log_every: steps between metrics rows (and the last step).
      checkpoint_every: steps between checkpoints; ``0``: only the last step. Needs
        ``checkpoint_dir``.
      checkpoint_dir: where checkpoints go; ``None``: none are written or read.
      max_to_keep: newest checkpoints kept.
      async_save: write checkpoints in the background while training continues.
      resume: start from the newest committed checkpoint in ``checkpoint_dir``, if any.
      metrics_path: the JSONL file of the metrics rows (process 0), or ``None``.
      progress: show a tqdm bar.
      desc: the bar's label.
      items_per_step: items (tokens, images) one step consumes, for the throughput column
        ``"<items_name>_per_s"``; ``None``: steps per second (``"steps_per_s"``).
      items_name: the throughput's unit.
      eval_every: steps between calls of ``evaluate`` (and the last step); ``0``: never.
      max_seconds: stop after the first step that ends past this wall time (with a
        checkpoint); ``None``: no limit.
      ema: the moving average to keep, or ``None``.
      schedule: the learning-rate schedule the step follows (an object with ``to_dict()``, or
        a dict), recorded with each checkpoint and checked on resume; ``None``: not checked.
      meta: JSON-serialisable record saved with every checkpoint.

    Raises:
      ValueError: if ``steps`` or ``log_every`` is below 1, a count is negative,
        ``checkpoint_every`` comes without ``checkpoint_dir``, or ``max_seconds`` is not
        positive.
    """

    steps: int
    log_every: int = 10
    checkpoint_every: int = 0
    checkpoint_dir: str | pathlib.Path | None = None
    max_to_keep: int = 3
    async_save: bool = True
    resume: bool = True
    metrics_path: str | pathlib.Path | None = None
    progress: bool = True
    desc: str = "train"
    items_per_step: int | None = None
    items_name: str = "items"
    eval_every: int = 0
    max_seconds: float | None = None
    ema: EMA | None = None
    schedule: Any = None
    meta: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    def __post_init__(self):
        for name in ("steps", "log_every"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"LoopConfig.{name} must be an int >= 1, got {v!r}")
        for name in ("checkpoint_every", "eval_every", "max_to_keep"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ValueError(f"LoopConfig.{name} must be an int >= 0, got {v!r}")
        if self.checkpoint_every and self.checkpoint_dir is None:
            raise ValueError("LoopConfig.checkpoint_every needs LoopConfig.checkpoint_dir")
        if self.max_seconds is not None and not self.max_seconds > 0:
            raise ValueError(f"LoopConfig.max_seconds must be > 0, got {self.max_seconds}")


class LoopResult(NamedTuple):
    """What :func:`run_loop` returns.

    Attributes:
      state: the final state, as ``gather`` returns it.
      ema: the moving average, ``None`` without ``ema``.
      history: the metrics rows of this call.
      start_step: the step it started from (``> 0`` when resumed).
      last_step: the step it stopped at (``config.steps`` unless ``max_seconds`` stopped
        it).
    """

    state: Any
    ema: Any
    history: list[dict]
    start_step: int
    last_step: int


def _schedule_record(schedule) -> dict | None:
    if schedule is None:
        return None
    record = schedule.to_dict() if hasattr(schedule, "to_dict") else dict(schedule)
    return json.loads(json.dumps(record))  # as it reads back from JSON


def _check_schedule(config: LoopConfig, meta: dict, step: int, directory) -> None:
    """A resumed run follows the schedule its checkpoint recorded, or stops here."""
    mine, recorded = _schedule_record(config.schedule), meta.get("schedule")
    if mine is None or recorded is None:
        return
    fields = tuple(sorted(k for k in {*mine, *recorded} if mine.get(k) != recorded.get(k)))
    if fields:
        raise ScheduleMismatchError(
            f"LoopConfig.schedule {mine} differs in {', '.join(fields)} from the schedule "
            f"recorded at step {step} in {directory}: {recorded}. A resumed run follows the "
            "recorded curve: pass it again (a longer run keeps it and holds its final value)",
            fields,
        )


def _first(x) -> float:
    """The value of a scalar metric (a ``pmap`` step returns one per local device)."""
    return float(np.asarray(x).reshape(-1)[0])


def _due(done: int, every: int, steps: int) -> bool:
    return done == steps or (every > 0 and done % every == 0)


class _Log:
    """The metrics rows (``history``, the JSONL file), the bar and the throughput."""

    def __init__(self, config: LoopConfig, start: int, main: bool):
        self.config, self.main = config, main
        self.history: list[dict] = []
        self.path = None if config.metrics_path is None else pathlib.Path(config.metrics_path)
        if main and self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            keep = []
            if start > 0 and self.path.exists():
                keep = [line for line in self.path.read_text().splitlines()
                        if line and json.loads(line).get("step", 0) <= start]
            self.path.write_text("".join(line + "\n" for line in keep))
        self.bar = None
        if main and config.progress:
            from tqdm.auto import tqdm

            self.bar = tqdm(total=config.steps, initial=start, desc=config.desc, unit="step",
                            dynamic_ncols=True)
        self.rate_key = (f"{config.items_name}_per_s" if config.items_per_step is not None
                         else "steps_per_s")
        self._t_last, self._since = time.perf_counter(), 0

    def write(self, row: dict) -> None:
        self.history.append(row)
        if self.main and self.path is not None:
            with self.path.open("a") as f:
                f.write(json.dumps(row) + "\n")

    def step(self, done: int, loss: float, metrics: Mapping) -> None:
        self._since += 1
        if self.bar is not None:
            self.bar.update(1)
        if not _due(done, self.config.log_every, self.config.steps):
            return
        now = time.perf_counter()
        rate = self._since * (self.config.items_per_step or 1) / max(now - self._t_last, 1e-9)
        row = {"step": done, "loss": loss}
        row.update({k: _first(v) for k, v in metrics.items() if k not in row})
        row[self.rate_key] = rate
        self._t_last, self._since = now, 0
        self.write(row)
        if self.bar is not None:
            self.bar.set_postfix(loss=f"{loss:.4g}", **{self.rate_key: f"{rate:.3g}"})

    def eval(self, done: int, values) -> None:
        values = values if isinstance(values, Mapping) else {"eval_loss": values}
        row = {"step": done, **{k: _first(v) for k, v in values.items()}}
        self.write(row)
        if self.bar is not None:
            shown = ", ".join(f"{k} {v:.4f}" for k, v in row.items() if k != "step")
            self.bar.write(f"step {done}: {shown}")

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def _identity(x):
    return x


def run_loop(
    step_fn: Callable[[Any, Any], tuple[Any, Mapping[str, Any]]],
    state: Any,
    batch_fn: Callable[[int], Any],
    config: LoopConfig,
    *,
    evaluate: Callable[[Any], Any] | None = None,
    place: Callable[[Any], Any] = _identity,
    gather: Callable[[Any], Any] = _identity,
) -> LoopResult:
    """Runs ``step_fn`` from ``state`` (or the newest checkpoint) to ``config.steps``.

    Args:
      step_fn: ``(state, batch) -> (state, metrics)``; ``metrics["loss"]`` is required, every
        other entry a scalar logged beside it. Usually jitted (and donating its state).
      state: the initial state in checkpoint form: a pytree of arrays (a NamedTuple, a dict)
        whose leaves carry the shardings a restore should give them.
      batch_fn: ``step -> batch``, a pure function of the 0-based step.
      config: :class:`LoopConfig`.
      evaluate: ``state -> float or {name: float}``, called every ``config.eval_every`` steps
        (a float is logged as ``eval_loss``).
      place: checkpoint form -> the form ``step_fn`` takes (a ``pmap`` step's per-device
        copies); identity by default.
      gather: the inverse of ``place``, for checkpoints, ``evaluate`` and the result.

    Returns:
      :class:`LoopResult`.

    Raises:
      NonFiniteLossError: the loss became NaN or Inf (the step and last good checkpoint named).
      ScheduleMismatchError: a resume asked for another schedule than the recorded one.
    """
    main = jax.process_index() == 0
    ema_cfg = config.ema
    # a copy: the step may donate the state's buffers
    ema = None if ema_cfg is None else jax.tree.map(lambda x: jnp.array(x, copy=True),
                                                    ema_cfg.select(state))
    ema_update = None if ema_cfg is None else jax.jit(ema_cfg.update)
    ckpt = None
    if config.checkpoint_dir is not None:
        ckpt = Checkpointer(config.checkpoint_dir, max_to_keep=config.max_to_keep,
                            async_save=config.async_save)
    log = None
    try:
        start = 0
        latest = ckpt.latest_step() if (ckpt is not None and config.resume) else None
        if latest is not None:
            _check_schedule(config, ckpt.restore_meta(latest), latest, ckpt.directory)
            abstract_ema = None if ema is None else _abstract(ema)
            restored, _ = ckpt.restore(latest, _saved(_abstract(state), abstract_ema))
            state, ema = restored if ema is not None else (restored, None)
            start = int(latest)
        log = _Log(config, start, main)
        state = place(state)
        t0 = time.perf_counter()
        done = start
        for step in range(start, config.steps):
            state, metrics = step_fn(state, batch_fn(step))
            done = step + 1
            loss = _first(metrics["loss"])
            if not math.isfinite(loss):
                raise _non_finite(loss, done, ckpt)
            if ema is not None:
                ema = ema_update(ema, state, jnp.asarray(step, jnp.int32))
            log.step(done, loss, metrics)
            if evaluate is not None and config.eval_every and _due(done, config.eval_every,
                                                                   config.steps):
                log.eval(done, evaluate(gather(state)))
            out_of_time = (config.max_seconds is not None
                           and time.perf_counter() - t0 > config.max_seconds)
            if ckpt is not None and (_due(done, config.checkpoint_every, config.steps)
                                     or out_of_time):
                ckpt.save(done, _saved(gather(state), ema), _meta(config, done))
            if out_of_time:
                break
    finally:
        if log is not None:
            log.close()
        if ckpt is not None:
            ckpt.close()
    return LoopResult(gather(state), ema, log.history, start, done)


def _saved(state, ema):
    """What a checkpoint holds: the state itself, or the pair ``(state, ema)`` with an EMA."""
    return state if ema is None else (state, ema)


def _abstract(tree):
    """``ShapeDtypeStruct``s of ``tree``'s leaves with their shardings (a restore target)."""
    def one(x):
        x = jnp.asarray(x) if not isinstance(x, jax.Array) else x
        return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding)

    return jax.tree.map(one, tree)


def _meta(config: LoopConfig, done: int) -> dict:
    meta = {**config.meta, "step": done, "steps": config.steps}
    record = _schedule_record(config.schedule)
    if record is not None:
        meta["schedule"] = record
    return meta


def _non_finite(loss: float, done: int, ckpt: Checkpointer | None) -> NonFiniteLossError:
    good = None
    if ckpt is not None:
        ckpt.wait()
        good = ckpt.latest_step()
    where = "none" if good is None else f"step {good} in {ckpt.directory}"
    return NonFiniteLossError(
        f"loss became {loss} at step {done}; stopped without saving it. Last good checkpoint: "
        f"{where}. Lower the learning rate or check the data, then resume from it.",
        step=done, last_good=good,
    )
