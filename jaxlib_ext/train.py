"""Language-model training: the state, the compiled steps and the loop.

* :class:`TrainState` holds the parameters (an ``nnx.State``), the optimizer state, the
  step and a PRNG key; the model's graph definition stays outside, static.
* :func:`make_train_step` compiles one step with ``jax.jit``, explicit in/out shardings
  and donation of the old state: parameters may be sharded over ``fsdp``/``tensor`` and the
  batch over ``data``/``fsdp``, XLA inserts the collectives.
* :func:`make_pmap_train_step` is the classic data-parallel step (``jax.pmap`` with a
  ``pmean`` of the gradients): same numbers, replicated state.
* :func:`fit` runs the loop: a progress bar (step, loss, tokens/s, ETA), periodic eval,
  a metrics JSONL file, a loss-curve PNG, Orbax checkpoints every N steps and exact
  resume. A non-finite loss stops the run, naming the step and the last good checkpoint.
"""

from __future__ import annotations

import dataclasses
import json
import math
import pathlib
import time
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from jaxlib_ext import data as data_lib
from jaxlib_ext import sharding as sharding_lib
from jaxlib_ext.checkpoint import Checkpointer, abstract_like

__all__ = [
    "TrainState",
    "TrainConfig",
    "TrainResult",
    "NonFiniteLossError",
    "cross_entropy",
    "init_state",
    "make_loss_fn",
    "make_train_step",
    "make_pmap_train_step",
    "make_shard_map_train_step",
    "make_eval_step",
    "train_state_shardings",
    "fit",
    "plot_metrics",
]


PARALLEL_MODES = ("jit", "pmap", "shard_map")


class NonFiniteLossError(FloatingPointError):
    """Raised when the training loss becomes NaN or Inf; names the step."""


class TrainState(NamedTuple):
    step: jax.Array  # int32 scalar
    params: Any  # nnx.State of the model's nnx.Param variables
    opt_state: Any
    rng: jax.Array  # raw uint32[2] key, split once per step


@dataclasses.dataclass
class TrainConfig:
    steps: int = 200
    batch_size: int = 32
    seq_len: int = 128
    seed: int = 0
    parallel: str = "jit"  # "jit" | "pmap" | "shard_map"
    eval_every: int = 100
    eval_batches: int = 4
    log_every: int = 10
    checkpoint_every: int = 100
    checkpoint_dir: str | None = None  # None: <out_dir>/checkpoints
    out_dir: str = "runs/default"
    resume: bool = False
    max_to_keep: int = 3
    progress: bool = True
    meta: dict = dataclasses.field(default_factory=dict)  # recorded with every checkpoint

    @property
    def ckpt_dir(self) -> pathlib.Path:
        return pathlib.Path(self.checkpoint_dir or pathlib.Path(self.out_dir) / "checkpoints")


@dataclasses.dataclass
class TrainResult:
    state: TrainState
    history: list[dict]  # metrics rows of this invocation (train and eval)
    start_step: int
    out_dir: pathlib.Path

    @property
    def losses(self) -> list[float]:
        return [r["loss"] for r in self.history if "loss" in r]

    @property
    def eval_losses(self) -> list[tuple[int, float]]:
        return [(r["step"], r["eval_loss"]) for r in self.history if "eval_loss" in r]


def cross_entropy(logits: jax.Array, targets: jax.Array) -> jax.Array:
    """Mean next-token cross-entropy (nats) in float32."""
    logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
    return -jnp.mean(jnp.take_along_axis(logp, targets[..., None], axis=-1))


def make_loss_fn(graphdef, rest) -> Callable[[Any, jax.Array], jax.Array]:
    """``loss(params, batch)`` for a batch ``int32[B, T + 1]`` (inputs and shifted targets)."""

    def loss_fn(params, batch):
        model = nnx.merge(graphdef, params, rest)
        logits = model(batch[:, :-1])
        return cross_entropy(logits, batch[:, 1:])

    return loss_fn


def _apply(tx, loss_fn, state: TrainState, batch, reduce_grads=None):
    loss, grads = jax.value_and_grad(loss_fn)(state.params, batch)
    if reduce_grads is not None:
        loss, grads = reduce_grads(loss), reduce_grads(grads)
    updates, opt_state = tx.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    rng, _ = jax.random.split(state.rng)
    metrics = {"loss": loss, "grad_norm": optax.tree.norm(grads)}
    return TrainState(state.step + 1, params, opt_state, rng), metrics


def make_train_step(tx, loss_fn, state_sharding, batch_sharding):
    """``step(state, batch) -> (state, metrics)`` under ``jax.jit`` with explicit shardings.

    The incoming state is donated, so its buffers are reused for the new one.
    """
    mesh = batch_sharding.mesh
    rep = sharding_lib.replicated(mesh)
    return jax.jit(
        lambda state, batch: _apply(tx, loss_fn, state, batch),
        in_shardings=(state_sharding, batch_sharding),
        out_shardings=(state_sharding, {"loss": rep, "grad_norm": rep}),
        donate_argnums=0,
    )


def make_pmap_train_step(tx, loss_fn, axis_name: str = "batch"):
    """Data-parallel step with ``jax.pmap``: state replicated per device, batch split on
    a leading device axis, gradients averaged with ``lax.pmean``."""
    reduce = lambda t: jax.lax.pmean(t, axis_name)
    return jax.pmap(
        lambda state, batch: _apply(tx, loss_fn, state, batch, reduce),
        axis_name=axis_name,
        donate_argnums=0,
    )


def make_shard_map_train_step(tx, loss_fn, mesh):
    """Data parallelism written out with ``jax.shard_map``: each device takes its slice of
    the batch (over ``data`` x ``fsdp``), computes local gradients and ``pmean``s them over
    those axes; the state is replicated. The modern spelling of the ``pmap`` step."""
    axes = tuple(a for a in sharding_lib.BATCH_AXES if a in mesh.shape)
    reduce = lambda t: jax.lax.pmean(t, axes)
    body = jax.shard_map(
        lambda state, batch: _apply(tx, loss_fn, state, batch, reduce),
        mesh=mesh,
        in_specs=(jax.P(), jax.P(axes)),
        out_specs=(jax.P(), jax.P()),
    )
    rep = sharding_lib.replicated(mesh)
    return jax.jit(
        body,
        in_shardings=(rep, sharding_lib.batch_sharding(mesh)),
        out_shardings=(rep, rep),
        donate_argnums=0,
    )


def make_eval_step(loss_fn, params_sharding, batch_sharding):
    return jax.jit(
        loss_fn,
        in_shardings=(params_sharding, batch_sharding),
        out_shardings=sharding_lib.replicated(batch_sharding.mesh),
    )


def init_state(model: nnx.Module, tx, seed: int):
    """Splits ``model`` into ``(graphdef, rest)`` and an unplaced :class:`TrainState`."""
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    state = TrainState(
        step=jnp.asarray(0, jnp.int32),
        params=params,
        opt_state=tx.init(params),
        rng=jax.random.PRNGKey(seed),
    )
    return graphdef, rest, state


def _distinct_buffers(tree):
    """Copies leaves that are the same array object as an earlier leaf.

    An optimizer's ``init`` may legitimately return one zeros array for two moments; a
    donated step would then donate that buffer twice, which XLA rejects.
    """
    seen: set[int] = set()

    def one(x):
        if id(x) in seen:
            return jnp.copy(x)
        seen.add(id(x))
        return x

    return jax.tree.map(one, tree)


def train_state_shardings(state: TrainState, mesh) -> TrainState:
    """Shardings of a :class:`TrainState`: params by their logical axes, optimizer state
    following the params, step and key replicated."""
    p_sh = sharding_lib.param_shardings(state.params, mesh)
    o_sh = sharding_lib.state_shardings(state.opt_state, state.params, p_sh, mesh)
    rep = sharding_lib.replicated(mesh)
    return TrainState(rep, p_sh, o_sh, rep)


def _validate(cfg: TrainConfig, model, mesh, corpus: data_lib.Corpus) -> None:
    for name in ("steps", "batch_size", "seq_len", "eval_every", "log_every",
                 "checkpoint_every", "eval_batches"):
        if getattr(cfg, name) <= 0:
            flag = "--" + name.replace("_", "-")
            raise ValueError(f"{flag} must be positive, got {getattr(cfg, name)}")
    if cfg.parallel not in PARALLEL_MODES:
        raise ValueError(f"--parallel must be one of {PARALLEL_MODES}, got {cfg.parallel!r}")
    dp = sharding_lib.data_parallel_size(mesh)
    if cfg.batch_size % dp:
        raise ValueError(
            f"--batch-size {cfg.batch_size} is not divisible by the data-parallel size {dp} "
            f"(mesh {dict(mesh.shape)}: data x fsdp); use a multiple of {dp}"
        )
    if cfg.parallel == "pmap":
        if jax.process_count() > 1:
            raise ValueError("--parallel pmap runs in one process; use --parallel jit multi-host")
        n = jax.local_device_count()
        if cfg.batch_size % n:
            raise ValueError(
                f"--batch-size {cfg.batch_size} is not divisible by the {n} local devices "
                f"that --parallel pmap splits it over"
            )
    max_len = getattr(model, "max_seq_len", None)
    if max_len is not None and cfg.seq_len > max_len:
        raise ValueError(
            f"--seq-len {cfg.seq_len} exceeds the model's maximum sequence length {max_len}; "
            f"use --seq-len <= {max_len}"
        )
    ckpt_dir = cfg.ckpt_dir
    if not cfg.resume and ckpt_dir.is_dir() and any(p.name.isdigit() for p in ckpt_dir.iterdir()):
        raise ValueError(
            f"--checkpoint-dir {ckpt_dir} already holds checkpoints; pass --resume to continue "
            "that run, or choose another --out-dir/--checkpoint-dir for a new one"
        )
    if len(corpus.train) <= cfg.seq_len + 1 or len(corpus.eval) <= cfg.seq_len + 1:
        raise ValueError(
            f"--seq-len {cfg.seq_len} is too long for the corpus ({len(corpus.train)} train / "
            f"{len(corpus.eval)} eval tokens)"
        )


class _MetricsLog:
    """Append-only JSONL written by process 0; on resume, rows past the restored step go."""

    def __init__(self, path: pathlib.Path, resume_step: int | None, enabled: bool):
        self.path, self.enabled = path, enabled
        if not enabled:
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        keep = []
        if resume_step is not None and path.exists():
            keep = [line for line in path.read_text().splitlines()
                    if line and json.loads(line)["step"] <= resume_step]
        path.write_text("".join(line + "\n" for line in keep))

    def write(self, row: dict) -> None:
        if self.enabled:
            with self.path.open("a") as f:
                f.write(json.dumps(row) + "\n")


def plot_metrics(metrics_path, png_path, *, reference: float | None = None, title: str = ""):
    """Train and eval loss against step, from a metrics JSONL file, saved as a PNG."""
    import matplotlib

    if matplotlib.get_backend().lower() not in ("agg", "module://matplotlib_inline.backend_inline"):
        matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [json.loads(s) for s in pathlib.Path(metrics_path).read_text().splitlines() if s]
    train = [(r["step"], r["loss"]) for r in rows if "loss" in r]
    evals = [(r["step"], r["eval_loss"]) for r in rows if "eval_loss" in r]
    fig, ax = plt.subplots(figsize=(6, 4))
    if train:
        ax.plot(*zip(*train, strict=True), label="train", lw=1)
    if evals:
        ax.plot(*zip(*evals, strict=True), "o-", label="eval")
    if reference is not None:
        ax.axhline(reference, ls="--", c="gray", label="unigram entropy")
    ax.set(xlabel="step", ylabel="loss (nats/token)", title=title)
    ax.legend()
    fig.tight_layout()
    fig.savefig(png_path, dpi=100)
    plt.close(fig)


def fit(
    model: nnx.Module,
    tx: optax.GradientTransformation,
    corpus: data_lib.Corpus,
    cfg: TrainConfig,
    mesh: jax.sharding.Mesh | None = None,
) -> TrainResult:
    """Trains ``model`` with ``tx`` on ``corpus``; see the module docstring.

    Everything the run needs is checked before anything is written, so bad input leaves
    no partial output or checkpoint behind.
    """
    mesh = mesh or sharding_lib.make_mesh(None)
    _validate(cfg, model, mesh, corpus)
    main = jax.process_index() == 0
    out_dir = pathlib.Path(cfg.out_dir)

    graphdef, rest, host_state = init_state(model, tx, cfg.seed)
    loss_fn = make_loss_fn(graphdef, rest)
    state_sh = train_state_shardings(host_state, mesh)
    batch_sh = sharding_lib.batch_sharding(mesh)

    ckpt = Checkpointer(cfg.ckpt_dir, max_to_keep=cfg.max_to_keep)
    start = ckpt.latest_step() if cfg.resume else None
    if start is not None:
        state, _ = ckpt.restore(start, abstract_like(host_state, state_sh))
    else:
        # Place the freshly initialised state; every leaf becomes a global array.
        state = jax.device_put(_distinct_buffers(host_state), state_sh)
    del host_state
    start = int(start or 0)

    if cfg.parallel == "pmap":
        step_fn = make_pmap_train_step(tx, loss_fn)
        n_local = jax.local_device_count()
        state = jax.tree.map(lambda x: jnp.stack([np.asarray(x)] * n_local), state)
    elif cfg.parallel == "shard_map":
        # Replicated state: every device holds the whole model, as in the pmap step.
        state_sh = jax.tree.map(lambda _: sharding_lib.replicated(mesh), state_sh)
        state = jax.device_put(state, state_sh)
        step_fn = make_shard_map_train_step(tx, loss_fn, mesh)
    else:
        step_fn = make_train_step(tx, loss_fn, state_sh, batch_sh)
    eval_fn = make_eval_step(loss_fn, state_sh.params, batch_sh)
    eval_offsets = data_lib.eval_batches(corpus.eval, cfg.batch_size, cfg.seq_len, cfg.eval_batches)

    def unreplicated(s):
        if cfg.parallel != "pmap":
            return s
        return jax.device_put(jax.tree.map(lambda x: x[0], s), state_sh)

    def evaluate(s) -> float:
        params = unreplicated(s).params
        losses = [
            eval_fn(params, data_lib.make_global_batch(corpus.eval, o, cfg.seq_len, batch_sh))
            for o in eval_offsets
        ]
        return float(np.mean([float(x) for x in losses]))

    def save(step, s):
        ckpt.save(step, unreplicated(s), {**cfg.meta, "step": step, "seed": cfg.seed})

    log = _MetricsLog(out_dir / "metrics.jsonl", start if cfg.resume else None, main)
    history: list[dict] = []
    tokens_per_step = cfg.batch_size * cfg.seq_len
    bar = None
    if main and cfg.progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=cfg.steps, initial=start, desc="train", unit="step", dynamic_ncols=True)
    t_last, n_since = time.perf_counter(), 0
    try:
        for step in range(start, cfg.steps):
            offsets = data_lib.batch_offsets(
                cfg.seed, step, cfg.batch_size, cfg.seq_len, len(corpus.train)
            )
            if cfg.parallel == "pmap":
                local = corpus.train[offsets[:, None] + np.arange(cfg.seq_len + 1)[None, :]]
                batch = local.reshape(n_local, -1, cfg.seq_len + 1)
            else:
                batch = data_lib.make_global_batch(corpus.train, offsets, cfg.seq_len, batch_sh)
            state, metrics = step_fn(state, batch)
            loss = float(np.asarray(metrics["loss"]).reshape(-1)[0])
            if not math.isfinite(loss):
                ckpt.wait()
                good = ckpt.latest_step()
                good = "none" if good is None else f"step {good}"
                raise NonFiniteLossError(
                    f"loss became {loss} at step {step + 1}; stopped without saving it. Last good "
                    f"checkpoint: {good} in {ckpt.directory}. "
                    "Lower --lr or check the data, then rerun with --resume."
                )
            n_since += 1
            done = step + 1
            if bar is not None:
                bar.update(1)
            if done % cfg.log_every == 0 or done == cfg.steps:
                now = time.perf_counter()
                row = {
                    "step": done,
                    "loss": loss,
                    "grad_norm": float(np.asarray(metrics["grad_norm"]).reshape(-1)[0]),
                    "tokens_per_s": n_since * tokens_per_step / max(now - t_last, 1e-9),
                }
                t_last, n_since = now, 0
                log.write(row)
                history.append(row)
                if bar is not None:
                    bar.set_postfix(loss=f"{loss:.3f}", tok_s=f"{row['tokens_per_s']:.0f}")
            if done % cfg.eval_every == 0 or done == cfg.steps:
                row = {"step": done, "eval_loss": evaluate(state)}
                log.write(row)
                history.append(row)
                if bar is not None:
                    bar.write(f"step {done}: eval loss {row['eval_loss']:.4f}")
            if done % cfg.checkpoint_every == 0 or done == cfg.steps:
                save(done, state)
    finally:
        if bar is not None:
            bar.close()
        ckpt.close()

    if main and (out_dir / "metrics.jsonl").exists():
        plot_metrics(
            out_dir / "metrics.jsonl",
            out_dir / "loss.png",
            reference=data_lib.unigram_entropy(corpus.train, corpus.vocab_size),
            title=str(cfg.meta.get("run", "")),
        )
    return TrainResult(unreplicated(state), history, start, out_dir)
