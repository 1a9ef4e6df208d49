"""Launching ``mp_worker.py`` runs of the training CLI as real processes on 127.0.0.1."""

from __future__ import annotations

import os
import pathlib
import socket
import subprocess
import sys

import numpy as np

WORKER = pathlib.Path(__file__).with_name("mp_worker.py")
TIMEOUT = 420


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


#: The ``JAX_*`` variables a worker keeps: the test run's persistent compilation cache, so that
#: a killed run and its resume (the same programs) compile once.
KEPT = ("JAX_COMPILATION_CACHE_DIR", "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS")


def worker_env(devices: int) -> dict:
    """This environment without its other ``JAX_*`` variables (:data:`KEPT`), on ``devices``
    simulated CPU devices."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("JAX_") or k in KEPT}
    env.update(JAX_PLATFORMS="cpu", JAX_NUM_CPU_DEVICES=str(devices), PYTHONUNBUFFERED="1")
    return env


def launch(out: pathlib.Path, flags, *, processes: int, devices: int) -> list[int]:
    """Runs ``mp_worker.py --dump out/params.npz FLAGS --out-dir out`` on ``processes``
    processes of ``devices`` CPU devices each (a coordinator on a free port when more than one),
    logs in ``out/log<i>.txt``; returns the exit codes, killing every process on a timeout."""
    port = free_port()
    procs = []
    for pid in range(processes):
        cmd = [sys.executable, str(WORKER), "--dump", str(out / "params.npz"), *flags,
               "--out-dir", str(out)]
        if processes > 1:
            cmd += ["--coordinator", f"127.0.0.1:{port}", "--num-processes", str(processes),
                    "--process-id", str(pid)]
        log = open(out / f"log{pid}.txt", "w")  # noqa: SIM115 (closed by the OS at exit)
        procs.append(subprocess.Popen(cmd, env=worker_env(devices), stdout=log, stderr=log))
    codes = []
    for p in procs:
        try:
            codes.append(p.wait(timeout=TIMEOUT))
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise
    return codes


def logs(out: pathlib.Path) -> str:
    """The tails of every process's log, for an assertion message."""
    return "\n".join(p.read_text()[-3000:] for p in sorted(out.glob("log*.txt")))


def params(out: pathlib.Path) -> list:
    """The parameters process 0 dumped at the end of its run, in tree order."""
    with np.load(out / "params.npz") as f:
        names = [k for k in f.files if k.startswith("arr_")]
        return [f[k] for k in sorted(names, key=lambda s: int(s.split("_")[1]))]
