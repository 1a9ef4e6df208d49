"""MDN blocks with LatentMoE FFNs, trained by FOAM on 2 processes x 2 CPU devices with the
experts sharded over an ``expert`` mesh axis that spans both processes (tokens travel between
them by all-to-all): one command line of the training CLI, run by ``mp_worker.py``."""

import json
import math

import numpy as np
import pytest

from tests.runtime._workers import launch, logs, params

pytestmark = [pytest.mark.multiprocess, pytest.mark.xdist_group("runtime_moe_multiprocess")]

FLAGS = [
    "--mixer", "mdn", "--ffn", "latent_moe", "--arch", "n_layers=1", "--optimizer", "foam",
    "--mesh", "expert=4",
    "--steps", "3", "--batch-size", "8", "--seq-len", "32", "--lr", "3e-3", "--log-every", "1",
    "--eval-every", "3", "--eval-batches", "1", "--checkpoint-every", "3", "--no-progress",
]


def test_mdn_latent_moe_trains_by_foam_on_two_processes_with_an_expert_axis(tmp_path):
    codes = launch(tmp_path, FLAGS, processes=2, devices=2)
    assert codes == [0, 0], logs(tmp_path)
    rows = [json.loads(s) for s in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in rows if "loss" in r]
    assert [r["step"] for r in train] == [1, 2, 3]
    assert all(math.isfinite(r["loss"]) for r in train)
    assert all(math.isfinite(r["eval_loss"]) for r in rows if "eval_loss" in r)
    # the router's load is logged with the loss: 1 = balanced, above 1 for the busiest expert
    assert all(r["moe_load_max"] >= 1.0 >= r["moe_load_min"] >= 0.0 for r in train)
    assert all(np.all(np.isfinite(p)) for p in params(tmp_path))
    log = (tmp_path / "log0.txt").read_text()
    assert "mdn+latent_moe" in log and "'expert': 4" in log and "MFLOPs/token" in log
