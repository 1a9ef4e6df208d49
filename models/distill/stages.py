"""Stages I and II of arXiv 2603.15590, each resumable from its own checkpoints.

* :func:`align_layers` (stage I, layer-wise alignment): the teacher is frozen; each student
  mixer is trained to map its teacher attention layer's cached input to that layer's cached
  output (:func:`~jaxlib_ext.models.distill.losses.alignment_loss`). Layers do not interact, so
  the mixers (one architecture) are stacked on a leading layer axis and trained together by one
  ``jax.vmap``-ed step, each with its own optimizer state; with ``shard_layers`` the layer axis
  is split over the devices (the most that divide the number of layers).
* :func:`distill_end_to_end` (stage II, end-to-end distillation): the whole student produces
  next-token logits and is trained on ``0.9 CE + 0.1 KL``
  (:func:`~jaxlib_ext.models.distill.losses.distillation_loss`: the data's next tokens and the
  teacher's cached top-k). The trained parameters are, by ``train``: every parameter
  (``"full"``, the paper's full fine-tuning), the token mixers' (``blocks[i].attn``,
  ``"mixers"``), or the mixers' plus low-rank adapters on the MLPs (``"lora"``, folded into the
  weights at the end).

Both stages run on the library's loop engine (:func:`jaxlib_ext.core.loop.run_loop`): Orbax
checkpoints in ``<folder>/checkpoints`` every ``checkpoint_every`` steps with the
learning-rate schedule recorded, a ``<folder>/metrics.jsonl`` row every ``log_every`` steps
(``"step"`` counts the steps done; ``"seconds"`` of wall time since the stage (re)started), a
resume from the newest committed checkpoint, and a stop with
:class:`~jaxlib_ext.core.loop.NonFiniteLossError` on a NaN or Inf loss. A finished stage
resumes at its last step and is loaded without training. Batches are a pure function of
``(seed, step)``, so a resumed stage ends where an uninterrupted one would.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import pathlib
import time
from collections.abc import Sequence
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from jaxlib_ext.core import loop
from jaxlib_ext.core.checkpoint import Checkpointer
from jaxlib_ext.core.schedule import WarmupCosine
from jaxlib_ext.models.distill.lora import LoRAParam, add_lora_to_mlps, merge_lora
from jaxlib_ext.models.distill.losses import CE_WEIGHT, alignment_loss, distillation_loss
from jaxlib_ext.models.distill.teacher_cache import TeacherCache

__all__ = [
    "STAGE2_TRAIN",
    "StageConfig",
    "StageResult",
    "NonFiniteLossError",
    "align_layers",
    "distill_end_to_end",
    "read_metrics",
]

#: What stage II trains: every parameter (the paper's full fine-tuning), the token mixers only,
#: or the mixers and LoRA adapters on the MLPs.
STAGE2_TRAIN = ("full", "mixers", "lora")

#: raised when a stage's loss becomes NaN or Inf; names the step and the last good checkpoint
NonFiniteLossError = loop.NonFiniteLossError


def _check_stage2_recipe(train: str, lora_rank: int, ce_weight: float, *, prefix: str = "",
                        train_name: str = "train") -> None:
    """Raises a ``ValueError`` naming the argument when stage II's ``train``, ``lora_rank`` and
    ``ce_weight`` do not fit together (:func:`distill_end_to_end`); ``prefix`` and
    ``train_name`` name them as the caller knows them."""
    if train not in STAGE2_TRAIN:
        raise ValueError(f"{prefix}{train_name} must be one of {STAGE2_TRAIN}, got {train!r}")
    if (train == "lora") != (lora_rank > 0):
        raise ValueError(f"{prefix}lora_rank: {train_name}={train!r} needs "
                         f"{'a positive lora_rank' if train == 'lora' else 'lora_rank=0'}, "
                         f"got {lora_rank}")
    if not 0.0 <= ce_weight <= 1.0:
        raise ValueError(f"{prefix}ce_weight must be in [0, 1], got {ce_weight}")


@dataclasses.dataclass(frozen=True)
class StageConfig:
    """One stage's optimisation.

    AdamW (no weight decay) with a linear warm-up over the first ``warmup_fraction`` of
    ``steps`` and a cosine decay to ``learning_rate / 10`` (:meth:`schedule`), gradients
    clipped to global norm ``clip_norm``.

    Attributes:
      steps: optimizer steps, a positive int.
      learning_rate: the peak learning rate, positive.
      batch_size: cached windows per step (per layer in stage I), a positive int.
      seed: the seed of the batches (and of the LoRA adapters in stage II).
      warmup_fraction: the fraction of the horizon spent warming up.
      clip_norm: the global gradient-norm clip.
      log_every: steps between metrics rows, a positive int.
      checkpoint_every: steps between checkpoints, a positive int.
      progress: whether to show a progress bar.

    Raises:
      ValueError: if a count is not a positive int or ``learning_rate`` is not positive.
    """

    steps: int = 100
    learning_rate: float = 1e-3
    batch_size: int = 4
    seed: int = 0
    warmup_fraction: float = 0.1
    clip_norm: float = 1.0
    log_every: int = 10
    checkpoint_every: int = 50
    progress: bool = True

    def __post_init__(self):
        for name in ("steps", "batch_size", "log_every", "checkpoint_every"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"StageConfig.{name} must be a positive int, got {value!r}")
        if not self.learning_rate > 0:
            raise ValueError(
                f"StageConfig.learning_rate must be positive, got {self.learning_rate}"
            )

    def schedule(self, horizon: int | None = None) -> WarmupCosine:
        r"""The learning rate of step ``t``, over a curve of ``horizon`` steps.

        With ``w = max(1, floor(warmup_fraction * horizon))``, ``T = max(horizon, w + 1)`` and
        ``eta = learning_rate``,

        .. math::
            \eta_t = \eta\, t / w \ (t < w), \quad
            \eta_t = \tfrac{\eta}{10} + \tfrac{9\eta}{20}
                     \bigl(1 + \cos \tfrac{\pi (t - w)}{T - w}\bigr) \ (w \le t < T), \quad
            \eta_t = \eta / 10 \ (t \ge T)

        (``optax.warmup_cosine_decay_schedule(0, eta, w, T, eta / 10)``).

        Args:
          horizon: the curve's length in steps; ``None`` means ``steps``.

        Returns:
          The :class:`~jaxlib_ext.core.schedule.WarmupCosine`.
        """
        horizon = self.steps if horizon is None else int(horizon)
        warmup = max(1, int(self.warmup_fraction * horizon))
        return WarmupCosine(peak_lr=self.learning_rate, warmup_steps=warmup,
                            total_steps=max(horizon, warmup + 1),
                            end_lr=self.learning_rate / 10)

    def optimizer(self, horizon: int | None = None) -> optax.GradientTransformation:
        """The stage's optax transformation (schedule :meth:`schedule`).

        One object per setting, so that the compiled steps (which take it as a static
        argument) are reused across calls.

        Args:
          horizon: the schedule's length in steps; ``None`` means ``steps``.

        Returns:
          ``optax.chain(clip_by_global_norm(clip_norm), adamw(schedule, weight_decay=0))``.
        """
        return _optimizer(self.schedule(horizon), self.clip_norm)


@functools.lru_cache(maxsize=64)
def _optimizer(schedule: WarmupCosine, clip_norm: float):
    return optax.chain(optax.clip_by_global_norm(clip_norm),
                       optax.adamw(schedule.to_optax(), weight_decay=0.0))


class StageResult(NamedTuple):
    """A finished stage.

    Attributes:
      trained: the trained modules (stage I: the list of mixers; stage II: the student).
      metrics: the logged metrics rows of the whole stage.
      start_step: the step it started from (> 0 when resumed).
    """

    trained: object
    metrics: list
    start_step: int


def read_metrics(directory: str | pathlib.Path) -> list[dict]:
    """The rows of a stage folder's ``metrics.jsonl``.

    Args:
      directory: the stage folder.

    Returns:
      The list of row dicts, empty when there is no file.
    """
    path = pathlib.Path(directory) / "metrics.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _check_folder(directory: pathlib.Path, name: str, meta: dict) -> None:
    """Refuses checkpoints of another stage setting in ``directory`` (the engine checks only
    the schedule, which does not see the layers, the cache or the adapters)."""
    ckpt_dir = directory / "checkpoints"
    if not ckpt_dir.exists():
        return
    with Checkpointer(ckpt_dir, read_only=True) as ckpt:
        step = ckpt.latest_step()
        recorded = {} if step is None else ckpt.restore_meta(step)
    for key, value in meta.items():
        if key in recorded and recorded[key] != value:
            raise ValueError(
                f"{name}: the checkpoints in {str(directory)!r} were written with "
                f"{key}={recorded[key]!r}, this run has {value!r}; use another folder"
            )


def _run(step_fn, state, batch_fn, config: StageConfig, directory, name: str, meta: dict, *,
         horizon: int | None, tokens_per_step: int) -> loop.LoopResult:
    """Runs one stage on the loop engine, checkpointing into ``directory``."""
    directory = pathlib.Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    _check_folder(directory, name, meta)
    t0 = time.perf_counter()

    def timed(state, batch):  # the "seconds" column: wall time since the stage (re)started
        state, metrics = step_fn(state, batch)
        return state, {**metrics, "seconds": round(time.perf_counter() - t0, 3)}

    cfg = loop.LoopConfig(
        steps=config.steps, log_every=config.log_every,
        checkpoint_every=config.checkpoint_every, checkpoint_dir=directory / "checkpoints",
        max_to_keep=2, metrics_path=directory / "metrics.jsonl", progress=config.progress,
        desc=name, items_per_step=tokens_per_step, items_name="tokens",
        schedule=config.schedule(horizon), meta=meta)
    return loop.run_loop(timed, state, batch_fn, cfg)


def _batch_indices(seed: int, step: int, n: int, batch_size: int) -> np.ndarray:
    rng = np.random.default_rng([seed, step])
    return np.sort(rng.choice(n, size=min(batch_size, n), replace=False))


# --------------------------------------------------------------------------- stage I


@functools.partial(jax.jit, static_argnums=(0, 1), donate_argnums=(2, 4))
def _align_step(graphdef, tx, params, rest, opt_state, x, y):
    def one(p, r, o, xi, yi):
        def loss_fn(p):
            mixer = nnx.merge(graphdef, p, r)
            return alignment_loss(mixer(xi)[0], yi)

        loss, grads = jax.value_and_grad(loss_fn)(p)
        updates, o = tx.update(grads, o, p)
        return optax.apply_updates(p, updates), o, loss

    return jax.vmap(one)(params, rest, opt_state, x, y)


def _stack(trees):
    return jax.tree.map(lambda *xs: jnp.stack(xs), *trees)


def _unstack(tree, n):
    return [jax.tree.map(lambda x, i=i: x[i], tree) for i in range(n)]


def _shard_layer_axis(tree, n_layers):
    """``tree`` with its leading (layer) axis split over the most devices that divide it."""
    devices = jax.devices()
    n = max(d for d in range(1, len(devices) + 1) if n_layers % d == 0)
    if n < 2:
        return tree
    mesh = jax.sharding.Mesh(np.array(devices[:n]), ("layers",))
    spec = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("layers"))
    return jax.device_put(tree, spec)


def _per_layer(row: dict, layers: Sequence[int]) -> dict:
    """A stage I metrics row with ``"loss"`` as the list of per-layer losses (the file holds
    their mean as ``"loss"`` and each as ``"loss_layer<i>"``)."""
    keys = [f"loss_layer{i}" for i in layers]
    if not all(k in row for k in keys):
        return row
    out = {k: v for k, v in row.items() if k not in keys}
    out["mean_loss"], out["loss"] = row["loss"], [row[k] for k in keys]
    return out


def align_layers(mixers: Sequence[nnx.Module], cache: TeacherCache, layers: Sequence[int],
                 config: StageConfig, directory: str | pathlib.Path, *,
                 shard_layers: bool = False, desc: str = "stage I",
                 schedule_steps: int | None = None, trainable=nnx.Param) -> StageResult:
    r"""Stage I: trains ``mixers[j]`` to reproduce the cached teacher attention layer
    ``layers[j]`` (module docstring); the mixers are not changed, trained copies are returned
    (``StageResult.trained``).

    Each mixer ``f_j`` minimises the relative MSE
    ``||f_j(x_l) - y_l||^2 / ||y_l||^2`` on the cached input ``x_l`` and output ``y_l`` of
    teacher layer ``l = layers[j]`` (arXiv 2603.15590, stage I), all layers in one ``vmap``-ed
    step. The engine logs the mean over layers as ``"loss"`` (what the NaN stop watches) and
    each layer's as ``"loss_layer<l>"``; the rows of ``StageResult.metrics`` read
    ``{"step", "loss": [per layer], "mean_loss", "seconds", "tokens_per_s"}``.

    Args:
      mixers: the student mixers, of one architecture (one ``nnx`` graph), as the student's.
      cache: the teacher cache holding ``layers``.
      layers: the teacher layer of each mixer.
      config: the stage's optimisation.
      directory: the stage folder (checkpoints, ``metrics.jsonl``); a rerun resumes from it.
      shard_layers: split the layer axis over the devices.
      desc: the progress bar's label.
      schedule_steps: the horizon of the learning-rate schedule (default ``config.steps``):
        a run of fewer steps stops partway along the curve, and a later call with more steps
        continues it.
      trainable: an ``nnx`` filter of the mixer parameters trained (default every
        ``nnx.Param``); the others stay as they are. The pipeline passes the parameters the
        teacher layer does not have (:func:`~jaxlib_ext.models.distill.new_parameters`).

    Returns:
      The :class:`StageResult` of the trained mixers.

    Raises:
      ValueError: if ``mixers`` and ``layers`` do not pair up, the mixers differ in
        architecture, ``trainable`` selects no parameter, a layer is not in the cache, or
        ``directory`` holds checkpoints of another setting.
      NonFiniteLossError: on a NaN or Inf loss.

    References:
      Hauzenberger et al., Effective Distillation to Hybrid xLSTM Architectures,
      arXiv 2603.15590.
    """
    mixers, layers = list(mixers), [int(i) for i in layers]
    if len(mixers) != len(layers) or not mixers:
        raise ValueError(f"mixers ({len(mixers)}) and layers ({len(layers)}) must pair up")
    splits = [nnx.split(m, trainable, ...) for m in mixers]
    graphdef = splits[0][0]
    if any(g != graphdef for g, _, _ in splits):
        raise ValueError("mixers: stage I trains mixers of one architecture (one nnx graph)")
    if not jax.tree.leaves(splits[0][1]):
        raise ValueError("trainable: selects no parameter of the mixers")
    trained_paths = sorted(".".join(map(str, path)) for path, _ in
                           nnx.to_flat_state(splits[0][1]))
    for i in layers:
        cache.layer_io(i)  # names an uncached layer
    tx = config.optimizer(schedule_steps)
    params = _stack([p for _, p, _ in splits])
    rest = _stack([r for _, _, r in splits])
    state = {"params": params, "opt_state": jax.vmap(tx.init)(params)}
    if shard_layers:  # the restore follows the shardings of the initial state
        state, rest = _shard_layer_axis((state, rest), len(layers))
    ios = [cache.layer_io(i) for i in layers]

    def batch_fn(step):
        idx = _batch_indices(config.seed, step, len(cache), config.batch_size)
        x = jnp.asarray(np.stack([xi[idx] for xi, _ in ios]), jnp.float32)
        y = jnp.asarray(np.stack([yi[idx] for _, yi in ios]), jnp.float32)
        return x, y

    def step_fn(state, batch):
        params, opt_state, loss = _align_step(graphdef, tx, state["params"], rest,
                                              state["opt_state"], *batch)
        loss = np.asarray(loss)
        metrics = {"loss": float(loss.mean())}
        metrics.update({f"loss_layer{i}": float(v) for i, v in zip(layers, loss, strict=True)})
        return {"params": params, "opt_state": opt_state}, metrics

    seq_len = ios[0][0].shape[1]
    result = _run(step_fn, state, batch_fn, config, directory, desc,
                  {"stage": "align", "layers": layers, "cache": cache.spec.windows,
                   "trained": trained_paths},
                  horizon=schedule_steps,
                  tokens_per_step=min(config.batch_size, len(cache)) * seq_len)
    trained = [nnx.merge(graphdef, p, r) for p, r in
               zip(_unstack(result.state["params"], len(layers)), _unstack(rest, len(layers)),
                   strict=True)]
    rows = [_per_layer(r, layers) for r in read_metrics(directory)]
    return StageResult(trained, rows, result.start_step)


# --------------------------------------------------------------------------- stage II


def _trainable(train: str):
    mixers = nnx.All(nnx.Param, nnx.PathContains("attn"))
    return {"full": nnx.Param, "mixers": mixers, "lora": nnx.Any(mixers, LoRAParam)}[train]


@functools.partial(jax.jit, static_argnums=(0, 1, 2), donate_argnums=(3, 5))
def _kd_step(graphdef, tx, ce_weight, params, frozen, opt_state, tokens, log_probs, ids):
    def loss_fn(p):
        model = nnx.merge(graphdef, p, frozen)
        logits = model(tokens[:, :-1])
        return distillation_loss(logits, tokens[:, 1:], log_probs, ids, ce_weight=ce_weight)

    (loss, parts), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss, parts


def distill_end_to_end(student, cache: TeacherCache, config: StageConfig,
                       directory: str | pathlib.Path, *, train: str = "full",
                       ce_weight: float = CE_WEIGHT, lora_rank: int = 0,
                       lora_alpha: float | None = None, desc: str = "stage II",
                       schedule_steps: int | None = None) -> StageResult:
    r"""Stage II: end-to-end distillation of a copy of ``student`` (a
    :class:`~jaxlib_ext.models.LanguageModel` whose mixers may be students) on the cached
    teacher windows; returns the trained copy (LoRA folded in).

    The loss is ``w CE + (1 - w) KL_S`` (arXiv 2603.15590, stage II: ``w = 0.9``;
    :func:`~jaxlib_ext.models.distill.losses.distillation_loss`): the next-token cross-entropy
    on the cached tokens and the KL divergence of the student from the teacher on the
    teacher's top ``k`` tokens plus one bucket for all others
    (:func:`~jaxlib_ext.models.distill.losses.sparse_kd_loss`), each averaged over positions.
    Metrics rows: ``{"step", "loss", "ce", "kl", "seconds", "tokens_per_s"}`` (nats per
    token).

    Args:
      student: the model to distil (not changed).
      cache: the teacher cache (same vocabulary as ``student``).
      config: the stage's optimisation.
      directory: the stage folder (checkpoints, ``metrics.jsonl``); a rerun resumes from it.
      train: what is trained, one of :data:`STAGE2_TRAIN`: ``"full"`` (every parameter, the
        paper's full fine-tuning; default), ``"mixers"`` (the token mixers ``blocks[i].attn``)
        or ``"lora"`` (the mixers and rank-``lora_rank`` adapters on the MLPs).
      ce_weight: ``w``, the cross-entropy's weight in ``[0, 1]`` (``0``: pure sparse KD).
      lora_rank: rank of the adapters added to the MLPs, positive with ``train="lora"`` and
        0 otherwise.
      lora_alpha: the adapters' scale numerator (default: the rank).
      desc: the progress bar's label.
      schedule_steps: the horizon of the learning-rate schedule (default ``config.steps``),
        as in :func:`align_layers`.

    Returns:
      The :class:`StageResult` of the trained student.

    Raises:
      ValueError: if ``train`` is unknown, ``lora_rank`` does not fit ``train``,
        ``ce_weight`` is outside ``[0, 1]``, the student's vocabulary differs from the
        cache's, or ``directory`` holds checkpoints of another setting.
      NonFiniteLossError: on a NaN or Inf loss.

    References:
      Hauzenberger et al., Effective Distillation to Hybrid xLSTM Architectures,
      arXiv 2603.15590.
    """
    _check_stage2_recipe(train, lora_rank, ce_weight)
    if student.cfg.vocab_size != cache.spec.vocab_size:
        raise ValueError(
            f"student: vocabulary of {student.cfg.vocab_size} tokens, the teacher cache has "
            f"{cache.spec.vocab_size} (teacher and student must share one tokenizer)"
        )
    model = nnx.clone(student)
    if lora_rank:
        add_lora_to_mlps(model, lora_rank, alpha=lora_alpha, rngs=nnx.Rngs(config.seed))
    graphdef, params, frozen = nnx.split(model, _trainable(train), ...)
    params = jax.tree.map(jnp.copy, params)  # the step donates them; the student keeps its own
    tx = config.optimizer(schedule_steps)
    state = {"params": params, "opt_state": tx.init(params)}
    t = cache.spec.seq_len
    ce_weight = float(ce_weight)

    def batch_fn(step):
        idx = _batch_indices(config.seed, step, len(cache), config.batch_size)
        return (jnp.asarray(cache.tokens[idx, : t + 1], jnp.int32),
                jnp.asarray(cache.top_log_probs[idx]), jnp.asarray(cache.top_ids[idx]))

    def step_fn(state, batch):
        p, o, loss, parts = _kd_step(graphdef, tx, ce_weight, state["params"], frozen,
                                     state["opt_state"], *batch)
        return {"params": p, "opt_state": o}, {"loss": loss, **parts}

    result = _run(step_fn, state, batch_fn, config, directory, desc,
                  {"stage": "kd", "train": train, "ce_weight": ce_weight,
                   "lora_rank": lora_rank, "cache": cache.spec.windows},
                  horizon=schedule_steps,
                  tokens_per_step=min(config.batch_size, len(cache)) * t)
    model = nnx.merge(graphdef, result.state["params"], frozen)
    merge_lora(model)
    return StageResult(model, read_metrics(directory), result.start_step)
