"""The training loop in one process: jit vs pmap vs shard_map, exact resume on the recorded
schedule, outputs, bad input named by field (library) and flag (CLI), NaN, the CLI's --opt."""

import functools
import json

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from jaxlib_ext import cli
from jaxlib_ext.cli import train as train_cmd
from jaxlib_ext.core import data, sharding, train
from jaxlib_ext.core.schedule import ScheduleMismatchError, warmup_cosine
from jaxlib_ext.models import build_transformer

SMALL = dict(batch_size=8, seq_len=32, eval_every=3, eval_batches=1, log_every=1,
             checkpoint_every=3, progress=False)


@pytest.fixture(scope="module")
def corpus():
    return data.load_corpus()


def _fit(tmp_path, corpus, *, steps=6, tx=None, mesh=None, **kw):
    from flax import nnx

    model = build_transformer("tiny", vocab_size=256, rngs=nnx.Rngs(0), max_seq_len=64)
    tx = tx or optax.adamw(1e-3)
    cfg = train.TrainConfig(steps=steps, out_dir=str(tmp_path), **{**SMALL, **kw})
    return train.fit(model, tx, corpus, cfg, mesh or sharding.make_mesh("data=4,fsdp=2"))


# The tests that compare with this run share one xdist worker, so it is made once.
SHARES_JIT_RUN = pytest.mark.xdist_group("runtime_jit_run")


@pytest.fixture(scope="module")
def jit_run(tmp_path_factory, corpus):
    return _fit(tmp_path_factory.mktemp("jit"), corpus, parallel="jit")


@SHARES_JIT_RUN
@pytest.mark.parametrize("parallel", ["pmap", "shard_map"])
def test_data_parallel_steps_match_the_sharded_jit_step(tmp_path, corpus, jit_run, parallel):
    other = _fit(tmp_path, corpus, parallel=parallel)
    np.testing.assert_allclose(jit_run.losses, other.losses, rtol=1e-5)
    assert len(other.losses) == 6 and other.losses[-1] < other.losses[0]
    # Parameters: relative RMS per leaf. (Elementwise checks are too strict: Adam turns a
    # 1e-12 gradient difference on an unused embedding row into a visible update.)
    for a, b in zip(jax.tree.leaves(jit_run.state.params), jax.tree.leaves(other.state.params),
                    strict=True):
        a, b = np.asarray(a), np.asarray(b)
        assert np.linalg.norm(a - b) <= 1e-3 * np.linalg.norm(a)


@SHARES_JIT_RUN
def test_outputs_and_exact_resume(tmp_path, corpus, jit_run):
    out = tmp_path / "part"
    recorded = warmup_cosine(1e-3, 6)  # metadata only here: the optimizer is constant-rate
    _fit(out, corpus, steps=3, schedule=recorded)
    resumed = _fit(out, corpus, steps=6, resume=True, schedule=recorded)
    assert resumed.start_step == 3
    chex.assert_trees_all_equal(jit_run.state.params, resumed.state.params)
    rows = [json.loads(s) for s in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "loss" in r] == list(range(1, 7))
    assert (out / "loss.png").stat().st_size > 1000
    assert sorted(int(p.name) for p in (out / "checkpoints").iterdir()) == [3, 6]
    with pytest.raises(ValueError, match="TrainConfig.resume"):  # never mixes two runs
        _fit(out, corpus, steps=6)
    with pytest.raises(ScheduleMismatchError, match="TrainConfig.schedule.*total_steps"):
        _fit(out, corpus, steps=8, resume=True, schedule=warmup_cosine(1e-3, 8))
    # The sharded state: params over fsdp where the logical axis is "embed".
    kernel = resumed.state.params["blocks"][0]["mlp"]["gate"]["kernel"]
    assert kernel.get_value().sharding.spec == jax.P("fsdp", None)


def test_optimizer_state_sharing_one_array_between_leaves_is_donated_safely(tmp_path, corpus):
    zeros = jnp.zeros([])
    shared = optax.GradientTransformation(
        lambda p: (zeros, zeros), lambda u, s, p=None: (u, (s[0] + 1, s[1] + 1))
    )
    result = _fit(tmp_path, corpus, steps=2, tx=optax.chain(optax.adamw(1e-3), shared))
    assert int(result.state.step) == 2


def _nan_after(step):
    def update(updates, count, params=None):
        poison = jnp.where(count + 1 >= step, jnp.nan, 0.0)
        return jax.tree.map(lambda u: u + poison, updates), count + 1

    return optax.GradientTransformation(lambda p: jnp.zeros([], jnp.int32), update)


def test_nan_loss_stops_with_step_and_keeps_last_good_checkpoint(tmp_path, corpus):
    tx = optax.chain(optax.adamw(1e-3), _nan_after(4))
    with pytest.raises(train.NonFiniteLossError, match="at step 5.*step 3"):
        _fit(tmp_path, corpus, steps=6, tx=tx)
    assert sorted(int(p.name) for p in (tmp_path / "checkpoints").iterdir()) == [3]


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"steps": 0}, "TrainConfig.steps must be positive"),
        ({"parallel": "vmap"}, "TrainConfig.parallel must be one of"),
        ({"batch_size": 6}, "TrainConfig.batch_size 6 is not divisible"),
        ({"seq_len": 128}, "TrainConfig.seq_len 128 exceeds"),
    ],
)
def test_library_errors_name_the_config_field_and_write_nothing(tmp_path, corpus, overrides,
                                                                 message):
    with pytest.raises(ValueError, match=message):
        _fit(tmp_path / "run", corpus, **overrides)
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--corpus", "/no/such/corpus"], "--corpus"),
        (["--mesh", "data=3"], "--mesh"),
        (["--mesh", "data=4,fsdp=2", "--batch-size", "6"], "--batch-size"),
        (["--model", "gpt5"], "--model"),
        (["--optimizer", "sgdx"], "--optimizer"),
        (["--seq-len", "4096"], "--seq-len"),
        (["--lr", "-1"], "--lr"),
        (["--steps", "0"], "--steps"),
        (["--parallel", "pmap", "--batch-size", "4"], "--batch-size 4 is not divisible"),
        (["--eval-every", "0"], "--eval-every must be positive"),
        (["--opt", "levels=4", "--optimizer", "foam"], "--opt: unknown key 'levels'"),
        (["--opt", "level=2.5", "--optimizer", "foam"], "--opt level: expected int"),
        (["--opt", "level"], "--opt: expected key=value"),
        (["--extend-schedule"], "--extend-schedule only applies with --resume"),
    ],
)
def test_bad_input_names_the_flag_and_writes_nothing(tmp_path, capsys, flags, message):
    out = tmp_path / "run"
    code = cli.main(["train", "--steps", "2", "--out-dir", str(out), "--no-progress", *flags])
    err = capsys.readouterr().err
    assert code == 2 and message in err, err
    assert not out.exists()


def _cli_train(out, *flags):
    return cli.main([
        "train", "--batch-size", "8", "--seq-len", "32", "--eval-every", "2",
        "--eval-batches", "1", "--out-dir", str(out), "--no-progress", "--mesh", "data=-1",
        "--lr", "3e-3", *flags,
    ])


def test_cli_trains_reports_and_resumes_only_on_the_recorded_schedule(tmp_path, capsys):
    assert _cli_train(tmp_path, "--steps", "4") == 0
    assert "done: step 4" in capsys.readouterr().out
    assert (tmp_path / "loss.png").exists() and (tmp_path / "checkpoints" / "4").exists()
    metrics = (tmp_path / "metrics.jsonl").read_text()

    # Another length would rebuild the schedule: refused, naming --steps and the fixes.
    assert _cli_train(tmp_path, "--steps", "6", "--resume") == 2
    err = capsys.readouterr().err
    assert "--steps 6 differs" in err and "--steps 4 as before" in err, err
    assert "--extend-schedule" in err, err
    assert _cli_train(tmp_path, "--steps", "4", "--resume", "--lr", "1e-3") == 2
    assert "--lr 0.003 as before" in capsys.readouterr().err
    assert (tmp_path / "metrics.jsonl").read_text() == metrics  # nothing written

    # Asked for: two more steps on the recorded curve, which holds its final value.
    assert _cli_train(tmp_path, "--steps", "6", "--resume", "--extend-schedule") == 0
    assert "done: step 6" in capsys.readouterr().out
    from jaxlib_ext.core.checkpoint import Checkpointer

    with Checkpointer(tmp_path / "checkpoints", read_only=True) as ckpt:
        meta = ckpt.restore_meta(6)
    assert meta["schedule"] == warmup_cosine(3e-3, 4).to_dict()
    assert meta["steps"] == 6 and meta["optimizer_steps"] == 4
    # Resuming the extended run again with its own length needs no flag.
    assert _cli_train(tmp_path, "--steps", "6", "--resume") == 0


def test_extended_schedule_keeps_the_recorded_curve_and_holds_its_end():
    recorded = warmup_cosine(3e-3, 8)
    extended = recorded.extended_to(12)
    old, new = recorded.to_optax(), extended.to_optax()
    for t in range(8):
        assert float(new(t)) == float(old(t))
    assert [float(new(t)) for t in range(8, 12)] == [pytest.approx(3e-4, rel=1e-6)] * 4


def test_opt_values_take_the_type_of_the_recipe_default():
    got = train_cmd.parse_opt(["level=4", "scale=1", "second_moment=rms", "b2=0.9"], "foam", 100)
    assert got == {"level": 4, "scale": 1.0, "second_moment": "rms", "b2": 0.9}
    assert type(got["scale"]) is float
    with pytest.raises(ValueError, match="--opt: key 'level' given twice"):
        train_cmd.parse_opt(["level=4", "level=2"], "foam", 100)


@pytest.mark.parametrize(
    "model, optimizer, opts",
    [("transformer", "foam", ["--opt", "level=1", "--opt", "b2=0.9"]),
     ("transformer", "smet", ["--opt", "density=0.25"]),
     ("mdn", "adamw", []),
     ("gdn", "adamw", []),
     ("transformer", "adamw", ["--mixer", "mlstm"])],
)
def test_every_registered_model_and_optimizer_trains(tmp_path, model, optimizer, opts):
    code = cli.main([
        "train", "--model", model, "--optimizer", optimizer, *opts, "--steps", "2",
        "--batch-size", "8", "--arch", "n_layers=1",
        "--seq-len", "16", "--eval-every", "2", "--eval-batches", "1", "--checkpoint-every", "2",
        "--out-dir", str(tmp_path), "--no-progress", "--mesh", "data=2,fsdp=4",
    ])
    assert code == 0
    rows = [json.loads(s) for s in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert all(np.isfinite(r.get("loss", r.get("eval_loss"))) for r in rows)


def test_weight_decay_skips_vectors_and_flagged_parameters():
    from flax import nnx

    from jaxlib_ext.models import build_mdn
    from jaxlib_ext.optim import decay_mask

    params = nnx.state(build_mdn("tiny", vocab_size=64, rngs=nnx.Rngs(0)), nnx.Param)
    mask = decay_mask(params)
    flat = dict(jax.tree_util.tree_flatten_with_path(mask)[0])
    names = {jax.tree_util.keystr(k): v for k, v in flat.items()}
    assert any(v for k, v in names.items() if "kernel" in k)
    assert not any(v for k, v in names.items() if "A_log" in k or "scale" in k)
    tx = optax.adamw(1e-2, weight_decay=0.5, mask=decay_mask)  # as the adamw recipe
    state = tx.init(params)
    zero = jax.tree.map(jnp.zeros_like, params)
    updates, _ = tx.update(zero, state, params)
    moved = {jax.tree_util.keystr(k).removesuffix(".value"): bool(jnp.any(u != 0))
             for k, u in jax.tree_util.tree_flatten_with_path(updates)[0]}
    assert moved == names  # with zero gradients only decayed parameters move


def test_mdn_pallas_kernels_train_on_a_data_tensor_mesh_as_on_one_device(corpus):
    """The MDN LM with the Pallas op (interpret mode on CPU): two jit training steps on a
    2 x 2 mesh, batch over data, heads over tensor (the op's sharding rule), give the losses
    of one device. (The steps of ``fit``'s jit mode, without its eval and checkpoints.)"""
    from flax import nnx

    from jaxlib_ext.models import build_mdn

    def losses(mesh, steps=2, batch_size=4, seq_len=32):
        model = build_mdn(
            "tiny", vocab_size=256, rngs=nnx.Rngs(0), method="pallas", chunk_size=16, n_layers=1
        )
        tx = optax.adamw(1e-3)
        graphdef, rest, state = train.init_state(model, tx, seed=0)
        state_sh = train.train_state_shardings(state, mesh)
        batch_sh = sharding.batch_sharding(mesh)
        step = train.make_train_step(tx, train.make_loss_fn(graphdef, rest), state_sh, batch_sh)
        state, out = jax.device_put(state, state_sh), []
        for i in range(steps):
            offsets = data.batch_offsets(0, i, batch_size, seq_len, len(corpus.train))
            state, metrics = step(
                state, data.make_global_batch(corpus.train, offsets, seq_len, batch_sh)
            )
            out.append(float(metrics["loss"]))
        return out

    one = losses(sharding.make_mesh("data=1", jax.devices()[:1]))
    four = losses(sharding.make_mesh("data=2,tensor=2", jax.devices()[:4]))
    np.testing.assert_allclose(four, one, rtol=1e-5)


class _TinyLM:
    """Embedding and a dense head: the smallest model ``make_loss_fn`` trains."""

    @staticmethod
    def build():
        from flax import nnx

        class TinyLM(nnx.Module):
            def __init__(self, rngs):
                self.embed = nnx.Embed(256, 16, rngs=rngs)
                self.head = nnx.Linear(16, 256, rngs=rngs)

            def __call__(self, tokens):
                return self.head(jnp.tanh(self.embed(tokens)))

        return TinyLM(nnx.Rngs(0))


def _parallel_run(tx, mode, n_devices, steps=3, batch_size=8, seq_len=8):
    """``(grad norms, final params)`` of ``steps`` steps of ``mode`` on ``n_devices``."""
    graphdef, rest, state = train.init_state(_TinyLM.build(), tx, seed=0)
    loss_fn = train.make_loss_fn(graphdef, rest)
    tokens = np.asarray(jax.random.randint(jax.random.key(1), (steps, batch_size, seq_len + 1),
                                           0, 256), np.int32)
    mesh = sharding.make_mesh(f"data={n_devices}", jax.devices()[:n_devices])
    batch_sh = sharding.batch_sharding(mesh)
    if mode == "jit":
        state_sh = train.train_state_shardings(state, mesh)
        step = train.make_train_step(tx, loss_fn, state_sh, batch_sh)
        state = jax.device_put(state, state_sh)
    elif mode == "shard_map":
        step = train.make_shard_map_train_step(tx, loss_fn, mesh)
        state = jax.device_put(state, sharding.replicated(mesh))
    else:
        step = train.make_pmap_train_step(tx, loss_fn)
        state = jax.tree.map(lambda x: jnp.stack([np.asarray(x)] * n_devices), state)
    norms = []
    for batch in tokens:
        if mode == "pmap":
            batch = batch.reshape(n_devices, -1, seq_len + 1)
        else:
            batch = jax.device_put(batch, batch_sh)
        state, metrics = step(state, batch)
        norms.append(float(np.ravel(metrics["grad_norm"])[0]))
    params = state.params if mode != "pmap" else jax.tree.map(lambda x: x[0], state.params)
    return norms, [np.asarray(x) for x in jax.tree.leaves(params)]


# SGD shows a gradient off by a constant factor (Adam's scale invariance hides it); the
# clipped run has its threshold under the gradient norm, so clipping acts on every step.
PARALLEL_TXS = {
    "sgd": lambda: optax.sgd(0.5),
    "clipped_sgd": lambda: optax.chain(optax.clip_by_global_norm(0.05), optax.sgd(0.5)),
}


@functools.cache
def _one_device_run(tx_name):
    return _parallel_run(PARALLEL_TXS[tx_name](), "jit", 1)


@pytest.mark.parametrize("tx_name", sorted(PARALLEL_TXS))
@pytest.mark.parametrize("mode", train.PARALLEL_MODES)
def test_every_parallel_mode_on_8_devices_matches_jit_on_one(mode, tx_name):
    """Grad norms and parameters after three steps equal those of ``jit`` on one device."""
    ref_norms, ref_params = _one_device_run(tx_name)
    norms, params = _parallel_run(PARALLEL_TXS[tx_name](), mode, 8)
    if tx_name == "clipped_sgd":
        assert min(ref_norms) > 0.05  # the clip is active
    np.testing.assert_allclose(norms, ref_norms, rtol=1e-5)
    for a, b in zip(ref_params, params, strict=True):
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-6)
