"""The contract every delta-rule model (MDN, GDN) keeps: jit and grad through the layer, cache
shapes, token-by-token decode == one full forward, logical axes on every parameter, errors that
name the argument. A new delta-rule model joins with one line in ``MODELS``; the mLSTM mixer,
whose state and decode paths differ (``tests/models/test_mlstm_lm.py``), joins the model-level
checks of ``LMS``."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import pytest
from flax import nnx

from jaxlib_ext.models import (
    GatedDeltaNet,
    LMCache,
    MomentumDeltaNet,
    build_gdn,
    build_lm,
    build_mdn,
)

# (layer class, builder, state shape of init_cache(3) for small_cfg)
MODELS = {
    "mdn": (MomentumDeltaNet, build_mdn, (2, 3, 2, 8, 16)),
    "gdn": (GatedDeltaNet, build_gdn, (3, 2, 8, 16)),
}


def _build_mlstm(preset, **kwargs):
    return build_lm(preset, mixer="mlstm", **kwargs)


# the language-model builders whose model-level contract (logical axes, argument errors) is
# the same
LMS = {"mdn": build_mdn, "gdn": build_gdn, "mlstm": _build_mlstm}


# Every parameter of the layer gets a gradient whichever op path runs; the reference (recurrent)
# path compiles in half the time of the xla (chunk) path, whose gradients the op tests and the
# training tests check.
@pytest.mark.parametrize("method", ["reference", pytest.param("xla", marks=pytest.mark.slow)])
@pytest.mark.parametrize("name", MODELS)
def test_layer_jit_grad_and_cache_shapes(name, method, small_cfg):
    cls, _, state_shape = MODELS[name]
    layer = cls(dataclasses.replace(small_cfg, method=method), rngs=nnx.Rngs(0))
    x = jax.random.normal(jax.random.key(1), (3, 21, small_cfg.d_model))

    def loss(l, x):
        y, _ = l(x)
        return jnp.mean(y**2), y

    (_, y), grads = nnx.jit(nnx.value_and_grad(loss, has_aux=True))(layer, x)
    assert y.shape == (3, 21, small_cfg.d_model) and bool(jnp.all(jnp.isfinite(y)))
    leaves = jax.tree.leaves(grads)
    assert leaves and all(bool(jnp.all(jnp.isfinite(g))) for g in leaves)
    assert sum(float(jnp.sum(g**2)) for g in leaves) > 0
    cache = layer.init_cache(3)
    assert cache.state.shape == state_shape
    assert cache.conv_q.shape == (3, 3, 16) and cache.conv_v.shape == (3, 3, 32)
    _, new_cache = nnx.eval_shape(lambda l, x, c: l(x, c), layer, x, cache)
    assert jax.tree.map(jnp.shape, new_cache) == jax.tree.map(jnp.shape, cache)


@pytest.mark.parametrize("name", MODELS)
def test_decode_matches_full_forward(name, small_cfg, perturb, rel):
    _, build, _ = MODELS[name]
    # prefills longer than 8 tokens take the xla (chunk) path with a carried state; single steps
    # the reference (recurrent) path
    model = build("tiny", vocab_size=61, rngs=nnx.Rngs(0), decode_recurrent_max_len=8, **{
        k: getattr(small_cfg, k) for k in ("d_model", "n_heads", "head_dim", "mlp_multiple_of",
                                           "max_seq_len", "chunk_size")
    })
    perturb(model, jax.random.key(7), scale=0.2)
    tokens = jax.random.randint(jax.random.key(2), (2, 36), 0, 61)
    full = nnx.jit(lambda m, t: m(t))(model, tokens)  # chunk path, T = 36 pads to 48
    assert full.shape == (2, 36, 61) and full.dtype == jnp.float32
    step = nnx.jit(lambda m, t, c: m.decode_step(t, c))
    cache = model.init_cache(2)
    outs = []
    for i in range(36):
        logits, cache = step(model, tokens[:, i : i + 1], cache)
        outs.append(logits)
    assert int(cache.position) == 36
    assert rel(jnp.concatenate(outs, 1), full) < 1e-5
    # two prefills of 18 tokens (chunk path from a zero, then a carried state)
    cache = model.init_cache(2)
    l1, cache = step(model, tokens[:, :18], cache)
    l2, cache = step(model, tokens[:, 18:], cache)
    assert int(cache.position) == 36
    assert rel(jnp.concatenate([l1, l2], 1), full) < 1e-5


@pytest.mark.parametrize("name", LMS)
def test_every_parameter_has_logical_axes(name):
    build = LMS[name]
    model = nnx.eval_shape(lambda: build("tiny", vocab_size=61, rngs=nnx.Rngs(0)))
    for path, var in nnx.to_flat_state(nnx.state(model, nnx.Param)):
        axes = var.get_metadata().get("logical_axes")
        assert axes is not None and len(axes) == len(var.shape), path


@pytest.mark.parametrize("name", LMS)
def test_bad_inputs(name):
    build = LMS[name]
    with pytest.raises(ValueError, match="preset"):
        build("7b", rngs=nnx.Rngs(0))
    model = build("tiny", vocab_size=61, rngs=nnx.Rngs(0), d_model=32, head_dim=8,
                  mlp_multiple_of=16, max_seq_len=16)
    with pytest.raises(ValueError, match="max_seq_len"):
        model(jnp.zeros((1, 17), jnp.int32))
    with pytest.raises(ValueError, match="tokens"):
        model(jnp.zeros((1, 4, 2), jnp.int32))
    with pytest.raises(ValueError, match="integer"):
        model(jnp.zeros((1, 4), jnp.float32))
    layer = model.blocks[0].attn
    with pytest.raises(ValueError, match="d_model"):
        layer(jnp.zeros((1, 4, 7)))
    with pytest.raises(ValueError, match="batch"):
        layer(jnp.zeros((2, 4, 32)), layer.init_cache(3))
    with pytest.raises(ValueError, match="batch"):
        layer.init_cache(0)
    with pytest.raises(ValueError, match="layers"):
        model.decode_step(jnp.zeros((1, 1), jnp.int32), LMCache((), jnp.zeros((), jnp.int32)))
