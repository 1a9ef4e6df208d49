"""Training an energy network with anisotropic covariance score matching, EMA and checkpoints.

Each step draws a batch of clean samples, a batch of random covariances
(:func:`~.covariance.random_covariance`: log-uniform levels, pixel- or Fourier-diagonal, the type
drawn per step) and minimises (L.4) of :mod:`.loss` (arXiv 2605.15487) with Adam (gradient
clipping at norm 1). The exponential moving average of the parameters,

    ema_t = d_t * ema_{t-1} + (1 - d_t) * params_t,   d_t = min(ema_decay, (1 + t) / (10 + t)),

is what :func:`load` returns. The loop is :func:`jaxlib_ext.core.loop.run_loop`: a non-finite
loss stops training with :class:`~jaxlib_ext.core.loop.NonFiniteLossError` naming the step;
checkpoints (Orbax) hold ``({"params", "opt_state"}, ema)`` with the model's constructor
arguments as JSON, and training resumes from the newest one in ``checkpoint_dir``. Step ``t``
draws its batch, its covariance type and its noise from ``(seed, t)`` alone, so a resumed run
ends equal to an uninterrupted one.

Command line (MNIST, a U-Net)::

    python -m jaxlib_ext energy --data mnist --steps 3000 --out runs/energy
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import numpy as np
import optax
from flax import nnx

from jaxlib_ext.core import loop
from jaxlib_ext.core.schedule import WarmupCosine
from jaxlib_ext.samplers.energy.covariance import random_covariance
from jaxlib_ext.samplers.energy.loss import COV_REDUCTIONS, acsm_loss
from jaxlib_ext.samplers.energy.network import EnergyMLP, EnergyUNet, functional_energy

__all__ = ["TrainResult", "build_model", "load", "train"]

MODELS = {"mlp": EnergyMLP, "unet": EnergyUNet}


class TrainResult(NamedTuple):
    """The result of :func:`train`.

    Attributes:
      model: the model with the EMA parameters.
      history: a dict of per-step arrays: ``loss``, ``dsm``, ``cov``.
    """

    model: nnx.Module
    history: dict[str, np.ndarray]


def build_model(kind: str, kwargs: dict[str, Any], seed: int = 0) -> nnx.Module:
    """An energy network by name.

    Args:
      kind: ``"mlp"`` (:class:`~.network.EnergyMLP`) or ``"unet"``
        (:class:`~.network.EnergyUNet`).
      kwargs: the constructor's keyword arguments.
      seed: the seed of the initial parameters.

    Returns:
      The module.
    """
    if kind not in MODELS:
        raise ValueError(f"kind: expected one of {tuple(MODELS)}, got {kind!r}")
    return MODELS[kind](**kwargs, rngs=nnx.Rngs(seed))


def _make_step(graphdef, rest, tx, *, basis, cov_weight, cov_reduction, sigma_min, sigma_max):
    def loss_fn(params, x, key):
        kc, kn = jax.random.split(key)
        cov = random_covariance(kc, x.shape, sigma_min=sigma_min, sigma_max=sigma_max,
                                basis=basis)
        energy = functional_energy(graphdef, params, rest)
        return acsm_loss(energy, x, cov, kn, cov_weight=cov_weight,
                         cov_reduction=cov_reduction)

    @jax.jit
    def step(state, x, key):
        params, opt_state = state["params"], state["opt_state"]
        (loss, parts), grads = jax.value_and_grad(loss_fn, has_aux=True)(params, x, key)
        updates, opt_state = tx.update(grads, opt_state, params)
        params = optax.apply_updates(params, updates)
        return {"params": params, "opt_state": opt_state}, {"loss": loss, **parts}

    return step


def _optimizer(learning_rate):
    lr = learning_rate.to_optax() if isinstance(learning_rate, WarmupCosine) else learning_rate
    return optax.chain(optax.clip_by_global_norm(1.0), optax.adam(lr))


def _schedule_record(learning_rate):
    """The record a checkpoint keeps of the learning rate (``None``: an optax callable, whose
    parameters cannot be read back, is not checked on resume)."""
    if isinstance(learning_rate, WarmupCosine):
        return learning_rate
    if callable(learning_rate):
        return None
    return {"kind": "constant", "peak_lr": float(learning_rate)}


def train(model: nnx.Module, data, *, steps: int, batch_size: int = 32, learning_rate=1e-3,
          ema_decay: float = 0.999, cov_weight: float = 1.0, cov_reduction: str = "authors",
          sigma_min: float = 1e-3,
          sigma_max: float = 20.0, basis: str = "mixed", seed: int = 0,
          checkpoint_dir=None, checkpoint_every: int = 500, resume: bool = True,
          model_meta: dict | None = None, max_seconds: float | None = None,
          progress: bool = True, metrics_path=None) -> TrainResult:
    """Train ``model`` on ``data`` (``[N, ...]`` array of clean samples) for ``steps`` steps.

    Args:
      model: an :class:`EnergyMLP` or :class:`EnergyUNet`; its parameters are the start.
      data: ``[N, ...]`` clean samples, ``N >= batch_size``.
      steps: the run's length (a resumed run continues up to it).
      batch_size: samples per step, drawn with replacement.
      learning_rate: Adam's rate: a float, a :class:`~jaxlib_ext.core.schedule.WarmupCosine`
        (both recorded in the checkpoints and checked on resume) or an optax schedule (not
        checked).
      ema_decay: the EMA's ceiling ``d`` in ``min(d, (1 + t) / (10 + t))``.
      cov_weight, sigma_min, sigma_max: the loss weight of the covariance term and the range
        of the noise levels (:func:`~.covariance.random_covariance`).
      cov_reduction: ``"authors"`` (the covariance term averaged over the entries and divided
        by their number once more, the authors' code) or ``"mean"`` (averaged once, ours;
        :func:`~.loss.acsm_loss`).
      basis: ``"pixel"``, ``"fourier"`` or ``"mixed"`` (each step's covariance type drawn at
        random; vectors use pixel).
      seed: the seed of the batches, the covariance types and the noise.
      checkpoint_dir: the checkpoint folder, or ``None`` for none.
      checkpoint_every: steps between checkpoints (and the last step).
      resume: start from the newest checkpoint in ``checkpoint_dir``, if any.
      model_meta: the constructor's kind and arguments (``{"kind": ..., "kwargs": ...}``),
        saved with the checkpoints for :func:`load`.
      max_seconds: stop early (with a checkpoint) after this wall time.
      progress: show a progress bar.
      metrics_path: a JSONL file of the per-step metrics, or ``None``.

    Returns:
      :class:`TrainResult`: the model with the EMA parameters and the per-step ``loss``,
      ``dsm`` and ``cov`` of the steps this call ran.

    Raises:
      jaxlib_ext.core.loop.NonFiniteLossError: the loss became NaN or Inf (a
        ``FloatingPointError``).
    """
    data = np.asarray(data, np.float32)
    if data.ndim < 2 or data.shape[0] < batch_size:
        raise ValueError(f"data: expected [N, ...] with N >= batch_size={batch_size}, got "
                         f"shape {data.shape}")
    if steps < 1 or batch_size < 1:
        raise ValueError(f"steps, batch_size: expected >= 1, got {steps}, {batch_size}")
    if cov_reduction not in COV_REDUCTIONS:
        raise ValueError(f"cov_reduction: expected one of {COV_REDUCTIONS}, got "
                         f"{cov_reduction!r}")
    if basis not in ("pixel", "fourier", "mixed"):
        raise ValueError(f"basis: expected 'pixel', 'fourier' or 'mixed', got {basis!r}")
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    tx = _optimizer(learning_rate)
    state = {"params": params, "opt_state": tx.init(params)}
    kinds = ["pixel", "fourier"] if (basis == "mixed" and data.ndim == 4) else [
        "pixel" if basis == "mixed" else basis]
    fns = [_make_step(graphdef, rest, tx, basis=b, cov_weight=cov_weight,
                      cov_reduction=cov_reduction,
                      sigma_min=sigma_min, sigma_max=sigma_max) for b in kinds]
    key = jax.random.key(seed)

    def batch_fn(t):
        rng = np.random.default_rng([seed, t])
        x = data[rng.integers(0, data.shape[0], batch_size)]
        return int(rng.integers(len(kinds))), x, jax.random.fold_in(key, t)

    def step_fn(state, batch):
        # the covariance type is a Python choice between two compiled steps
        b, x, k = batch
        return fns[b](state, x, k)

    config = loop.LoopConfig(
        steps=steps, log_every=1, checkpoint_every=checkpoint_every if checkpoint_dir else 0,
        checkpoint_dir=checkpoint_dir, max_to_keep=2, resume=resume, metrics_path=metrics_path,
        progress=progress, desc="energy training", items_per_step=batch_size,
        items_name="samples", max_seconds=max_seconds,
        ema=loop.EMA(ema_decay, warmup=True, select=lambda s: s["params"]),
        schedule=_schedule_record(learning_rate), meta=model_meta or {})
    res = loop.run_loop(step_fn, state, batch_fn, config)
    hist = {k: np.asarray([row[k] for row in res.history], np.float64)
            for k in ("loss", "dsm", "cov")}
    return TrainResult(nnx.merge(graphdef, res.ema, rest), hist)


def load(checkpoint_dir, step: int | None = None, *, ema: bool = True) -> nnx.Module:
    """The model of a checkpoint written by :func:`train`.

    Reads the engine's layout ``({"params", "opt_state"}, ema)`` and the flat layout
    ``{"params", "ema", "opt_state"}`` of checkpoints without a ``"steps"`` record.

    Args:
      checkpoint_dir: the checkpoint folder (written with ``model_meta = {"kind": ...,
        "kwargs": ...}``).
      step: the step to read, or None for the newest.
      ema: True for the EMA parameters, False for the trained ones.

    Returns:
      The module.

    Raises:
      ValueError: the checkpoint has no model description.
    """
    from jaxlib_ext.core.checkpoint import Checkpointer

    with Checkpointer(checkpoint_dir, read_only=True) as ckpt:
        meta = ckpt.restore_meta(step)
        if "kind" not in meta:
            raise ValueError(f"checkpoint_dir: {checkpoint_dir} has no model description")
        model = build_model(meta["kind"], meta["kwargs"])
        graphdef, params, rest = nnx.split(model, nnx.Param, ...)
        # the optimiser state is only a restore target: any constant rate has its structure
        opt_state = _optimizer(1e-3).init(params)
        if "steps" in meta:
            (state, avg), _ = ckpt.restore(step, ({"params": params, "opt_state": opt_state},
                                                  params))
            trained = state["params"]
        else:
            flat, _ = ckpt.restore(step, {"params": params, "ema": params,
                                          "opt_state": opt_state})
            trained, avg = flat["params"], flat["ema"]
    return nnx.merge(graphdef, avg if ema else trained, rest)
