"""Orthogonal growth (arXiv 2510.08008): interposition order, the exact function of width growth
without noise and with doubled top-k, noise only on the copies, and a grown checkpoint of the
training CLI that a new run trains from (--init-from)."""

from __future__ import annotations

import json
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxlib_ext import cli
from jaxlib_ext.core import data
from jaxlib_ext.core.train import cross_entropy
from jaxlib_ext.models import LMConfig, build_lm
from jaxlib_ext.models.growth import (
    grow_checkpoint,
    grow_config,
    grow_model,
    interposition_order,
    load_model,
    stacking_order,
)

SMALL = dict(vocab_size=61, d_model=32, n_layers=2, n_heads=2, head_dim=8, max_seq_len=32,
             num_experts=4, top_k=2, expert_dim=16, latent_dim=8, shared_expert_dim=16)


def _threefry():
    """The non-partitionable threefry for the eager draws of the models built here (their
    initialisation, the grown copies' noise): the same distributions, other bits, and a
    fraction of the CPU compilation time (the partitionable one takes up to seconds per 3-D
    expert kernel shape)."""
    return jax.threefry_partitionable(False)


def _grow(parent, **kw):
    with _threefry():
        return grow_model(parent, **kw)


def _model(**kw):
    cfg = LMConfig.from_flat(**{"mixer": "attention", "ffn": "latent_moe", **SMALL, **kw})
    with _threefry():
        model = build_lm(cfg, rngs=nnx.Rngs(0))
    for block in model.blocks:  # a trained-looking bias, so that selection depends on it
        mlp = block.mlp
        mlp.router_bias[...] = 0.05 * jax.random.normal(jax.random.key(5), (mlp.num_experts,))
    return model


# one compiled program per model (eager, its blocks' MoE dispatch compiles hundreds of small
# ops)
_call = nnx.jit(lambda module, x: module(x))


def _blocks(model):
    return [jax.tree.leaves(nnx.state(b, nnx.Param)) for b in model.blocks]


def test_interposition_puts_layer_i_at_2i_and_2i_plus_1():
    assert interposition_order(3) == [0, 0, 1, 1, 2, 2]
    assert stacking_order(3) == [0, 1, 2, 0, 1, 2]
    with _threefry():
        parent = build_lm(LMConfig.from_flat(**{**SMALL, "latent_dim": None}), rngs=nnx.Rngs(1))
    grown = _grow(parent, depth=True, width=False)
    assert len(grown.blocks) == 4 and grown.cfg.n_layers == 4
    for j, i in enumerate(interposition_order(2)):
        for a, b in zip(_blocks(grown)[j], _blocks(parent)[i], strict=True):
            np.testing.assert_array_equal(a, b)
    for name in ("embed", "final_norm", "lm_head"):
        np.testing.assert_array_equal(jax.tree.leaves(nnx.state(getattr(grown, name)))[0],
                                      jax.tree.leaves(nnx.state(getattr(parent, name)))[0])
    with pytest.raises(ValueError, match="width growth needs a moe"):
        grow_model(parent, depth=True, width=True)


@pytest.mark.parametrize("ffn, extra", [
    ("moe", {"latent_dim": None}),
    ("latent_moe", {}),
    ("latent_moe", {"latent_dim": 4}),  # latent width = expert count: axes found by name
], ids=["moe", "latent_moe", "latent_equals_experts"])
def test_width_growth_without_noise_and_doubled_top_k_is_the_same_function(ffn, extra):
    parent = _model(ffn=ffn, shared_expert_dim=None, **extra)  # the routed part alone
    grown = _grow(parent, depth=False, width=True, noise_scale=0.0, double_top_k=True)
    assert (grown.cfg.num_experts, grown.cfg.top_k) == (8, 4)
    x = jnp.asarray(np.random.default_rng(2).standard_normal((2, 12, 32), dtype=np.float32))
    y0, _ = parent.blocks[0].mlp(x)
    y1, _ = grown.blocks[0].mlp(x)
    assert float(jnp.linalg.norm(y1 - y0) / jnp.linalg.norm(y0)) < 1e-6
    tokens = jax.random.randint(jax.random.key(3), (2, 16), 0, 61)
    a, b = _call(parent, tokens), _call(grown, tokens)
    assert float(jnp.linalg.norm(b - a) / jnp.linalg.norm(a)) < 1e-6
    # keeping top-k instead changes the layer's function (each expert then meets its copy)
    kept = _grow(parent, depth=False, width=True, noise_scale=0.0, double_top_k=False)
    y2, _ = kept.blocks[0].mlp(x)
    assert float(jnp.linalg.norm(y2 - y0) / jnp.linalg.norm(y0)) > 1e-2


def test_noise_goes_to_the_copies_of_the_expert_matrices_only():
    parent = _model()
    grown = _grow(parent, depth=False, width=True, noise_scale=0.1, key=jax.random.key(0))
    p, g = parent.blocks[1].mlp, grown.blocks[1].mlp
    for name in ("w1", "w2"):
        old, new = np.asarray(getattr(p, name)[...]), np.asarray(getattr(g, name)[...])
        np.testing.assert_array_equal(new[:4], old)  # the originals
        rel = np.linalg.norm(new[4:] - old) / np.linalg.norm(old)
        assert 0.05 < rel < 0.2  # the copies: noise of 0.1 x the weight's std
    np.testing.assert_array_equal(g.router[...], np.concatenate([p.router[...]] * 2, axis=1))
    np.testing.assert_array_equal(g.router_bias[...], np.concatenate([p.router_bias[...]] * 2))
    for name in ("down", "up", "shared_w1", "shared_w2"):
        np.testing.assert_array_equal(getattr(g, name)[...], getattr(p, name)[...])
    with pytest.raises(ValueError, match="key is required"):
        grow_model(parent, width=True, noise_scale=0.1)
    with pytest.raises(TypeError, match="LMConfig"):
        grow_config(parent)


def _train(out, *flags):
    code = cli.main([
        "train", "--batch-size", "8", "--seq-len", "32", "--eval-every", "100",
        "--eval-batches", "1", "--log-every", "1", "--out-dir", str(out), "--no-progress",
        "--lr", "3e-3", *flags,
    ])
    assert code == 0
    return [json.loads(s) for s in (out / "metrics.jsonl").read_text().splitlines()]


def test_a_grown_checkpoint_trains_from_the_parents_loss(tmp_path):
    arch = ["--arch", "n_layers=1", "--arch", "d_model=64", "--arch", "expert_dim=64"]
    _train(tmp_path / "parent", "--preset", "moe-tiny", "--steps", "20", *arch)
    cfg = grow_checkpoint(tmp_path / "parent" / "checkpoints", tmp_path / "grown",
                          noise_scale=0.01, seed=0)
    assert (cfg.n_layers, cfg.num_experts, cfg.top_k) == (2, 16, 4)
    # on the same held-out batch, the grown model starts close to its parent
    corpus = data.load_corpus()
    offsets = data.eval_batches(corpus.eval, 8, 32, 1)[0]
    batch = jnp.asarray(corpus.eval[offsets[:, None] + np.arange(33)[None, :]])
    losses = []
    for folder in (tmp_path / "parent" / "checkpoints", tmp_path / "grown"):
        model, _ = load_model(folder)
        losses.append(float(cross_entropy(_call(model, batch[:, :-1]), batch[:, 1:])))
    parent_loss, grown_loss = losses
    assert parent_loss < 4.5 and abs(grown_loss - parent_loss) < 0.25 * parent_loss, losses
    rows = _train(tmp_path / "child", "--init-from", str(tmp_path / "grown"), "--steps", "3")
    train = [r["loss"] for r in rows if "loss" in r]
    assert len(train) == 3 and all(math.isfinite(v) for v in train)
    assert abs(train[0] - parent_loss) < 0.25 * parent_loss, (train, losses)
    with pytest.raises(ValueError, match="already holds"):
        grow_checkpoint(tmp_path / "parent" / "checkpoints", tmp_path / "grown")
