"""Trainer case ``energy``: :func:`jaxlib_ext.samplers.energy.train.train` (covariance score
matching, arXiv 2605.15487) of a tiny :class:`EnergyMLP` (2-D, 8 hidden units, 259 parameters)
on 64 fixed Gaussian vectors, with the EMA (``min(0.9, (1 + t) / (10 + t))``) on; checkpoints
every 2 steps under ``out / "energy"``, resumed from when present. Returns the trained and the
EMA parameters, read back from the final checkpoint with :func:`~.train.load`."""

from __future__ import annotations

import pathlib

import jax
import numpy as np
from flax import nnx

NAME = "energy"

_KWARGS = {"dim": 2, "hidden": 8, "depth": 2}


def _flat(prefix: str, model) -> dict[str, np.ndarray]:
    leaves, _ = jax.tree_util.tree_flatten_with_path(nnx.to_pure_dict(nnx.state(model, nnx.Param)))
    return {prefix + jax.tree_util.keystr(p): np.asarray(x) for p, x in leaves}


def run(out: pathlib.Path, *, steps: int, lr_scale: float = 1.0) -> dict[str, np.ndarray]:
    from jaxlib_ext.samplers.energy import train as T

    data = np.random.default_rng(0).normal(size=(64, 2)).astype(np.float32)
    meta = {"kind": "mlp", "kwargs": _KWARGS}
    ckpt = pathlib.Path(out) / "energy"
    T.train(T.build_model("mlp", _KWARGS, seed=0), data, steps=steps, batch_size=16,
            learning_rate=1e-2 * lr_scale, ema_decay=0.9, sigma_min=0.05, sigma_max=5.0,
            seed=0, checkpoint_dir=ckpt, checkpoint_every=2, model_meta=meta, progress=False)
    return {**_flat("params", T.load(ckpt, ema=False)), **_flat("ema", T.load(ckpt))}
