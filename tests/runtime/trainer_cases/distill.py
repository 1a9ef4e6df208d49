"""Trainer case ``distill``: stage II of the xLSTM distillation (sparse top-k KD, arXiv
2603.15590) with LoRA on the MLPs, a one-layer random Llama distilled into another on a
four-window teacher cache; the learning-rate schedule spans 8 steps whatever ``steps`` is, so
that a short run and its continuation follow one curve."""

from __future__ import annotations

import pathlib

import jax
import numpy as np
from flax import nnx

from jaxlib_ext.models import distill as D

NAME = "distill"

_SEQ, _WINDOWS, _TOP_K, _HORIZON = 8, 4, 4, 8


def run(out: pathlib.Path, *, steps: int, lr_scale: float = 1.0) -> dict[str, np.ndarray]:
    """Trains the tiny student ``steps`` steps in ``out`` (resuming from its checkpoints) and
    returns its trained parameters (LoRA folded in), flattened by path."""
    out = pathlib.Path(out)
    teacher = D.tiny_teacher(0, n_layers=1, dim=8)
    tokens = np.asarray(teacher.tokenizer.encode("the quick brown fox jumps over the lazy dog "
                                                 * 4), np.int32)
    windows = D.make_windows(tokens, _WINDOWS, _SEQ)
    cache = D.build_teacher_cache(teacher.model, teacher.tokenizer, windows, out / "cache",
                                  top_k=_TOP_K, progress=False)
    student = D.tiny_teacher(1, n_layers=1, dim=8).model
    config = D.StageConfig(steps=steps, learning_rate=1e-2 * lr_scale, batch_size=2,
                           log_every=1, checkpoint_every=2, progress=False)
    result = D.distill_end_to_end(student, cache, config, out / "stage2", train="lora",
                                  lora_rank=2, schedule_steps=_HORIZON)
    leaves = jax.tree_util.tree_flatten_with_path(nnx.state(result.trained, nnx.Param))[0]
    return {jax.tree_util.keystr(k): np.asarray(v) for k, v in leaves}
