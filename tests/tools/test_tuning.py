"""kernel_audit.tuning, .candidates and .check: the tuner's table and choice, the candidates'
form, and the check against the recurrence (interpret mode, one tiny case)."""

import jax.numpy as jnp
import pytest
from kernel_audit import candidates, check, tuning
from kernel_audit.inputs import random_inputs
from kernel_audit.mdn_probes import OPTION_NAMES

from jaxlib_ext.pallas_kernels.mdn import momentum_delta_rule


def test_candidates_are_keyword_overrides_of_the_op():
    labels = [label for label, _ in candidates.TUNE_CANDIDATES]
    assert labels[0] == "default" and candidates.TUNE_CANDIDATES[0][1] == {}
    assert len(set(labels)) == len(labels)
    assert all(c in candidates.TUNE_CANDIDATES for c in candidates.MOSAIC_CANDIDATES)
    for label, overrides in candidates.TUNE_CANDIDATES:  # chunk_size or MDNKernelConfig fields
        assert set(overrides) <= set(OPTION_NAMES), label


@pytest.fixture(scope="module")
def tiny():
    """Float32 inputs at B=1, T=24, H=1, K=V=16, shared by the module's tests."""
    return random_inputs(1, 24, 1, 16, 16, jnp.float32)


def _fake_op(*inputs, slow=False, broken=False):
    """Stands for the Pallas op: (o, state); ``broken`` fails to trace like a refused kernel."""
    if broken:
        raise ValueError("over the shared-memory limit")
    o = inputs[2] * (inputs[6][..., None] if not slow else jnp.exp(inputs[6])[..., None])
    return o, None


def test_tune_reports_failures_as_rows_and_returns_a_working_candidate(tiny, capsys):
    cands = (("default", {}), ("broken", {"broken": True}), ("slow", {"slow": True}))
    label, op = tuning.tune(_fake_op, tiny, warmup=1, iters=1, candidates=cands)
    assert label in ("default", "slow")
    assert op(*tiny)[0].shape == tiny[2].shape
    out = capsys.readouterr().out
    assert "| broken | FAILED: ValueError: over the shared-memory limit |" in out
    assert f"fastest: {label}" in out


def test_tune_stops_at_the_budget(tiny, capsys):
    cands = (("default", {}), ("slow", {"slow": True}))
    assert tuning.tune(_fake_op, tiny, 0, 1, candidates=cands, budget_s=-1.0) is None
    out = capsys.readouterr().out
    assert out.count("skipped (tuning budget spent)") == 2 and "every candidate failed" in out


def _recurrent(*inputs, chunk_size, interpret, gain=1.0, **kw):
    """Stands for the Pallas op in the check's own tests: the reference, times ``gain``."""
    o, state = momentum_delta_rule(*inputs, method="reference", **kw)
    return o * gain, state


@pytest.mark.parametrize("gain", [1.0, 1.01])
def test_check_passes_within_tolerance_and_raises_beyond(tiny, gain, monkeypatch, capsys):
    """The check's comparison and verdict, with the reference standing in for the kernel (and a
    1% error in the outputs): errors of the outputs and final state, PASS or CheckFailed (the
    gradients' comparison runs in the slow tests)."""
    monkeypatch.setattr(check, "pallas_op", _recurrent)
    if gain == 1.0:
        errs = check.check_against_recurrent(tiny, 16, 16, True, 1e-4, grads=False, gain=gain)
        assert errs == {"o": 0.0, "final_state": 0.0}
        assert " gain=1.0: PASS (tol 0.0001) o=" in capsys.readouterr().out
    else:
        with pytest.raises(check.CheckFailed, match="pallas vs recurrent"):
            check.check_against_recurrent(tiny, 16, 16, True, 1e-4, grads=False, gain=gain)
        assert ": FAIL (tol 0.0001) o=1.0e-02" in capsys.readouterr().out


@pytest.mark.slow
def test_check_of_the_interpreted_kernel_passes(tiny):
    """Interpret mode, float32, one tiny shape, forward and final state."""
    errs = check.check_against_recurrent(tiny, 16, 16, True, 1e-4, grads=False)
    assert set(errs) == {"o", "final_state"} and max(errs.values()) < 1e-4


@pytest.mark.slow
def test_tuning_cli_cpu_runs():
    """The CPU path of the command: checks with gradients, then the first two candidates."""
    assert tuning.main(["--cpu", "--check", "--dtype", "float32"]) == 0
