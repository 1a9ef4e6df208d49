"""MDN blocks with LatentMoE FFNs, trained by FOAM on 2 processes x 2 CPU devices with the
experts sharded over an ``expert`` mesh axis that spans both processes (tokens travel between
them by all-to-all): one command line of the training CLI, run by ``mp_worker.py``."""

import json
import math
import os
import pathlib
import socket
import subprocess
import sys

import numpy as np
import pytest

pytestmark = [pytest.mark.multiprocess, pytest.mark.xdist_group("runtime_moe_multiprocess")]

WORKER = pathlib.Path(__file__).with_name("mp_worker.py")
FLAGS = [
    "--mixer", "mdn", "--ffn", "latent_moe", "--optimizer", "foam", "--mesh", "expert=4",
    "--steps", "3", "--batch-size", "8", "--seq-len", "32", "--lr", "3e-3", "--log-every", "1",
    "--eval-every", "3", "--eval-batches", "1", "--checkpoint-every", "3", "--no-progress",
]
TIMEOUT = 420


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _launch(out: pathlib.Path, *, processes: int, devices: int) -> list[int]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("JAX_")}
    env.update(JAX_PLATFORMS="cpu", JAX_NUM_CPU_DEVICES=str(devices), PYTHONUNBUFFERED="1")
    port = _free_port()
    procs = []
    for pid in range(processes):
        cmd = [sys.executable, str(WORKER), "--dump", str(out / "params.npz"), *FLAGS,
               "--out-dir", str(out), "--coordinator", f"127.0.0.1:{port}",
               "--num-processes", str(processes), "--process-id", str(pid)]
        log = open(out / f"log{pid}.txt", "w")  # noqa: SIM115 (closed by the OS at exit)
        procs.append(subprocess.Popen(cmd, env=env, stdout=log, stderr=log))
    codes = []
    for p in procs:
        try:
            codes.append(p.wait(timeout=TIMEOUT))
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise
    return codes


def _logs(out) -> str:
    return "\n".join(p.read_text()[-3000:] for p in sorted(out.glob("log*.txt")))


def _params(out) -> list:
    with np.load(out / "params.npz") as f:
        return [f[k] for k in f.files if k.startswith("arr_")]


def test_mdn_latent_moe_trains_by_foam_on_two_processes_with_an_expert_axis(tmp_path):
    codes = _launch(tmp_path, processes=2, devices=2)
    assert codes == [0, 0], _logs(tmp_path)
    rows = [json.loads(s) for s in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in rows if "loss" in r]
    assert [r["step"] for r in train] == [1, 2, 3]
    assert all(math.isfinite(r["loss"]) for r in train)
    assert all(math.isfinite(r["eval_loss"]) for r in rows if "eval_loss" in r)
    # the router's load is logged with the loss: 1 = balanced, above 1 for the busiest expert
    assert all(r["moe_load_max"] >= 1.0 >= r["moe_load_min"] >= 0.0 for r in train)
    assert all(np.all(np.isfinite(p)) for p in _params(tmp_path))
    log = (tmp_path / "log0.txt").read_text()
    assert "mdn+latent_moe" in log and "'expert': 4" in log and "MFLOPs/token" in log
