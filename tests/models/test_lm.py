"""The composable language model: every mixer with every FFN, the existing models as its
presets (the same parameters and logits), metrics, decoding and errors."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxlib_ext.models import (
    DELTANET_PRESETS,
    FFNS,
    LM_PRESETS,
    MIXERS,
    TRANSFORMER_PRESETS,
    LMConfig,
    build_gdn,
    build_lm,
    build_mdn,
    build_transformer,
    lm_config,
    param_count,
)

PRESET_MODELS = {
    "attention": (build_transformer, TRANSFORMER_PRESETS),
    "mdn": (build_mdn, DELTANET_PRESETS),
    "gdn": (build_gdn, DELTANET_PRESETS),
}


@pytest.mark.parametrize("mixer", PRESET_MODELS)
def test_preset_models_are_the_composed_swiglu_models(mixer):
    build, presets = PRESET_MODELS[mixer]
    for preset in presets:  # the same tree and shapes at every size, without allocation
        old = nnx.eval_shape(lambda p=preset: build(p, rngs=nnx.Rngs(0)))
        new = nnx.eval_shape(lambda p=preset: build_lm(p, mixer=mixer, rngs=nnx.Rngs(0)))
        assert jax.tree.map(jnp.shape, nnx.state(old)) == jax.tree.map(jnp.shape, nnx.state(new))
        assert param_count(old) == param_count(new)
    old = build("tiny", vocab_size=61, rngs=nnx.Rngs(3), max_seq_len=32)
    new = build_lm("tiny", mixer=mixer, ffn="swiglu", vocab_size=61, rngs=nnx.Rngs(3),
                   max_seq_len=32)
    for a, b in zip(jax.tree.leaves(nnx.state(old)), jax.tree.leaves(nnx.state(new)),
                    strict=True):
        np.testing.assert_array_equal(a, b)
    assert new.cfg == LMConfig.from_config(presets["tiny"], mixer, vocab_size=61,
                                           max_seq_len=32)


# The same parameters through the same block code: one mixer in the default run.
@pytest.mark.parametrize("mixer", ["attention", pytest.param("mdn", marks=pytest.mark.slow),
                                   pytest.param("gdn", marks=pytest.mark.slow)])
def test_preset_models_give_the_composed_models_logits(mixer):
    build, _ = PRESET_MODELS[mixer]
    old = build("tiny", vocab_size=61, rngs=nnx.Rngs(3), max_seq_len=32)
    new = build_lm("tiny", mixer=mixer, ffn="swiglu", vocab_size=61, rngs=nnx.Rngs(3),
                   max_seq_len=32)
    tokens = jax.random.randint(jax.random.key(0), (2, 16), 0, 61)
    np.testing.assert_array_equal(old(tokens), new(tokens))


# Every mixer at a CPU-test size (one layer, d = 32) with every FFN.
SMALL = dict(vocab_size=61, d_model=32, n_layers=1, n_heads=2, head_dim=8, max_seq_len=32,
             mlp_multiple_of=16, num_experts=4, top_k=2, expert_dim=16, shared_expert_dim=16)


def _small(mixer, ffn, **kw) -> LMConfig:
    latent = {"latent_dim": 8} if ffn == "latent_moe" else {}
    return LMConfig.from_flat(mixer=mixer, ffn=ffn, **{**SMALL, **latent, **kw})


# Each mixer and each FFN once in the default run; the other pairs in the slow run.
DEFAULT_PAIRS = {("attention", "moe"), ("gdn", "latent_moe"), ("mdn", "swiglu"),
                 ("mlstm", "moe")}


@pytest.mark.parametrize(
    "mixer, ffn",
    [pytest.param(m, f, marks=() if (m, f) in DEFAULT_PAIRS else pytest.mark.slow)
     for m in MIXERS for f in FFNS],
)
def test_every_mixer_goes_with_every_ffn(mixer, ffn):
    model = build_lm(_small(mixer, ffn, method="reference"), rngs=nnx.Rngs(0))
    tokens = jax.random.randint(jax.random.key(1), (2, 8), 0, 61)

    def loss(m, t):
        logits, metrics = m.logits_and_metrics(t)
        return jnp.mean(logits**2), metrics

    (_, metrics), grads = nnx.value_and_grad(loss, has_aux=True)(model, tokens)
    leaves = jax.tree.leaves(nnx.state(grads, nnx.Param))
    assert leaves and all(bool(jnp.all(jnp.isfinite(g))) for g in leaves)
    block = model.blocks[0]
    assert type(block.attn).__name__ == {"attention": "Attention", "mdn": "MomentumDeltaNet",
                                         "gdn": "GatedDeltaNet", "mlstm": "MLSTMLayer"}[mixer]
    if ffn == "swiglu":
        assert metrics == {}
    else:
        assert set(metrics) == {"moe_load_max", "moe_load_min", "moe_load_cv"}
        assert float(metrics["moe_load_max"]) >= 1.0 >= float(metrics["moe_load_min"])
        assert (block.mlp.latent_dim is None) == (ffn == "moe")


def test_train_forward_updates_the_router_bias_and_eval_does_not():
    model = build_lm(_small("attention", "latent_moe", n_layers=2), rngs=nnx.Rngs(0))
    tokens = jax.random.randint(jax.random.key(1), (2, 16), 0, 61)
    before = np.asarray(model.blocks[0].mlp.router_bias[...])
    eval_logits, _ = model.logits_and_metrics(tokens)
    np.testing.assert_array_equal(model.blocks[0].mlp.router_bias[...], before)
    logits, _ = model.logits_and_metrics(tokens, train=True)
    assert not np.array_equal(model.blocks[0].mlp.router_bias[...], before)
    # the update follows the call: its logits are those of the bias before it
    np.testing.assert_array_equal(logits, eval_logits)


@pytest.mark.slow
@pytest.mark.parametrize("mixer", ["mdn", "attention"])
def test_latent_moe_models_decode_as_one_forward(mixer):
    extra = dict(decode_recurrent_max_len=4, chunk_size=16) if mixer == "mdn" else {}
    cfg = _small(mixer, "latent_moe", n_layers=2, **extra)
    model = build_lm(cfg, rngs=nnx.Rngs(0))
    tokens = jax.random.randint(jax.random.key(2), (2, 12), 0, 61)
    full = model(tokens)
    cache = model.init_cache(2, 12)
    outs = []
    for i in range(0, 12, 3):
        logits, cache = model.decode_step(tokens[:, i : i + 3], cache)
        outs.append(logits)
    got = jnp.concatenate(outs, 1)
    assert float(jnp.linalg.norm(got - full) / jnp.linalg.norm(full)) < 1e-5


def test_presets_and_configs():
    moe = nnx.eval_shape(lambda: build_lm("moe-tiny", rngs=nnx.Rngs(0)))
    assert moe.cfg == LM_PRESETS["moe-tiny"] and moe.cfg.ffn_name == "moe"
    cfg = lm_config("mdn", "latent_moe", "tiny", vocab_size=99, top_k=4)
    assert (cfg.mixer_name, cfg.ffn_name, cfg.vocab_size, cfg.top_k) == ("mdn", "latent_moe", 99, 4)
    assert cfg.latent_dim == cfg.d_model // 4
    assert LMConfig.from_dict(cfg.to_dict()) == cfg
    with pytest.raises(ValueError, match="has ffn 'moe'"):
        lm_config(None, "swiglu", "moe-tiny")
    with pytest.raises(ValueError, match="unknown attention preset 'huge'"):
        lm_config("attention", "swiglu", "huge")


@pytest.mark.parametrize(
    "mixer, ffn, saved, read",
    [
        ("mdn", "moe", ("recurrent", "ragged"), dict(method="reference", moe_method="xla")),
        ("gdn", "latent_moe", ("chunk", "dense"), dict(method="xla", moe_method="reference")),
        ("mlstm", "moe", ("parallel", "pallas"),
         dict(method="xla", xla_form="parallel", moe_method="pallas")),
        ("mlstm", "swiglu", ("chunk", None), dict(method="xla", xla_form="chunk")),
    ],
)
def test_saved_configs_with_per_op_method_names_read_in_the_one_vocabulary(mixer, ffn, saved,
                                                                           read):
    """A checkpoint's recorded config may name methods by the per-op names (``recurrent``,
    ``chunk``, ``parallel``, ``ragged``, ``dense``): ``from_dict`` reads them as
    ``reference | xla | pallas`` (the mLSTM's XLA form in ``xla_form``), nested and flat."""
    extra = {"latent_dim": 8} if ffn == "latent_moe" else {}
    want = LMConfig.from_flat(mixer, ffn, **SMALL, **extra, **read)
    nested = want.to_dict()
    nested["mixer"]["method"] = saved[0]
    nested["mixer"].pop("xla_form", None)
    if saved[1] is not None:
        nested["ffn"]["method"] = saved[1]
    assert LMConfig.from_dict(nested) == want
    flat = {**want.flat(), "mixer": mixer, "ffn": ffn, "method": saved[0]}
    flat.pop("xla_form", None)
    if saved[1] is not None:
        flat["moe_method"] = saved[1]
    assert LMConfig.from_dict(flat) == want


@pytest.mark.parametrize(
    "fields, message",
    [
        (dict(mixer="rnn"), "LMConfig.mixer must be one of"),
        (dict(ffn="glu"), "LMConfig.ffn must be one of"),
        (dict(ffn="moe", num_experts=4, top_k=5), "top_k 5 exceeds LMConfig.num_experts 4"),
        (dict(ffn="latent_moe", latent_dim=64), r"latent_dim must be an int in \(0, d_model=32"),
        (dict(ffn="latent_moe"), "latent_dim must be an int"),
        (dict(ffn="moe", latent_dim=8), "latent_dim must be None for ffn 'moe'"),
        (dict(ffn="moe", moe_method="sparse"), "method must be one of"),
        (dict(ffn="moe", moe_method="ragged"), "LMConfig.moe_method must be one of"),
        (dict(mixer="mdn", method="chunk"), "method must be one of"),
        (dict(d_model=0), "LMConfig.d_model must be a positive int"),
    ],
)
def test_bad_configs_name_the_field(fields, message):
    with pytest.raises(ValueError, match=message):
        LMConfig.from_flat(**{**SMALL, **fields})
