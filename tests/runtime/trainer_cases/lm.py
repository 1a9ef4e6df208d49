"""The language-model trainer (:func:`jaxlib_ext.core.train.fit`): a tiny attention LM."""

from __future__ import annotations

import pathlib

import jax
import numpy as np
import optax
from flax import nnx

from jaxlib_ext.core import data, sharding, train
from jaxlib_ext.core.schedule import WarmupCosine
from jaxlib_ext.models import build_lm, lm_config

NAME = "lm"
_HORIZON = 8  # the schedule's length, fixed so that runs of any length share one curve


def run(out: pathlib.Path, *, steps: int, lr_scale: float = 1.0) -> dict[str, np.ndarray]:
    """``steps`` AdamW steps of a 1-block attention LM (d 32) on the embedded corpus."""
    corpus = data.load_corpus(None)
    cfg = lm_config("attention", "swiglu", "tiny", vocab_size=corpus.vocab_size,
                    n_layers=1, d_model=32, n_heads=2, head_dim=16)
    model = build_lm(cfg, rngs=nnx.Rngs(0))
    schedule = WarmupCosine(3e-3 * lr_scale, 2, _HORIZON, 3e-4 * lr_scale)
    tx = optax.adamw(schedule.to_optax())
    result = train.fit(model, tx, corpus, train.TrainConfig(
        steps=steps, batch_size=4, seq_len=16, eval_every=steps, eval_batches=1,
        log_every=1, checkpoint_every=2, out_dir=str(out), resume=True, progress=False,
        schedule=schedule), mesh=sharding.make_mesh("data=1", jax.devices()[:1]))
    leaves = jax.tree_util.tree_flatten_with_path(result.state.params)[0]
    return {jax.tree_util.keystr(p): np.asarray(v) for p, v in leaves}
