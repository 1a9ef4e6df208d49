"""Trainer case ``milp``: :func:`jaxlib_ext.samplers.milp.training.train_supervised` (Neural
Diving's cross-entropy on HiGHS-optimal assignments, arXiv 2012.13349) of a tiny
:class:`BipartiteGNN` (hidden 8, one layer) on three generated set covers (6 rows, 10 columns),
a batch of two per step; HiGHS's optima of such problems are found exactly and alike on every
call. Checkpoints every 2 steps under ``out / "milp"``, resumed from when present. Returns the
trained parameters."""

from __future__ import annotations

import pathlib

import jax
import numpy as np
from flax import nnx

NAME = "milp"


def run(out: pathlib.Path, *, steps: int, lr_scale: float = 1.0) -> dict[str, np.ndarray]:
    from jaxlib_ext.samplers import milp

    problems = [milp.set_cover(100 + i, n_rows=6, n_cols=10, density=0.3) for i in range(3)]
    model, _ = milp.train_supervised(
        jax.random.key(0), problems, hidden=8, num_layers=1, steps=steps, batch_size=2,
        learning_rate=1e-2 * lr_scale, checkpoint_dir=pathlib.Path(out) / "milp",
        checkpoint_every=2)
    leaves, _ = jax.tree_util.tree_flatten_with_path(nnx.to_pure_dict(nnx.state(model, nnx.Param)))
    return {jax.tree_util.keystr(p): np.asarray(x) for p, x in leaves}
