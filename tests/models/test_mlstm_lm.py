"""The mLSTM token mixer of the composable LM (xLSTM, arXiv 2405.04517): the layer against a
float64 NumPy transcription of its equations, decode == one full forward with a constant-size
cache, gradients, sharded training on the 8-device mesh, errors that name the field."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from jaxlib_ext.cli import train as train_cmd
from jaxlib_ext.core import data, sharding, train
from jaxlib_ext.models import (
    LayerCache,
    LMConfig,
    MLSTMCache,
    MLSTMConfig,
    MLSTMLayer,
    build_lm,
    lm_config,
)

SMALL = dict(vocab_size=61, d_model=32, n_layers=2, n_heads=2, head_dim=8, expand_v=2,
             max_seq_len=64, mlp_multiple_of=16, chunk_size=16)


def _np_layer(layer: MLSTMLayer, x: np.ndarray) -> np.ndarray:
    """Eqs. (1)-(5) of ``models.mlstm`` in float64, the cell un-stabilised step by step."""
    c = layer.cfg
    p = {path: np.asarray(v[...], np.float64)
         for path, v in nnx.to_flat_state(nnx.state(layer, nnx.Param))}
    b, t, _ = x.shape
    h, kd, vd = c.n_heads, c.head_dim, c.value_dim
    x_m, z = x @ p[("up_proj", "kernel")], x @ p[("z_proj", "kernel")]  # (1)
    w = p[("conv", "weight")]
    pad = np.concatenate([np.zeros((b, w.shape[0] - 1, x_m.shape[-1])), x_m], 1)
    conv = sum(w[i] * pad[:, i : i + t] for i in range(w.shape[0]))
    x_c = (conv / (1 + np.exp(-conv))).reshape(b, t, h, vd)
    x_m = x_m.reshape(b, t, h, vd)
    q = np.einsum("bthv,hvk->bthk", x_c, p[("q_weight",)]) * kd**-0.5  # (2)
    k = np.einsum("bthv,hvk->bthk", x_c, p[("k_weight",)])
    v = np.einsum("bthv,hvw->bthw", x_m, p[("v_weight",)])
    i_gate = np.exp(x @ p[("i_proj", "kernel")] + p[("i_proj", "bias")])  # (3)
    f_gate = 1 / (1 + np.exp(-(x @ p[("f_proj", "kernel")] + p[("f_proj", "bias")])))
    C, n = np.zeros((b, h, kd, vd)), np.zeros((b, h, kd))
    out = np.zeros((b, t, h, vd))
    for s in range(t):  # (4)
        f, i = f_gate[:, s, :, None], i_gate[:, s, :, None]
        C = f[..., None] * C + i[..., None] * k[:, s, :, :, None] * v[:, s, :, None, :]
        n = f * n + i * k[:, s]
        den = np.maximum(np.abs(np.einsum("bhk,bhk->bh", n, q[:, s])), 1.0)
        out[:, s] = np.einsum("bhkv,bhk->bhv", C, q[:, s]) / den[..., None]
    out = out / np.sqrt(np.mean(out**2, -1, keepdims=True) + c.norm_eps) * p[("o_norm", "scale")]
    out = (out + p[("skip",)] * x_c) * (z / (1 + np.exp(-z))).reshape(b, t, h, vd)  # (5)
    return out.reshape(b, t, h * vd) @ p[("o_proj", "kernel")]


@pytest.mark.parametrize(
    "method, xla_form", [("reference", "chunk"), ("xla", "chunk"), ("xla", "parallel")]
)
def test_layer_is_its_equations(method, xla_form, perturb, rel):
    cfg = MLSTMConfig(d_model=16, n_heads=2, head_dim=4, expand_v=2, method=method,
                      xla_form=xla_form, chunk_size=16)
    layer = MLSTMLayer(cfg, rngs=nnx.Rngs(0))
    perturb(layer, jax.random.key(3), scale=0.5)
    x = jax.random.normal(jax.random.key(1), (2, 21, 16))
    y, cache = layer(x)
    assert cache is None and y.shape == x.shape and y.dtype == x.dtype
    assert rel(y, _np_layer(layer, np.asarray(x, np.float64))) < 1e-5


def test_decode_matches_full_forward_with_a_constant_cache(perturb, rel):
    # 12 single steps (the reference path), then a 12-token piece from the carried state (longer
    # than decode_recurrent_max_len: the xla chunk form); the full forward is that from zero
    model = build_lm(LMConfig.from_flat(mixer="mlstm", decode_recurrent_max_len=8,
                              **{**SMALL, "n_layers": 1}), rngs=nnx.Rngs(0))
    perturb(model, jax.random.key(7), scale=0.2)
    tokens = jax.random.randint(jax.random.key(2), (2, 24), 0, 61)
    full = nnx.jit(lambda m, t: m(t))(model, tokens)  # T = 24 pads to 32
    assert full.shape == (2, 24, 61) and full.dtype == jnp.float32
    step = nnx.jit(lambda m, t, c: m.decode_step(t, c))
    cache = model.init_cache(2)
    empty_shapes = jax.tree.map(jnp.shape, cache)
    layer = cache.layers[0]
    assert isinstance(layer, MLSTMCache)
    assert (layer.state.C.shape, layer.state.n.shape, layer.state.m.shape, layer.conv.shape) == (
        (2, 2, 8, 16), (2, 2, 8), (2, 2), (2, 3, 32))
    outs = []
    for i in range(12):
        logits, cache = step(model, tokens[:, i : i + 1], cache)
        outs.append(logits)
    logits, cache = step(model, tokens[:, 12:], cache)
    outs.append(logits)
    assert int(cache.position) == 24
    assert jax.tree.map(jnp.shape, cache) == empty_shapes  # the size does not grow
    assert rel(jnp.concatenate(outs, 1), full) < 1e-5


def test_every_parameter_gets_a_finite_gradient_and_logical_axes():
    cfg = LMConfig.from_flat(mixer="mlstm", method="reference", **{**SMALL, "n_layers": 1})
    model = build_lm(cfg, rngs=nnx.Rngs(0))
    tokens = jax.random.randint(jax.random.key(1), (2, 12), 0, 61)

    def loss(m, t):
        logits = m(t)
        return jnp.mean(optax.softmax_cross_entropy_with_integer_labels(logits[:, :-1], t[:, 1:]))

    grads = nnx.jit(nnx.grad(loss))(model, tokens)
    flat = nnx.to_flat_state(nnx.state(grads, nnx.Param))
    for path, g in flat:
        if path[:3] == ("blocks", 0, "attn"):
            assert bool(jnp.all(jnp.isfinite(g[...]))) and float(jnp.sum(g[...] ** 2)) > 0, path
    mesh = sharding.make_mesh("data=2,fsdp=2,tensor=2")
    for path, var in nnx.to_flat_state(nnx.state(model, nnx.Param)):
        axes = var.get_metadata().get("logical_axes")
        assert axes is not None and len(axes) == len(var.shape), path
    specs = sharding.param_shardings(nnx.state(model.blocks[0].attn, nnx.Param), mesh)
    assert specs["q_weight"].get_value().spec == jax.P("tensor", None, None)  # heads over tensor
    assert specs["up_proj"]["kernel"].get_value().spec == jax.P("fsdp", "tensor")


def _train_losses(mesh, steps=3, batch_size=8, seq_len=32):
    """Losses of ``steps`` jit training steps (``fit``'s jit mode without eval and checkpoints)
    of a one-layer mLSTM LM on ``mesh``, and the train state's shardings."""
    corpus = data.load_corpus()
    cfg = LMConfig.from_flat(mixer="mlstm", **{**SMALL, "vocab_size": 256, "n_layers": 1})
    model = build_lm(cfg, rngs=nnx.Rngs(0))
    tx = optax.adamw(1e-2)
    graphdef, rest, state = train.init_state(model, tx, seed=0)
    state_sh = train.train_state_shardings(state, mesh)
    batch_sh = sharding.batch_sharding(mesh)
    step = train.make_train_step(tx, train.make_loss_fn(graphdef, rest), state_sh, batch_sh)
    state, out = jax.device_put(state, state_sh), []
    for i in range(steps):
        offsets = data.batch_offsets(0, i, batch_size, seq_len, len(corpus.train))
        state, metrics = step(state, data.make_global_batch(corpus.train, offsets, seq_len,
                                                            batch_sh))
        out.append(float(metrics["loss"]))
    return out, state_sh


MESH = "data=2,fsdp=2,tensor=2"


def test_trains_on_the_8_device_mesh():
    losses, state_sh = _train_losses(sharding.make_mesh(MESH))
    assert all(np.isfinite(losses)) and losses[-1] < losses[0]
    flat = {jax.tree_util.keystr(k): v for k, v in
            jax.tree_util.tree_flatten_with_path(state_sh.params)[0]}
    (spec,) = [v.spec for k, v in flat.items() if "q_weight" in k]
    assert spec == jax.P("tensor", None, None)  # heads over tensor


@pytest.mark.slow
def test_trains_on_the_8_device_mesh_as_on_one_device():
    one, _ = _train_losses(sharding.make_mesh("data=1", jax.devices()[:1]))
    eight, _ = _train_losses(sharding.make_mesh(MESH))
    np.testing.assert_allclose(eight, one, rtol=1e-5)


def test_the_cli_selects_the_mlstm_mixer():
    args = train_cmd.build_parser().parse_args(
        ["--mixer", "mlstm", "--ffn", "latent_moe", "--arch", "method=xla",
         "--arch", "xla_form=parallel"])
    cfg = train_cmd.model_config(args, vocab_size=256)
    got = (cfg.mixer_name, cfg.ffn_name, cfg.method, cfg.xla_form, cfg.vocab_size)
    assert got == ("mlstm", "latent_moe", "xla", "parallel", 256)
    args = train_cmd.build_parser().parse_args(["--mixer", "mlstm", "--arch", "method=pallas"])
    with pytest.raises(ValueError, match="method must be one of"):
        train_cmd.model_config(args, vocab_size=256)


def test_presets_use_the_delta_rule_sizes():
    cfg = lm_config("mlstm", "swiglu", "tiny", vocab_size=99)
    assert (cfg.mixer_name, cfg.n_heads, cfg.head_dim, cfg.expand_v) == ("mlstm", 2, 32, 2)
    assert cfg.mixer.layer_config(cfg.d_model, cfg.norm_eps) == MLSTMConfig(
        d_model=128, n_heads=2, head_dim=32, expand_v=2)
    assert LMConfig.from_dict(cfg.to_dict()) == cfg
    model = nnx.eval_shape(lambda: build_lm("400m", mixer="mlstm", rngs=nnx.Rngs(0)))
    assert type(model.blocks[0].attn) is MLSTMLayer and len(model.blocks) == 21


@pytest.mark.parametrize(
    "fields, message",
    [
        (dict(method="pallas"), r"MLSTMConfig.method must be one of .* for mixer 'mlstm'"),
        (dict(method="chunk"), r"MLSTMConfig.method must be one of .* for mixer 'mlstm'"),
        (dict(xla_form="recurrent"), "MLSTMConfig.xla_form must be one of"),
        (dict(chunk_size=24), "MLSTMConfig.chunk_size must be None or one of"),
        (dict(expand_v=0), "MLSTMConfig.expand_v must be a positive int"),
        (dict(conv_size=0), "MLSTMConfig.conv_size must be a positive int"),
        (dict(decode_recurrent_max_len=-1), "decode_recurrent_max_len must be an int >= 0"),
        (dict(n_heads=0), "LMConfig.n_heads must be a positive int"),
    ],
)
def test_bad_configs_name_the_field(fields, message):
    with pytest.raises(ValueError, match=message):
        LMConfig.from_flat(mixer="mlstm", **{**SMALL, **fields})


def test_bad_inputs_name_the_argument():
    layer = MLSTMLayer(MLSTMConfig(d_model=16, n_heads=2, head_dim=4), rngs=nnx.Rngs(0))
    with pytest.raises(TypeError, match="cfg must be an MLSTMConfig"):
        MLSTMLayer(dataclasses.asdict(layer.cfg), rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match="d_model=16"):
        layer(jnp.zeros((1, 4, 7)))
    with pytest.raises(ValueError, match="floating"):
        layer(jnp.zeros((1, 4, 16), jnp.int32))
    with pytest.raises(ValueError, match="batch"):
        layer(jnp.zeros((2, 4, 16)), layer.init_cache(3))
    with pytest.raises(ValueError, match="MLSTMCache"):
        z = jnp.zeros((1, 3, 16))
        layer(jnp.zeros((1, 4, 16)), LayerCache(z, z, z, z))
    with pytest.raises(ValueError, match="batch must be a positive int"):
        layer.init_cache(0)
