"""Multi-host for real: 2 processes x 2 CPU devices on 127.0.0.1 with gloo collectives.

A run killed at any moment resumes from the newest committed checkpoint (or from scratch)
and ends equal to an uninterrupted run. The kills are events of the run (see mp_worker.py),
never moments in time, so each case is deterministic.
"""

import pathlib
import signal

import numpy as np
import pytest

from tests.runtime._workers import launch, logs, params

# One xdist worker runs them all, so the module's runs are made once.
pytestmark = [pytest.mark.multiprocess, pytest.mark.xdist_group("runtime_multiprocess")]

COMMON = [
    "--model", "transformer", "--preset", "tiny", "--arch", "n_layers=1", "--steps", "8",
    "--batch-size", "8",
    "--seq-len", "32", "--lr", "3e-3", "--mesh", "data=2,fsdp=2", "--log-every", "1",
    "--eval-every", "4", "--eval-batches", "1", "--checkpoint-every", "4", "--no-progress",
]


def _launch(out: pathlib.Path, *, processes: int, devices: int, extra=()):
    return launch(out, [*COMMON, *extra], processes=processes, devices=devices)


def _losses(out):
    import json

    rows = [json.loads(s) for s in (out / "metrics.jsonl").read_text().splitlines()]
    return np.array([r["loss"] for r in rows if "loss" in r])


def _start_step(out) -> int:
    with np.load(out / "params.npz") as f:
        return int(f["start_step"])


def _committed(out) -> list[int]:
    return sorted(int(p.name) for p in (out / "checkpoints").iterdir() if p.name.isdigit())


def _uncommitted(out) -> list[str]:
    return sorted(p.name for p in (out / "checkpoints").iterdir() if not p.name.isdigit())


def _assert_killed(codes, out):
    # Every process SIGKILLs itself at the same event; a peer that notices the loss first is
    # aborted by the coordination service or fails its collective, as on a real cluster.
    assert -signal.SIGKILL in codes and 0 not in codes, (codes, logs(out))


def _assert_ends_as_the_uninterrupted_run(out, uninterrupted):
    for a, b in zip(params(out), params(uninterrupted), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)
    # The metrics of the resumed run continue the uninterrupted trajectory, row for row.
    np.testing.assert_allclose(_losses(out), _losses(uninterrupted), rtol=1e-5)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("mp")
    two, one = root / "two", root / "one"
    two.mkdir(), one.mkdir()
    assert _launch(two, processes=2, devices=2) == [0, 0], logs(two)
    assert _launch(one, processes=1, devices=4) == [0], logs(one)
    return root


def test_two_processes_match_one_process_of_four_devices(runs):
    two, one = _losses(runs / "two"), _losses(runs / "one")
    assert len(two) == 8 and len(one) == 8
    np.testing.assert_allclose(two, one, rtol=1e-5)
    assert two[-1] < two[0]


def test_two_process_checkpoint_restores_in_one_process(runs):
    import jax
    from flax import nnx

    from jaxlib_ext.core.checkpoint import Checkpointer
    from jaxlib_ext.core.train import init_state
    from jaxlib_ext.models.lm import build_lm, compose
    from jaxlib_ext.optim import build_optimizer

    cfg = compose(model="transformer", preset="tiny", vocab_size=256, overrides={"n_layers": 1})
    model = build_lm(cfg, rngs=nnx.Rngs(0))
    tx = build_optimizer("adamw", 3e-3, steps=8)
    _, _, state = init_state(model, tx, seed=0)
    rep = jax.sharding.NamedSharding(jax.make_mesh((1,), ("x",)), jax.P())
    target = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=rep), state)
    ckpt = Checkpointer(runs / "two" / "checkpoints", read_only=True)
    assert ckpt.latest_step() == 8
    restored, meta = ckpt.restore(None, target)
    ckpt.close()
    assert meta["step"] == 8 and int(restored.step) == 8
    got = [np.asarray(x) for x in jax.tree.leaves(restored.params)]
    for a, b in zip(got, params(runs / "two"), strict=True):
        np.testing.assert_array_equal(a, b)


def test_killed_after_a_committed_save_resumes_from_it(runs):
    out = runs / "after_commit"
    out.mkdir()
    codes = _launch(out, processes=2, devices=2,
                    extra=["--kill-at-step", "7", "--commit-first"])
    _assert_killed(codes, out)
    assert _committed(out) == [4], _uncommitted(out)
    codes = _launch(out, processes=2, devices=2, extra=["--kill-at-step", "-1", "--resume"])
    assert codes == [0, 0], logs(out)
    assert _start_step(out) == 4
    _assert_ends_as_the_uninterrupted_run(out, runs / "two")


def test_killed_while_a_save_is_in_flight_resumes_from_the_last_committed_one(runs):
    out = runs / "in_flight"
    out.mkdir()
    codes = _launch(out, processes=2, devices=2, extra=["--kill-in-save", "4"])
    _assert_killed(codes, out)
    # The step-4 save was written but never committed: only Orbax's temporary folder exists.
    assert _committed(out) == [], _uncommitted(out)
    assert [name for name in _uncommitted(out) if name.startswith("4.")], _uncommitted(out)
    codes = _launch(out, processes=2, devices=2, extra=["--resume"])
    assert codes == [0, 0], logs(out)
    assert _start_step(out) == 0  # no committed checkpoint: from scratch
    assert _committed(out) == [4, 8] and _uncommitted(out) == []
    _assert_ends_as_the_uninterrupted_run(out, runs / "two")
