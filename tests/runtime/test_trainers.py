"""The engine's guarantees, checked once for every trainer of the library.

Every trainer runs on :func:`jaxlib_ext.core.loop.run_loop`; each joins this module with one
file in ``trainer_cases/`` (a tiny instance, see its ``__init__``). For each:

* a run killed with SIGKILL at a random step (while its newest checkpoint may still be being
  written) and resumed ends bit-equal to an uninterrupted run;
* a NaN loss stops the run with :class:`~jaxlib_ext.core.loop.NonFiniteLossError`, naming the
  step and the last good checkpoint, and saves nothing past it;
* a resume that asks for another learning-rate schedule is refused.
"""

from __future__ import annotations

import importlib
import os
import pathlib
import signal
import subprocess
import sys
import zlib

import jax.numpy as jnp
import numpy as np
import pytest

from jaxlib_ext.core import loop
from jaxlib_ext.core.schedule import ScheduleMismatchError

HERE = pathlib.Path(__file__).parent
CASES = sorted(p.stem for p in (HERE / "trainer_cases").glob("*.py") if p.stem != "__init__")
STEPS = 6


def _case(name: str):
    sys.path.insert(0, str(HERE))
    try:
        return importlib.import_module(f"trainer_cases.{name}")
    finally:
        sys.path.remove(str(HERE))


@pytest.fixture(scope="module", params=CASES)
def reference(request, tmp_path_factory):
    """``(case, folder, params)`` of an uninterrupted run of ``STEPS`` steps."""
    case = _case(request.param)
    out = tmp_path_factory.mktemp(f"{request.param}_reference")
    return case, out, case.run(out, steps=STEPS)


def _assert_equal(got: dict, want: dict) -> None:
    assert got.keys() == want.keys()
    for k in want:
        np.testing.assert_array_equal(got[k], want[k], err_msg=k)


def test_killed_and_resumed_run_equals_the_uninterrupted_one(reference, tmp_path):
    case, _, want = reference
    # a step drawn per case (fixed by its name, so that a failure reproduces)
    kill_at = 1 + zlib.crc32(case.NAME.encode()) % (STEPS - 1)
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    proc = subprocess.run(
        [sys.executable, str(HERE / "trainer_worker.py"), case.NAME, str(tmp_path),
         str(STEPS), "--kill-at", str(kill_at)],
        env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-3000:]
    _assert_equal(case.run(tmp_path, steps=STEPS), want)


def test_a_nan_loss_stops_the_run_naming_the_step(reference, tmp_path, monkeypatch):
    case = reference[0]
    run_loop = loop.run_loop

    def poisoned_run_loop(step_fn, state, batch_fn, config, **kwargs):
        def poisoned_step(state, batch):
            state, metrics = step_fn(state, batch)
            poisoned_step.calls += 1
            if poisoned_step.calls == 3:
                metrics = {**metrics, "loss": jnp.float32(jnp.nan)}
            return state, metrics

        poisoned_step.calls = 0
        return run_loop(poisoned_step, state, batch_fn, config, **kwargs)

    monkeypatch.setattr(loop, "run_loop", poisoned_run_loop)
    with pytest.raises(loop.NonFiniteLossError, match="at step 3.*step 2") as info:
        case.run(tmp_path, steps=STEPS)
    assert (info.value.step, info.value.last_good) == (3, 2)


def test_a_resume_with_another_schedule_is_refused(reference):
    case, out, _ = reference
    with pytest.raises(ScheduleMismatchError):
        case.run(out, steps=STEPS, lr_scale=2.0)
