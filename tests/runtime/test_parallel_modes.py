"""The training CLI's three parallel modes (``--parallel jit | pmap | shard_map``) with every
token mixer, two steps on 8 simulated CPU devices at the tiniest shapes.

Every mixer trains under ``shard_map`` (its ops' scan carries and kernel outputs carry the
varying-axes type that ``check_vma=True`` checks); the attention mixer also under ``jit`` and
``pmap``, with the same losses (and, a slow run, the MDN mixer in all three modes). ``jit`` for
every mixer also runs in ``tests/runtime/test_train.py``.
"""

from __future__ import annotations

import functools
import json
import pathlib
import tempfile

import numpy as np
import pytest

from jaxlib_ext import cli
from jaxlib_ext.core.train import PARALLEL_MODES
from jaxlib_ext.models import MIXERS


@functools.cache
def _train(mixer: str, parallel: str) -> tuple[int, list[dict]]:
    """``(exit status, metrics rows)`` of a 2-step CLI run (each run once per session)."""
    out = pathlib.Path(tempfile.mkdtemp(prefix=f"parallel-{mixer}-{parallel}-"))
    code = cli.main([
        "train", "--mixer", mixer, "--parallel", parallel, "--num-cpu-devices", "8",
        "--steps", "2", "--batch-size", "8", "--seq-len", "16", "--arch", "n_layers=1",
        "--eval-every", "2", "--eval-batches", "1", "--log-every", "1", "--checkpoint-every", "2",
        "--out-dir", str(out), "--no-progress",
    ])  # fmt: skip
    path = out / "metrics.jsonl"
    rows = [json.loads(s) for s in path.read_text().splitlines()] if path.exists() else []
    return code, rows


def _losses(rows) -> list[float]:
    return [r["loss"] for r in rows if "loss" in r]


@pytest.mark.parametrize("mixer", MIXERS)
def test_every_mixer_trains_under_shard_map(mixer):
    code, rows = _train(mixer, "shard_map")
    assert code == 0
    losses = _losses(rows)
    assert len(losses) == 2 and np.all(np.isfinite(losses)), rows
    assert all(np.isfinite(r["eval_loss"]) for r in rows if "eval_loss" in r)


@pytest.mark.parametrize("parallel", [m for m in PARALLEL_MODES if m != "shard_map"])
def test_the_other_modes_train_as_shard_map_does(parallel):
    """``jit`` (sharded state) and ``pmap`` (replicated state) take the same two steps as
    ``shard_map``, shown on the attention mixer (the cheapest to compile)."""
    code, rows = _train("attention", parallel)
    assert code == 0
    np.testing.assert_allclose(_losses(rows), _losses(_train("attention", "shard_map")[1]),
                               rtol=1e-5)


@pytest.mark.slow
def test_mdn_trains_alike_in_every_parallel_mode():
    """The MDN mixer, whose op paths (scan carries, kernel outputs) are typed for shard_map,
    takes the same two steps in all three modes."""
    runs = {mode: _train("mdn", mode) for mode in PARALLEL_MODES}
    assert {mode: code for mode, (code, _) in runs.items()} == dict.fromkeys(PARALLEL_MODES, 0)
    ref = _losses(runs["jit"][1])
    assert len(ref) == 2
    for mode, (_, rows) in runs.items():
        np.testing.assert_allclose(_losses(rows), ref, rtol=1e-5, err_msg=mode)
