"""Stages I and II of arXiv 2603.15590, each resumable from its own checkpoints.

* :func:`align_layers` (stage I, layer-wise alignment): the teacher is frozen; each student
  mixer is trained to map its teacher attention layer's cached input to that layer's cached
  output (:func:`~jaxlib_ext.models.distill.losses.alignment_loss`). Layers do not interact, so
  the mixers (one architecture) are stacked on a leading layer axis and trained together by one
  ``jax.vmap``-ed step, each with its own optimizer state; with ``shard_layers`` the layer axis
  is split over the devices (the most that divide the number of layers).
* :func:`distill_end_to_end` (stage II, sparse knowledge distillation): the whole student
  produces next-token logits and is trained on
  :func:`~jaxlib_ext.models.distill.losses.sparse_kd_loss` against the teacher's cached top-k.
  The trained parameters are the token mixers' (``blocks[i].attention``), plus low-rank
  adapters on the MLPs when ``lora_rank > 0`` (folded into the weights at the end).

Each stage writes Orbax checkpoints (:class:`jaxlib_ext.core.checkpoint.Checkpointer`) and a
``metrics.jsonl`` into its folder (rows ``{"step", "loss", "seconds"}``, ``seconds`` of wall
time since the stage (re)started); a rerun resumes from the newest checkpoint, and a finished
stage (its last checkpoint marked done) is loaded without training. Batches are a pure function
of ``(seed, step)``, so a resumed stage ends where an uninterrupted one would.
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

from jaxlib_ext.core.checkpoint import Checkpointer
from jaxlib_ext.models.distill.lora import LoRAParam, add_lora_to_mlps, merge_lora
from jaxlib_ext.models.distill.losses import alignment_loss, sparse_kd_loss
from jaxlib_ext.models.distill.teacher_cache import TeacherCache

__all__ = [
    "StageConfig",
    "StageResult",
    "NonFiniteLossError",
    "align_layers",
    "distill_end_to_end",
    "read_metrics",
]


class NonFiniteLossError(FloatingPointError):
    """A stage's loss became NaN or Inf; names the step."""


@dataclasses.dataclass(frozen=True)
class StageConfig:
    """One stage's optimisation: AdamW (no weight decay) with a linear warm-up over the first
    ``warmup_fraction`` of ``steps`` and a cosine decay to ``learning_rate / 10``, gradients
    clipped to global norm ``clip_norm``; ``batch_size`` cached windows per step (per layer in
    stage I), logs every ``log_every`` steps and checkpoints every ``checkpoint_every``."""

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

    def optimizer(self) -> optax.GradientTransformation:
        """The stage's optax transformation; one object per setting, so that the compiled
        steps (which take it as a static argument) are reused across calls."""
        return _optimizer(self.steps, self.learning_rate, self.warmup_fraction, self.clip_norm)


@functools.lru_cache(maxsize=64)
def _optimizer(steps, learning_rate, warmup_fraction, clip_norm):
    warmup = max(1, int(warmup_fraction * steps))
    schedule = optax.warmup_cosine_decay_schedule(
        0.0, learning_rate, warmup, max(steps, warmup + 1), end_value=learning_rate / 10)
    return optax.chain(optax.clip_by_global_norm(clip_norm),
                       optax.adamw(schedule, weight_decay=0.0))


class StageResult(NamedTuple):
    """A finished stage: the trained modules (stage I: the list of mixers; stage II: the
    student), the logged metrics rows of the whole stage and the step it started from (> 0 when
    resumed)."""

    trained: object
    metrics: list
    start_step: int


def read_metrics(directory: str | pathlib.Path) -> list[dict]:
    """The rows of a stage folder's ``metrics.jsonl`` (empty when none)."""
    path = pathlib.Path(directory) / "metrics.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _abstract(tree):
    return jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=getattr(x, "sharding", None)),
        tree,
    )


class _Run:
    """Checkpoints, metrics file and progress bar of one stage."""

    def __init__(self, directory, cfg: StageConfig, name: str, meta: dict):
        self.directory = pathlib.Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.cfg, self.name, self.meta = cfg, name, meta
        self.ckpt = Checkpointer(self.directory / "checkpoints", max_to_keep=2)
        self.bar = None

    def restore(self, state):
        """``(state, start_step, done)`` from the newest checkpoint, or the given state."""
        step = self.ckpt.latest_step()
        if step is None:
            (self.directory / "metrics.jsonl").unlink(missing_ok=True)
            return state, 0, False
        meta = self.ckpt.restore_meta(step)
        for key, value in self.meta.items():
            if key in meta and meta[key] != value:
                raise ValueError(
                    f"{self.name}: the checkpoints in {str(self.directory)!r} were written with "
                    f"{key}={meta[key]!r}, this run has {value!r}; use another folder"
                )
        state, _ = self.ckpt.restore(step, _abstract(state))
        rows = [r for r in read_metrics(self.directory) if r["step"] < step]
        (self.directory / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        return state, step, bool(meta.get("done"))

    def start(self, start):
        self.t0 = time.perf_counter()
        if self.cfg.progress:
            from tqdm.auto import tqdm

            self.bar = tqdm(total=self.cfg.steps, initial=start, desc=self.name, unit="step")

    def log(self, step, row: dict, show: str):
        with open(self.directory / "metrics.jsonl", "a") as f:
            seconds = round(time.perf_counter() - self.t0, 3)
            f.write(json.dumps({"step": step, **row, "seconds": seconds}) + "\n")
        if self.bar is not None:
            self.bar.set_postfix_str(show)

    def advance(self):
        if self.bar is not None:
            self.bar.update(1)

    def save(self, step, state, done=False):
        self.ckpt.save(step, state, {**self.meta, "done": done})

    def close(self):
        if self.bar is not None:
            self.bar.close()
        self.ckpt.close()


def _batch_indices(seed: int, step: int, n: int, batch_size: int) -> np.ndarray:
    rng = np.random.default_rng([seed, step])
    return np.sort(rng.choice(n, size=min(batch_size, n), replace=False))


def _check_finite(loss, step, name):
    if not np.all(np.isfinite(loss)):
        raise NonFiniteLossError(f"{name}: non-finite loss {loss} at step {step}")


# --------------------------------------------------------------------------- stage I


@functools.partial(jax.jit, static_argnums=(0, 1), donate_argnums=(2, 4))
def _align_step(graphdef, tx, params, rest, opt_state, x, y):
    positions = jnp.broadcast_to(jnp.arange(x.shape[2], dtype=jnp.int32), x.shape[1:3])

    def one(p, r, o, xi, yi):
        def loss_fn(p):
            mixer = nnx.merge(graphdef, p, r)
            return alignment_loss(mixer(xi, positions)[0], yi)

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


def align_layers(mixers: Sequence[nnx.Module], cache: TeacherCache, layers: Sequence[int],
                 config: StageConfig, directory: str | pathlib.Path, *,
                 shard_layers: bool = False, desc: str = "stage I") -> StageResult:
    """Stage I: trains ``mixers[j]`` to reproduce the cached teacher attention layer
    ``layers[j]`` (module docstring); the mixers are not changed, trained copies are returned
    (``StageResult.trained``). Metrics rows: ``{"step", "loss": [per layer]}``.

    All mixers must have one architecture (one ``nnx`` graph), as the student's mixers do.
    ``desc`` names the progress bar.
    """
    mixers, layers = list(mixers), [int(i) for i in layers]
    if len(mixers) != len(layers) or not mixers:
        raise ValueError(f"mixers ({len(mixers)}) and layers ({len(layers)}) must pair up")
    splits = [nnx.split(m, nnx.Param, ...) for m in mixers]
    graphdef = splits[0][0]
    if any(g != graphdef for g, _, _ in splits):
        raise ValueError("mixers: stage I trains mixers of one architecture (one nnx graph)")
    for i in layers:
        cache.layer_io(i)  # names an uncached layer
    tx = config.optimizer()
    params = _stack([p for _, p, _ in splits])
    rest = _stack([r for _, _, r in splits])
    state = {"params": params, "opt_state": jax.vmap(tx.init)(params)}
    run = _Run(directory, config, desc, {"stage": "align", "layers": layers,
                                               "steps": config.steps, "cache": cache.spec.windows})
    state, start, done = run.restore(state)
    if shard_layers:
        state, rest = _shard_layer_axis((state, rest), len(layers))
    ios = [cache.layer_io(i) for i in layers]
    try:
        if not done:
            run.start(start)
            for step in range(start, config.steps):
                idx = _batch_indices(config.seed, step, len(cache), config.batch_size)
                x = jnp.asarray(np.stack([xi[idx] for xi, _ in ios]), jnp.float32)
                y = jnp.asarray(np.stack([yi[idx] for _, yi in ios]), jnp.float32)
                params, opt_state, loss = _align_step(graphdef, tx, state["params"], rest,
                                                      state["opt_state"], x, y)
                state = {"params": params, "opt_state": opt_state}
                if step % config.log_every == 0 or step == config.steps - 1:
                    loss = np.asarray(loss)
                    _check_finite(loss, step, "stage I")
                    run.log(step, {"loss": loss.tolist()}, f"mean loss {loss.mean():.4f}")
                run.advance()
                last = step + 1 == config.steps
                if last or (step + 1) % config.checkpoint_every == 0:
                    run.save(step + 1, state, done=last)
    finally:
        run.close()
    trained = [nnx.merge(graphdef, p, r) for p, r in
               zip(_unstack(state["params"], len(layers)), _unstack(rest, len(layers)),
                   strict=True)]
    return StageResult(trained, read_metrics(directory), start)


# --------------------------------------------------------------------------- stage II


def _trainable(model_has_lora: bool):
    mixers = nnx.All(nnx.Param, nnx.PathContains("attention"))
    return nnx.Any(mixers, LoRAParam) if model_has_lora else mixers


@functools.partial(jax.jit, static_argnums=(0, 1), donate_argnums=(2, 4))
def _kd_step(graphdef, tx, params, frozen, opt_state, tokens, log_probs, ids):
    def loss_fn(p):
        model = nnx.merge(graphdef, p, frozen)
        logits, _ = model(tokens)
        return sparse_kd_loss(logits, log_probs, ids)

    loss, grads = jax.value_and_grad(loss_fn)(params)
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss


def distill_end_to_end(student, cache: TeacherCache, config: StageConfig,
                       directory: str | pathlib.Path, *, lora_rank: int = 0,
                       lora_alpha: float | None = None, desc: str = "stage II") -> StageResult:
    """Stage II: sparse top-k KD of a copy of ``student`` (a
    :class:`~jaxlib_ext.models.llama.Llama` whose mixers may be students) on the cached
    teacher distributions; returns the trained copy (LoRA folded in). Metrics rows:
    ``{"step", "loss"}`` (nats per token). ``desc`` names the progress bar."""
    if student.cfg.vocab_size != cache.spec.vocab_size:
        raise ValueError(
            f"student: vocabulary of {student.cfg.vocab_size} tokens, the teacher cache has "
            f"{cache.spec.vocab_size} (teacher and student must share one tokenizer)"
        )
    model = nnx.clone(student)
    if lora_rank:
        add_lora_to_mlps(model, lora_rank, alpha=lora_alpha, rngs=nnx.Rngs(config.seed))
    graphdef, params, frozen = nnx.split(model, _trainable(bool(lora_rank)), ...)
    params = jax.tree.map(jnp.copy, params)  # the step donates them; the student keeps its own
    tx = config.optimizer()
    state = {"params": params, "opt_state": tx.init(params)}
    run = _Run(directory, config, desc, {"stage": "kd", "steps": config.steps,
                                                "lora_rank": lora_rank,
                                                "cache": cache.spec.windows})
    state, start, done = run.restore(state)
    t = cache.spec.seq_len
    try:
        if not done:
            run.start(start)
            for step in range(start, config.steps):
                idx = _batch_indices(config.seed, step, len(cache), config.batch_size)
                tokens = jnp.asarray(cache.tokens[idx, :t], jnp.int32)
                lp = jnp.asarray(cache.top_log_probs[idx])
                ids = jnp.asarray(cache.top_ids[idx])
                p, o, loss = _kd_step(graphdef, tx, state["params"], frozen, state["opt_state"],
                                      tokens, lp, ids)
                state = {"params": p, "opt_state": o}
                if step % config.log_every == 0 or step == config.steps - 1:
                    loss = float(loss)
                    _check_finite(loss, step, "stage II")
                    run.log(step, {"loss": loss}, f"KD {loss:.4f}")
                run.advance()
                last = step + 1 == config.steps
                if last or (step + 1) % config.checkpoint_every == 0:
                    run.save(step + 1, state, done=last)
    finally:
        run.close()
    model = nnx.merge(graphdef, state["params"], frozen)
    merge_lora(model)
    return StageResult(model, read_metrics(directory), start)
