"""The training loop in one process: jit vs pmap, resume, bad input, NaN."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from jaxlib_ext import cli, data, sharding, train
from jaxlib_ext.models.transformer import build_transformer

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


@pytest.fixture(scope="module")
def jit_run(tmp_path_factory, corpus):
    return _fit(tmp_path_factory.mktemp("jit"), corpus, parallel="jit")


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


def test_outputs_and_exact_resume(tmp_path, corpus):
    full = _fit(tmp_path / "full", corpus, steps=6)
    out = tmp_path / "part"
    _fit(out, corpus, steps=3)
    resumed = _fit(out, corpus, steps=6, resume=True)
    assert resumed.start_step == 3
    for a, b in zip(jax.tree.leaves(full.state.params), jax.tree.leaves(resumed.state.params),
                    strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    rows = [json.loads(s) for s in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "loss" in r] == list(range(1, 7))
    assert (out / "loss.png").stat().st_size > 1000
    assert sorted(int(p.name) for p in (out / "checkpoints").iterdir()) == [3, 6]
    with pytest.raises(ValueError, match="--resume"):  # never silently mixes two runs
        _fit(out, corpus, steps=6)
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
    "flags, message",
    [
        (["--corpus", "/no/such/corpus"], "--corpus"),
        (["--mesh", "data=3"], "--mesh"),
        (["--mesh", "data=4,fsdp=2", "--batch-size", "6"], "--batch-size"),
        (["--model", "gpt5"], "--model"),
        (["--optimizer", "sgdx"], "--optimizer"),
        (["--seq-len", "4096"], "--seq-len"),
        (["--lr", "-1"], "--lr"),
    ],
)
def test_bad_input_names_the_flag_and_writes_nothing(tmp_path, capsys, flags, message):
    out = tmp_path / "run"
    code = cli.main(["train", "--steps", "2", "--out-dir", str(out), "--no-progress", *flags])
    err = capsys.readouterr().err
    assert code == 2 and message in err, err
    assert not out.exists()


def test_cli_trains_and_reports(tmp_path, capsys):
    code = cli.main([
        "train", "--steps", "4", "--batch-size", "8", "--seq-len", "32", "--eval-every", "2",
        "--eval-batches", "1", "--out-dir", str(tmp_path), "--no-progress", "--mesh", "data=-1",
    ])
    assert code == 0
    assert "done: step 4" in capsys.readouterr().out
    assert (tmp_path / "loss.png").exists() and (tmp_path / "checkpoints" / "4").exists()


@pytest.mark.parametrize(
    "model, optimizer",
    [("transformer", "foam"), ("transformer", "smet"), ("mdn", "adamw"), ("gdn", "adamw")],
)
def test_every_registered_model_and_optimizer_trains(tmp_path, model, optimizer):
    code = cli.main([
        "train", "--model", model, "--optimizer", optimizer, "--steps", "2", "--batch-size", "8",
        "--seq-len", "16", "--eval-every", "2", "--eval-batches", "1", "--checkpoint-every", "2",
        "--out-dir", str(tmp_path), "--no-progress", "--mesh", "data=2,fsdp=4",
    ])
    assert code == 0
    rows = [json.loads(s) for s in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert all(np.isfinite(r.get("loss", r.get("eval_loss"))) for r in rows)


def test_weight_decay_skips_vectors_and_flagged_parameters():
    from flax import nnx

    from jaxlib_ext.models.mdn import build_mdn

    params = nnx.state(build_mdn("tiny", vocab_size=64, rngs=nnx.Rngs(0)), nnx.Param)
    mask = cli.decay_mask(params)
    flat = dict(jax.tree_util.tree_flatten_with_path(mask)[0])
    names = {jax.tree_util.keystr(k): v for k, v in flat.items()}
    assert any(v for k, v in names.items() if "kernel" in k)
    assert not any(v for k, v in names.items() if "A_log" in k or "scale" in k)
    tx = optax.adamw(1e-2, weight_decay=0.5, mask=cli.decay_mask)  # as the CLI's adamw
    state = tx.init(params)
    zero = jax.tree.map(jnp.zeros_like, params)
    updates, _ = tx.update(zero, state, params)
    moved = {jax.tree_util.keystr(k).removesuffix(".value"): bool(jnp.any(u != 0))
             for k, u in jax.tree_util.tree_flatten_with_path(updates)[0]}
    assert moved == names  # with zero gradients only decayed parameters move


def test_mdn_pallas_kernels_train_on_a_data_tensor_mesh_as_on_one_device(tmp_path, corpus):
    """The MDN LM with the Pallas op (interpret mode on CPU): two steps on a 2 x 2 mesh, batch
    over data, heads over tensor (the op's sharding rule), give the losses of one device."""
    from flax import nnx

    from jaxlib_ext.models.mdn import build_mdn

    def fit(out, mesh):
        model = build_mdn(
            "tiny", vocab_size=256, rngs=nnx.Rngs(0), method="pallas", chunk_size=16
        )
        cfg = train.TrainConfig(
            steps=2, out_dir=str(out), **{**SMALL, "batch_size": 4, "eval_every": 100}
        )
        return train.fit(model, optax.adamw(1e-3), corpus, cfg, mesh)

    one = fit(tmp_path / "one", sharding.make_mesh("data=1", jax.devices()[:1]))
    four = fit(tmp_path / "four", sharding.make_mesh("data=2,tensor=2", jax.devices()[:4]))
    np.testing.assert_allclose(four.losses, one.losses, rtol=1e-5)
