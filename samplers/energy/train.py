"""Training an energy network with anisotropic covariance score matching, EMA and checkpoints.

Each step draws a batch of clean samples, a batch of random covariances
(:func:`~.covariance.random_covariance`: log-uniform levels, pixel- or Fourier-diagonal, the type
drawn per step) and minimises (L.4) of :mod:`.loss` with Adam (gradient clipping at norm 1).
The exponential moving average of the parameters (decay ``min(ema_decay, (1 + t) / (10 + t))``)
is what :func:`load` returns. A non-finite loss stops training with the step number.

Checkpoints (orbax, :class:`jaxlib_ext.core.checkpoint.Checkpointer`) hold the parameters, the EMA,
the optimiser state and the step, with the model's constructor arguments as JSON; training
resumes from the newest one in ``checkpoint_dir``.

Command line (MNIST, a U-Net)::

    python -m jaxlib_ext energy --data mnist --steps 3000 --out runs/energy
"""

from __future__ import annotations

import time
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from tqdm.auto import tqdm

from jaxlib_ext.samplers.energy.covariance import random_covariance
from jaxlib_ext.samplers.energy.loss import acsm_loss
from jaxlib_ext.samplers.energy.network import EnergyMLP, EnergyUNet, functional_energy

__all__ = ["TrainResult", "build_model", "load", "train"]

MODELS = {"mlp": EnergyMLP, "unet": EnergyUNet}


class TrainResult(NamedTuple):
    """model (with the EMA parameters), history (dict of per-step arrays: loss, dsm, cov)."""

    model: nnx.Module
    history: dict[str, np.ndarray]


def build_model(kind: str, kwargs: dict[str, Any], seed: int = 0) -> nnx.Module:
    """``EnergyMLP(**kwargs)`` (``kind="mlp"``) or ``EnergyUNet(**kwargs)`` (``"unet"``)."""
    if kind not in MODELS:
        raise ValueError(f"kind: expected one of {tuple(MODELS)}, got {kind!r}")
    return MODELS[kind](**kwargs, rngs=nnx.Rngs(seed))


def _make_step(graphdef, rest, tx, *, basis, cov_weight, sigma_min, sigma_max, ema_decay):
    def loss_fn(params, x, key):
        kc, kn = jax.random.split(key)
        cov = random_covariance(kc, x.shape, sigma_min=sigma_min, sigma_max=sigma_max,
                                basis=basis)
        energy = functional_energy(graphdef, params, rest)
        return acsm_loss(energy, x, cov, kn, cov_weight=cov_weight)

    @jax.jit
    def step(params, opt_state, ema, t, x, key):
        (loss, parts), grads = jax.value_and_grad(loss_fn, has_aux=True)(params, x, key)
        updates, opt_state = tx.update(grads, opt_state, params)
        params = optax.apply_updates(params, updates)
        decay = jnp.minimum(ema_decay, (1.0 + t) / (10.0 + t))
        ema = jax.tree.map(lambda e, p: decay * e + (1.0 - decay) * p, ema, params)
        return params, opt_state, ema, loss, parts

    return step


def train(model: nnx.Module, data, *, steps: int, batch_size: int = 32, learning_rate=1e-3,
          ema_decay: float = 0.999, cov_weight: float = 1.0, sigma_min: float = 1e-3,
          sigma_max: float = 20.0, basis: str = "mixed", seed: int = 0,
          checkpoint_dir=None, checkpoint_every: int = 500, model_meta: dict | None = None,
          max_seconds: float | None = None, progress: bool = True) -> TrainResult:
    """Train ``model`` on ``data`` (``[N, ...]`` array of clean samples) for ``steps`` steps.

    ``basis``: ``"pixel"``, ``"fourier"`` or ``"mixed"`` (the type of each step's covariances
    drawn at random; vectors use pixel). ``max_seconds`` stops early (with a checkpoint).
    ``model_meta`` (the constructor's kind and arguments) is saved with the checkpoints.
    """
    data = np.asarray(data, np.float32)
    if data.ndim < 2 or data.shape[0] < batch_size:
        raise ValueError(f"data: expected [N, ...] with N >= batch_size={batch_size}, got "
                         f"shape {data.shape}")
    if steps < 1 or batch_size < 1:
        raise ValueError(f"steps, batch_size: expected >= 1, got {steps}, {batch_size}")
    if basis not in ("pixel", "fourier", "mixed"):
        raise ValueError(f"basis: expected 'pixel', 'fourier' or 'mixed', got {basis!r}")
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    tx = optax.chain(optax.clip_by_global_norm(1.0), optax.adam(learning_rate))
    opt_state = tx.init(params)
    ema = params
    start = 0
    ckpt = None
    if checkpoint_dir is not None:
        from jaxlib_ext.core.checkpoint import Checkpointer

        ckpt = Checkpointer(checkpoint_dir, max_to_keep=2)
        if ckpt.latest_step() is not None:
            target = {"params": params, "ema": ema, "opt_state": opt_state}
            restored, _ = ckpt.restore(None, target)
            params, ema, opt_state = restored["params"], restored["ema"], restored["opt_state"]
            start = ckpt.latest_step()
    kinds = ["pixel", "fourier"] if (basis == "mixed" and data.ndim == 4) else [
        "pixel" if basis == "mixed" else basis]
    fns = {b: _make_step(graphdef, rest, tx, basis=b, cov_weight=cov_weight,
                         sigma_min=sigma_min, sigma_max=sigma_max, ema_decay=ema_decay)
           for b in kinds}
    rng = np.random.default_rng(seed + start)
    key = jax.random.fold_in(jax.random.key(seed), start)
    hist = {"loss": [], "dsm": [], "cov": []}
    t0 = time.time()
    bar = tqdm(range(start, steps), disable=not progress, desc="energy training")
    t = start
    for t in bar:
        x = jnp.asarray(data[rng.integers(0, data.shape[0], batch_size)])
        key, sub = jax.random.split(key)
        b = kinds[int(rng.integers(len(kinds)))]
        params, opt_state, ema, loss, parts = fns[b](params, opt_state, ema,
                                                     jnp.asarray(t, jnp.float32), x, sub)
        loss = float(loss)
        if not np.isfinite(loss):
            raise FloatingPointError(f"non-finite loss {loss} at step {t}")
        hist["loss"].append(loss)
        hist["dsm"].append(float(parts["dsm"]))
        hist["cov"].append(float(parts["cov"]))
        if t % 10 == 0:
            bar.set_postfix(loss=f"{np.mean(hist['loss'][-50:]):.4f}")
        done = t + 1
        last = done == steps or (max_seconds is not None and time.time() - t0 > max_seconds)
        if ckpt is not None and (done % checkpoint_every == 0 or last):
            ckpt.save(done, {"params": params, "ema": ema, "opt_state": opt_state},
                      meta=model_meta or {})
        if last:
            break
    if ckpt is not None:
        ckpt.close()
    out = nnx.merge(graphdef, ema, rest)
    return TrainResult(out, {k: np.asarray(v) for k, v in hist.items()})


def load(checkpoint_dir, step: int | None = None) -> nnx.Module:
    """The model with the EMA parameters of a checkpoint written by :func:`train` (with
    ``model_meta = {"kind": ..., "kwargs": ...}``)."""
    from jaxlib_ext.core.checkpoint import Checkpointer

    with Checkpointer(checkpoint_dir) as ckpt:
        meta = ckpt.restore_meta(step)
        if "kind" not in meta:
            raise ValueError(f"checkpoint_dir: {checkpoint_dir} has no model description")
        model = build_model(meta["kind"], meta["kwargs"])
        graphdef, params, rest = nnx.split(model, nnx.Param, ...)
        tx = optax.chain(optax.clip_by_global_norm(1.0), optax.adam(1e-3))
        target = {"params": params, "ema": params, "opt_state": tx.init(params)}
        restored, _ = ckpt.restore(step, target)
    return nnx.merge(graphdef, restored["ema"], rest)
