"""Language-model training: the state, the compiled steps and the loop.

* :class:`TrainState` holds the parameters (an ``nnx.State``), the optimizer state, the
  step and a PRNG key; the model's graph definition stays outside, static.
* :func:`make_train_step` compiles one step with ``jax.jit``, explicit in/out shardings
  and donation of the old state: parameters may be sharded over ``fsdp``/``tensor`` and the
  batch over ``data``/``fsdp``, XLA inserts the collectives.
* :func:`make_pmap_train_step` is the classic data-parallel step (``jax.pmap`` with a
  ``pmean`` of the gradients) and :func:`make_shard_map_train_step` the same written with
  ``jax.shard_map``: same numbers, replicated state.
* :func:`fit` runs the loop on the library's engine (:func:`jaxlib_ext.core.loop.run_loop`):
  a progress bar (step, loss, tokens/s, ETA), periodic eval, a metrics JSONL file, Orbax
  checkpoints every N steps and exact resume, then a loss-curve PNG. A non-finite loss stops
  the run, naming the step and the last good checkpoint.

Models may report metrics and keep state that their forward pass updates (a mixture of
experts' router load and its correction bias): a model with
``logits_and_metrics(tokens, train=...) -> (logits, {name: scalar})`` has its metrics logged
with the loss (one column per name), and its ``nnx.BatchStat`` variables are carried in
:attr:`TrainState.model_state`, replaced after each step by the values the step's forward
pass left (``train=True``), checkpointed with the rest; gradients never reach them.

Resume (``TrainConfig.resume``) starts from the newest *committed* checkpoint, or from
scratch when there is none; a save that a crash interrupted is never read. Batches are a
pure function of ``(seed, step)``, so the resumed run ends equal to an uninterrupted one.
When ``TrainConfig.schedule`` is given it is recorded with every checkpoint, and a resume
that asks for another schedule raises :class:`~jaxlib_ext.core.schedule.ScheduleMismatchError`.

Errors about the configuration name the ``TrainConfig`` field at fault
(``TrainConfig.batch_size``, ...).
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from jaxlib_ext.core import data as data_lib
from jaxlib_ext.core import loop
from jaxlib_ext.core import sharding as sharding_lib
from jaxlib_ext.core.schedule import ScheduleMismatchError, WarmupCosine

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


#: raised when the training loss becomes NaN or Inf; names the step and the last good checkpoint
NonFiniteLossError = loop.NonFiniteLossError


class TrainState(NamedTuple):
    """The training state; the model's graph definition stays outside, static.

    Attributes:
      step: int32 scalar, the steps done.
      params: the ``nnx.State`` of the model's ``nnx.Param`` variables.
      opt_state: the optimizer's state.
      rng: raw ``uint32[2]`` PRNG key, split once per step.
      model_state: the ``nnx.State`` of the model's ``nnx.BatchStat`` variables (updated by
        the forward pass, not by gradients), or ``None`` when it has none.
    """

    step: jax.Array  # int32 scalar
    params: Any  # nnx.State of the model's nnx.Param variables
    opt_state: Any
    rng: jax.Array  # raw uint32[2] key, split once per step
    # nnx.State of the model's nnx.BatchStat variables (updated by the forward pass, not by
    # gradients), or None when it has none
    model_state: Any = None


@dataclasses.dataclass
class TrainConfig:
    """What :func:`fit` does.

    Attributes:
      steps: optimizer steps, positive.
      batch_size: sequences per step, positive and divisible by the data-parallel size (and
        by the local devices with ``"pmap"``).
      seq_len: tokens per sequence, positive and at most the model's ``max_seq_len``.
      seed: the seed of the initial PRNG key and of the batches.
      parallel: the parallel mode, ``"jit"``, ``"pmap"`` (one process) or ``"shard_map"``.
      eval_every: steps between evals, positive.
      eval_batches: batches per eval, positive.
      log_every: steps between metrics rows, positive.
      checkpoint_every: steps between checkpoints, positive.
      checkpoint_dir: the checkpoint folder; ``None`` means ``<out_dir>/checkpoints``.
      out_dir: the run's folder (``metrics.jsonl``, ``loss.png``).
      resume: continue from the newest committed checkpoint; without it a checkpoint folder
        that holds checkpoints raises.
      max_to_keep: checkpoints kept.
      progress: whether to show a progress bar.
      meta: a dict recorded with every checkpoint.
      schedule: the learning-rate schedule ``tx`` follows, if known: recorded with every
        checkpoint; a resume whose schedule differs from the recorded one raises
        :class:`~jaxlib_ext.core.schedule.ScheduleMismatchError`.
    """

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
    # The learning-rate schedule ``tx`` follows, if known: recorded with every checkpoint;
    # a resume whose schedule differs from the recorded one raises ScheduleMismatchError.
    schedule: WarmupCosine | None = None

    @property
    def ckpt_dir(self) -> pathlib.Path:
        """The checkpoint folder: ``checkpoint_dir``, or ``<out_dir>/checkpoints``."""
        return pathlib.Path(self.checkpoint_dir or pathlib.Path(self.out_dir) / "checkpoints")


@dataclasses.dataclass
class TrainResult:
    """What :func:`fit` returns.

    Attributes:
      state: the final :class:`TrainState`, gathered as the ``jit`` mode shards it.
      history: the metrics rows of this call (train and eval).
      start_step: the step it started from (``> 0`` when resumed).
      out_dir: its output folder.
    """

    state: TrainState
    history: list[dict]  # metrics rows of this invocation (train and eval)
    start_step: int
    out_dir: pathlib.Path

    @property
    def losses(self) -> list[float]:
        """The training losses of the rows that have one, in order."""
        return [r["loss"] for r in self.history if "loss" in r]

    @property
    def eval_losses(self) -> list[tuple[int, float]]:
        """``(step, eval_loss)`` of the rows that have an eval loss, in order."""
        return [(r["step"], r["eval_loss"]) for r in self.history if "eval_loss" in r]


def cross_entropy(logits: jax.Array, targets: jax.Array) -> jax.Array:
    """Mean next-token cross-entropy (nats) in float32.

    Args:
      logits: ``[..., V]`` logits.
      targets: ``int[...]`` target ids.

    Returns:
      The float32 scalar mean over all positions.
    """
    logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
    return -jnp.mean(jnp.take_along_axis(logp, targets[..., None], axis=-1))


def make_loss_fn(graphdef, rest, *, with_metrics: bool = False) -> Callable:
    """``loss(params, batch, model_state=None)`` for a batch ``int32[B, T + 1]`` (inputs and
    shifted targets).

    Args:
      graphdef: the model's graph definition (:func:`init_state`).
      rest: the model's state that is neither trained nor ``nnx.BatchStat``.
      with_metrics: whether the loss also returns the metrics and the model state.

    Returns:
      ``loss(params, batch, model_state=None)``, a float32 scalar; with ``with_metrics``
      ``(loss, (metrics, model_state))``: the model's metrics (empty unless it has
      ``logits_and_metrics``) and its ``nnx.BatchStat`` state after a training forward pass
      (``None`` when ``model_state`` is ``None``).
    """

    def loss_fn(params, batch, model_state=None):
        if model_state is not None:  # fresh variables of this trace, which the forward updates
            model_state = jax.tree.map(lambda x: x, model_state)
        parts = (params, rest) if model_state is None else (params, model_state, rest)
        model = nnx.merge(graphdef, *parts)
        if not with_metrics:
            return cross_entropy(model(batch[:, :-1]), batch[:, 1:])
        if hasattr(model, "logits_and_metrics"):
            logits, metrics = model.logits_and_metrics(batch[:, :-1], train=True)
        else:
            logits, metrics = model(batch[:, :-1]), {}
        new_state = None if model_state is None else nnx.state(model, nnx.BatchStat)
        return cross_entropy(logits, batch[:, 1:]), (dict(metrics), new_state)

    return loss_fn


def _apply(tx, loss_fn, state: TrainState, batch, reduce_grads=None, mean_over=None):
    """One optimizer step on ``batch``: ``(new_state, metrics)``.

    Args:
        tx: The optax transformation.
        loss_fn: ``loss(params, batch[, model_state])`` as :func:`make_loss_fn` builds it.
        state: The current :class:`TrainState`.
        batch: This device's batch.
        reduce_grads: Applied after differentiation to the loss, the gradients, the metrics
            and the model state (``jax.pmap``: per-device values, ``lax.pmean`` them).
        mean_over: Mesh axes to average the loss and metrics over *inside* the
            differentiated function (``jax.shard_map``). There the parameters are invariant
            over those axes, so autodiff already sums their cotangents over devices;
            differentiating the global mean loss gives the mean gradient, where a
            ``pmean`` of the local gradients would keep the sum.
    """
    mean = (lambda t: t) if mean_over is None else (lambda t: jax.lax.pmean(t, mean_over))

    def objective(params):
        if state.model_state is None:
            out = loss_fn(params, batch)
        else:
            out = loss_fn(params, batch, state.model_state)
        loss, (aux, model_state) = out if isinstance(out, tuple) else (out, ({}, state.model_state))
        return mean(loss), (mean(aux), mean(model_state))

    (loss, (aux, model_state)), grads = jax.value_and_grad(objective, has_aux=True)(state.params)
    if reduce_grads is not None:
        loss, grads, aux = reduce_grads(loss), reduce_grads(grads), reduce_grads(aux)
        model_state = reduce_grads(model_state)
    updates, opt_state = tx.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    rng, _ = jax.random.split(state.rng)
    metrics = {"loss": loss, "grad_norm": optax.tree.norm(grads), **aux}
    return TrainState(state.step + 1, params, opt_state, rng, model_state), metrics


def make_train_step(tx, loss_fn, state_sharding, batch_sharding):
    """``step(state, batch) -> (state, metrics)`` under ``jax.jit`` with explicit shardings.

    The incoming state is donated, so its buffers are reused for the new one.

    Args:
      tx: the optax transformation.
      loss_fn: the loss of :func:`make_loss_fn`.
      state_sharding: the :class:`TrainState` of shardings (:func:`train_state_shardings`).
      batch_sharding: the batch's ``NamedSharding`` (its mesh is the step's).

    Returns:
      The compiled step; ``metrics`` holds ``loss``, ``grad_norm`` and the model's metrics,
      replicated.
    """
    mesh = batch_sharding.mesh
    rep = sharding_lib.replicated(mesh)
    return jax.jit(
        lambda state, batch: _apply(tx, loss_fn, state, batch),
        in_shardings=(state_sharding, batch_sharding),
        out_shardings=(state_sharding, rep),
        donate_argnums=0,
    )


def make_pmap_train_step(tx, loss_fn, axis_name: str = "batch"):
    """Data-parallel step with ``jax.pmap``: state replicated per device, batch split on
    a leading device axis, gradients averaged with ``lax.pmean``.

    Args:
      tx: the optax transformation.
      loss_fn: the loss of :func:`make_loss_fn`.
      axis_name: the name of the ``pmap`` axis.

    Returns:
      The ``pmap``-ed ``step(state, batch) -> (state, metrics)``; the state is donated.
    """
    reduce = lambda t: jax.lax.pmean(t, axis_name)
    return jax.pmap(
        lambda state, batch: _apply(tx, loss_fn, state, batch, reduce),
        axis_name=axis_name,
        donate_argnums=0,
    )


def make_shard_map_train_step(tx, loss_fn, mesh):
    """Data parallelism written out with ``jax.shard_map``: each device takes its slice of
    the batch (over ``data`` x ``fsdp``); the state is replicated. The modern spelling of
    the ``pmap`` step, with the same numbers as ``jit`` on one device.

    The step differentiates the loss ``pmean``ed over those axes: the parameters are
    invariant over them (``check_vma``), so autodiff sums the per-device cotangents and the
    gradient is the mean one, with no collective after it.

    Args:
      tx: the optax transformation.
      loss_fn: the loss of :func:`make_loss_fn`.
      mesh: the device mesh.

    Returns:
      The compiled ``step(state, batch) -> (state, metrics)``; the state is donated.
    """
    axes = tuple(a for a in sharding_lib.BATCH_AXES if a in mesh.shape)
    body = jax.shard_map(
        lambda state, batch: _apply(tx, loss_fn, state, batch, mean_over=axes),
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


def make_eval_step(loss_fn, params_sharding, batch_sharding, model_state_sharding=None):
    """``eval(params, batch[, model_state]) -> loss`` under ``jax.jit``.

    Args:
      loss_fn: the loss of :func:`make_loss_fn` (without metrics).
      params_sharding: the parameters' shardings.
      batch_sharding: the batch's ``NamedSharding``.
      model_state_sharding: the model state's shardings; when given, the step takes
        ``model_state`` as its third argument.

    Returns:
      The compiled eval step; the loss is replicated.
    """
    rep = sharding_lib.replicated(batch_sharding.mesh)
    if model_state_sharding is None:
        return jax.jit(loss_fn, in_shardings=(params_sharding, batch_sharding), out_shardings=rep)
    return jax.jit(loss_fn, in_shardings=(params_sharding, batch_sharding, model_state_sharding),
                   out_shardings=rep)


def init_state(model: nnx.Module, tx, seed: int):
    """Splits ``model`` into its graph definition, its other state and a fresh state.

    Args:
      model: the NNX model.
      tx: the optax transformation, whose ``init`` gives the optimizer state.
      seed: the seed of the state's PRNG key.

    Returns:
      ``(graphdef, rest, state)``: ``state`` an unplaced :class:`TrainState` at step 0, its
      ``model_state`` the model's ``nnx.BatchStat`` variables (``None`` if it has none).
    """
    graphdef, params, model_state, rest = nnx.split(model, nnx.Param, nnx.BatchStat, ...)
    if not jax.tree.leaves(model_state):
        graphdef, params, rest = nnx.split(model, nnx.Param, ...)
        model_state = None
    state = TrainState(
        step=jnp.asarray(0, jnp.int32),
        params=params,
        opt_state=tx.init(params),
        rng=jax.random.PRNGKey(seed),
        model_state=model_state,
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
    """Shardings of a :class:`TrainState`.

    Args:
      state: the :class:`TrainState` (or one of its abstract shapes).
      mesh: the device mesh.

    Returns:
      A :class:`TrainState` of shardings: params (and model state) by their logical axes,
      optimizer state following the params, step and key replicated.
    """
    p_sh = sharding_lib.param_shardings(state.params, mesh)
    o_sh = sharding_lib.state_shardings(state.opt_state, state.params, p_sh, mesh)
    rep = sharding_lib.replicated(mesh)
    m_sh = None
    if state.model_state is not None:
        m_sh = sharding_lib.param_shardings(state.model_state, mesh)
    return TrainState(rep, p_sh, o_sh, rep, m_sh)


_POSITIVE_FIELDS = ("steps", "batch_size", "seq_len", "eval_every", "log_every",
                   "checkpoint_every", "eval_batches")


def _validate(cfg: TrainConfig, model, mesh, corpus: data_lib.Corpus) -> None:
    """Checks ``cfg`` against the model, mesh and corpus; errors name the ``TrainConfig``
    field (``TrainConfig.batch_size``, ...) so that a front end can map it to its flag."""
    for name in _POSITIVE_FIELDS:
        if getattr(cfg, name) <= 0:
            raise ValueError(f"TrainConfig.{name} must be positive, got {getattr(cfg, name)}")
    if cfg.parallel not in PARALLEL_MODES:
        raise ValueError(
            f"TrainConfig.parallel must be one of {PARALLEL_MODES}, got {cfg.parallel!r}"
        )
    dp = sharding_lib.data_parallel_size(mesh)
    if cfg.batch_size % dp:
        raise ValueError(
            f"TrainConfig.batch_size {cfg.batch_size} is not divisible by the data-parallel "
            f"size {dp} (mesh {dict(mesh.shape)}: data x fsdp); use a multiple of {dp}"
        )
    if cfg.parallel == "pmap":
        if jax.process_count() > 1:
            raise ValueError(
                "TrainConfig.parallel 'pmap' runs in one process; use TrainConfig.parallel "
                "'jit' across processes"
            )
        n = jax.local_device_count()
        if cfg.batch_size % n:
            raise ValueError(
                f"TrainConfig.batch_size {cfg.batch_size} is not divisible by the {n} local "
                f"devices that TrainConfig.parallel 'pmap' splits it over"
            )
    max_len = getattr(model, "max_seq_len", None)
    if max_len is not None and cfg.seq_len > max_len:
        raise ValueError(
            f"TrainConfig.seq_len {cfg.seq_len} exceeds the model's maximum sequence length "
            f"{max_len}; use TrainConfig.seq_len <= {max_len}"
        )
    ckpt_dir = cfg.ckpt_dir
    if not cfg.resume and ckpt_dir.is_dir() and any(p.name.isdigit() for p in ckpt_dir.iterdir()):
        raise ValueError(
            f"TrainConfig.checkpoint_dir {ckpt_dir} already holds checkpoints; use "
            "TrainConfig.resume to continue that run, or another TrainConfig.out_dir / "
            "TrainConfig.checkpoint_dir for a new one"
        )
    if len(corpus.train) <= cfg.seq_len + 1 or len(corpus.eval) <= cfg.seq_len + 1:
        raise ValueError(
            f"TrainConfig.seq_len {cfg.seq_len} is too long for the corpus "
            f"({len(corpus.train)} train / {len(corpus.eval)} eval tokens)"
        )


def plot_metrics(metrics_path, png_path, *, reference: float | None = None, title: str = ""):
    """Train and eval loss against step, from a metrics JSONL file, saved as a PNG.

    Args:
      metrics_path: the metrics JSONL file (rows with ``step`` and ``loss`` or
        ``eval_loss``).
      png_path: the PNG to write.
      reference: a loss drawn as a dashed line (the unigram entropy), or ``None``.
      title: the plot's title.
    """
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


class _ParallelMode(NamedTuple):
    """How one ``TrainConfig.parallel`` mode runs a step.

    ``place`` turns the global state (in ``state_sharding``) into the state ``step`` takes,
    ``gather`` turns it back (for eval, checkpoints and the result), and ``batch`` makes the
    step's batch from the global batch's row offsets.
    """

    step: Callable  # (state, batch) -> (state, metrics)
    place: Callable
    gather: Callable
    batch: Callable
    state_sharding: TrainState


def _under_mesh(fn, mesh):
    """``fn`` traced and run with ``mesh`` set (``jax.set_mesh``) when the mesh has an
    ``expert`` axis, so that expert-parallel layers find it; ``fn`` itself otherwise."""
    if dict(mesh.shape).get("expert", 1) <= 1:
        return fn

    def run(*args):
        with jax.set_mesh(mesh):
            return fn(*args)

    return run


def _jit_mode(tx, loss_fn, cfg, corpus, state_sh, mesh) -> _ParallelMode:
    """Sharded state (params over ``fsdp``/``tensor``/``expert``), one ``jax.jit`` step."""
    batch_sh = sharding_lib.batch_sharding(mesh)
    return _ParallelMode(
        step=_under_mesh(make_train_step(tx, loss_fn, state_sh, batch_sh), mesh),
        place=lambda s: s,
        gather=lambda s: s,
        batch=lambda offsets: data_lib.make_global_batch(
            corpus.train, offsets, cfg.seq_len, batch_sh
        ),
        state_sharding=state_sh,
    )


def _shard_map_mode(tx, loss_fn, cfg, corpus, state_sh, mesh) -> _ParallelMode:
    """Replicated state: every device holds the whole model, as in the pmap step."""
    rep = jax.tree.map(lambda _: sharding_lib.replicated(mesh), state_sh)
    batch_sh = sharding_lib.batch_sharding(mesh)
    return _ParallelMode(
        step=make_shard_map_train_step(tx, loss_fn, mesh),
        place=lambda s: jax.device_put(s, rep),
        gather=lambda s: s,
        batch=lambda offsets: data_lib.make_global_batch(
            corpus.train, offsets, cfg.seq_len, batch_sh
        ),
        state_sharding=rep,
    )


def _pmap_mode(tx, loss_fn, cfg, corpus, state_sh, mesh) -> _ParallelMode:
    """One state copy per local device on a leading axis; the batch split over it."""
    n_local = jax.local_device_count()
    window = np.arange(cfg.seq_len + 1)[None, :]

    def batch(offsets):
        rows = corpus.train[offsets[:, None] + window]
        return rows.reshape(n_local, -1, cfg.seq_len + 1)

    return _ParallelMode(
        step=make_pmap_train_step(tx, loss_fn),
        place=lambda s: jax.tree.map(lambda x: jnp.stack([np.asarray(x)] * n_local), s),
        gather=lambda s: jax.device_put(jax.tree.map(lambda x: x[0], s), state_sh),
        batch=batch,
        state_sharding=state_sh,
    )


_MODES = {"jit": _jit_mode, "shard_map": _shard_map_mode, "pmap": _pmap_mode}


def _make_evaluate(loss_fn, mode: _ParallelMode, cfg: TrainConfig, corpus, mesh):
    """``evaluate(state) -> float``: the mean loss over the fixed eval batches."""
    batch_sh = sharding_lib.batch_sharding(mesh)
    eval_fn = make_eval_step(loss_fn, mode.state_sharding.params, batch_sh,
                             mode.state_sharding.model_state)
    if cfg.parallel == "jit":
        eval_fn = _under_mesh(eval_fn, mesh)
    offsets = data_lib.eval_batches(corpus.eval, cfg.batch_size, cfg.seq_len, cfg.eval_batches)

    def evaluate(state) -> float:  # ``state`` as ``mode.gather`` returns it
        extra = () if state.model_state is None else (state.model_state,)
        losses = [
            eval_fn(state.params,
                    data_lib.make_global_batch(corpus.eval, o, cfg.seq_len, batch_sh), *extra)
            for o in offsets
        ]
        return float(np.mean([float(x) for x in losses]))

    return evaluate


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

    Args:
      model: the NNX language model (``model(tokens) -> logits``; optionally
        ``logits_and_metrics`` and ``max_seq_len``).
      tx: the optax transformation.
      corpus: the tokenised corpus (train and eval splits).
      cfg: the run's :class:`TrainConfig`.
      mesh: the device mesh; ``None`` means :func:`~jaxlib_ext.core.sharding.make_mesh`'s
        default.

    Returns:
      The :class:`TrainResult`.

    Raises:
      ValueError: naming the ``TrainConfig`` field at fault, for a configuration that does
        not fit the model, mesh or corpus.
      ScheduleMismatchError: if a resume asks for another schedule than the recorded one.
      NonFiniteLossError: on a NaN or Inf loss, naming the step and the last good
        checkpoint.
    """
    mesh = mesh or sharding_lib.make_mesh(None)
    _validate(cfg, model, mesh, corpus)
    graphdef, rest, host_state = init_state(model, tx, cfg.seed)
    loss_fn = make_loss_fn(graphdef, rest)
    train_loss_fn = make_loss_fn(graphdef, rest, with_metrics=True)
    state_sh = train_state_shardings(host_state, mesh)
    # the fresh state, placed; a resume restores into its shapes and shardings instead
    state = jax.device_put(_distinct_buffers(host_state), state_sh)
    del host_state
    mode = _MODES[cfg.parallel](tx, train_loss_fn, cfg, corpus, state_sh, mesh)
    out_dir = pathlib.Path(cfg.out_dir)
    config = loop.LoopConfig(
        steps=cfg.steps, log_every=cfg.log_every, checkpoint_every=cfg.checkpoint_every,
        checkpoint_dir=cfg.ckpt_dir, max_to_keep=cfg.max_to_keep, resume=cfg.resume,
        metrics_path=out_dir / "metrics.jsonl", progress=cfg.progress, desc="train",
        items_per_step=cfg.batch_size * cfg.seq_len, items_name="tokens",
        eval_every=cfg.eval_every, schedule=cfg.schedule,
        meta={**cfg.meta, "seed": cfg.seed},
    )

    def batch_fn(step: int):
        return mode.batch(data_lib.batch_offsets(cfg.seed, step, cfg.batch_size, cfg.seq_len,
                                                 len(corpus.train)))

    try:
        result = loop.run_loop(mode.step, state, batch_fn, config,
                               evaluate=_make_evaluate(loss_fn, mode, cfg, corpus, mesh),
                               place=mode.place, gather=mode.gather)
    except ScheduleMismatchError as e:  # name the field of this function's config
        raise ScheduleMismatchError(str(e).replace("LoopConfig.", "TrainConfig."),
                                    e.fields) from None
    except loop.NonFiniteLossError as e:
        raise NonFiniteLossError(f"{e} (TrainConfig.resume)", step=e.step,
                                 last_good=e.last_good) from None

    if jax.process_index() == 0 and config.metrics_path.exists():
        plot_metrics(
            config.metrics_path,
            out_dir / "loss.png",
            reference=data_lib.unigram_entropy(corpus.train, corpus.vocab_size),
            title=str(cfg.meta.get("run", "")),
        )
    return TrainResult(result.state, result.history, result.start_step, out_dir)
