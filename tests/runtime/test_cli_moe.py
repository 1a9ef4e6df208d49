"""The training CLI with composed models: --mixer/--ffn, the router's load logged with the
loss, the accounting line, the router's correction bias carried (and resumed) with the
state, and errors that name the flag."""

import json

import chex
import jax
import numpy as np
import optax
import pytest
from flax import nnx

from jaxlib_ext import cli
from jaxlib_ext.core import data, sharding, train
from jaxlib_ext.models import LMConfig, build_lm


def _run(out, *flags):
    return cli.main([
        "train", "--steps", "2", "--batch-size", "8", "--seq-len", "16", "--eval-every", "2",
        "--eval-batches", "1", "--log-every", "1", "--out-dir", str(out), "--no-progress",
        *flags,
    ])


# test_moe_multiprocess.py runs the same path (MDN + LatentMoE) in the default run.
@pytest.mark.slow
def test_mixer_and_ffn_flags_train_and_log_the_router_load(tmp_path, capsys):
    code = _run(tmp_path, "--mixer", "gdn", "--ffn", "moe", "--arch", "n_layers=1",
                "--arch", "num_experts=4", "--mesh", "data=2,expert=4")
    out = capsys.readouterr().out
    assert code == 0, out
    assert "gdn+moe:tiny" in out and "'expert': 4" in out
    assert "MFLOPs/token forward" in out and "ffn routed" in out
    rows = [json.loads(s) for s in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    train_rows = [r for r in rows if "loss" in r]
    assert len(train_rows) == 2
    assert all({"moe_load_max", "moe_load_min", "moe_load_cv"} <= set(r) for r in train_rows)
    meta = json.loads((tmp_path / "checkpoints" / "2" / "meta" / "metadata").read_text())
    cfg = LMConfig.from_dict(meta["model"])
    assert (cfg.mixer_name, cfg.ffn_name, cfg.n_layers, cfg.num_experts) == ("gdn", "moe", 1, 4)


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--mixer", "rnn"], "invalid choice"),
        (["--arch", "experts=4"], "--arch: unknown key 'experts'"),
        (["--arch", "n_layers"], "--arch: expected key=value"),
        (["--ffn", "moe", "--arch", "moe_method=ragged"], "LMConfig.moe_method must be one of"),
        (["--ffn", "moe", "--arch", "top_k=9"], "top_k 9 exceeds LMConfig.num_experts 8"),
        (["--ffn", "latent_moe", "--arch", "latent_dim=512"], "latent_dim must be an int in"),
        (["--preset", "moe-tiny", "--mesh", "expert=8", "--arch", "num_experts=12"],
         "--mesh: the expert axis (8) does not divide the model's 12 experts"),
        (["--mesh", "expert=2,data=4"], "an expert axis (2) needs a model with --ffn moe"),
        (["--init-from", "missing"], "no checkpoint in"),
        (["--mixer", "mdn", "--preset", "moe-tiny"],
         "--preset 'moe-tiny' has --mixer 'attention', not 'mdn'"),
    ],
)
def test_bad_flags_are_named(tmp_path, capsys, flags, message):
    out = tmp_path / "run"
    try:
        code = _run(out, *flags)
    except SystemExit as e:  # argparse choices
        code = e.code
    err = capsys.readouterr().err
    assert code == 2 and message in err, err
    assert not out.exists()


def test_router_bias_is_trained_state_checkpointed_and_resumed_exactly(tmp_path):
    corpus = data.load_corpus()
    cfg = LMConfig.from_flat(ffn="latent_moe", vocab_size=256, d_model=32, n_layers=1, n_heads=2,
                   head_dim=16, max_seq_len=32, num_experts=8, top_k=2, expert_dim=16,
                   latent_dim=8, router_bias_rate=1e-2)
    mesh = sharding.make_mesh("data=2,expert=4")

    def fit(out, steps, resume=False):
        tc = train.TrainConfig(steps=steps, batch_size=8, seq_len=16, eval_every=2,
                               eval_batches=1, log_every=1, checkpoint_every=2,
                               out_dir=str(out), resume=resume, progress=False)
        return train.fit(build_lm(cfg, rngs=nnx.Rngs(0)), optax.adamw(3e-3), corpus, tc, mesh)

    straight = fit(tmp_path / "a", 4)
    bias = straight.state.model_state["blocks"][0]["mlp"]["router_bias"].get_value()
    assert np.abs(np.asarray(bias)).max() > 0  # the balancing step moved it
    assert straight.state.opt_state is not None
    fit(tmp_path / "b", 2)
    resumed = fit(tmp_path / "b", 4, resume=True)
    assert resumed.start_step == 2
    chex.assert_trees_all_close(jax.device_get(straight.state.params),
                                jax.device_get(resumed.state.params), rtol=1e-6, atol=1e-7)
    chex.assert_trees_all_equal(jax.device_get(straight.state.model_state),
                                jax.device_get(resumed.state.model_state))


def test_resume_reads_a_recorded_config_with_per_op_method_names(tmp_path, capsys):
    """A checkpoint whose recorded model names the dispatch ``"ragged"`` and the mixer's op
    ``"chunk"`` (the per-op names) resumes under the flags that say ``xla``; another method
    is still refused."""
    flags = ["--mixer", "gdn", "--ffn", "moe", "--arch", "n_layers=1", "--arch", "d_model=32",
             "--arch", "num_experts=4", "--arch", "expert_dim=16", "--arch", "max_seq_len=16"]
    assert _run(tmp_path, *flags, "--arch", "method=xla") == 0
    meta_file = tmp_path / "checkpoints" / "2" / "meta" / "metadata"
    meta = json.loads(meta_file.read_text())
    assert (meta["model"]["mixer"]["method"], meta["model"]["ffn"]["method"]) == ("xla", "xla")
    meta["model"]["mixer"]["method"], meta["model"]["ffn"]["method"] = "chunk", "ragged"
    meta_file.write_text(json.dumps(meta))
    assert _run(tmp_path, *flags, "--arch", "method=xla", "--resume") == 0
    capsys.readouterr()
    code = _run(tmp_path, *flags, "--arch", "method=reference", "--resume")
    assert code == 2 and "the model flags differ" in capsys.readouterr().err
