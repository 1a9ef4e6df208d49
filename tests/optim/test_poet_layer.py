"""The POET-X layer: PoetLinear's parameters and initialisation, and poetize."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxlib_ext.models.transformer import build_transformer
from jaxlib_ext.optim import PoetLinear, poet_layers, poetize, poetize_report
from jaxlib_ext.optim.poet_layer import PoetBase, PoetPermutation, PoetRotation


def test_layer_parameter_count_and_init():
    layer = PoetLinear(24, 40, block_size=8, rngs=nnx.Rngs(0))
    rot = nnx.state(layer, PoetRotation)
    assert sum(x.size for x in jax.tree.leaves(rot)) == (24 + 40) * (8 - 1) // 2
    assert layer.num_trainable == (24 + 40) * 7 // 2
    w = layer.poet_base[...]
    np.testing.assert_allclose(jnp.linalg.norm(w, axis=0), 1.0, rtol=1e-6)  # unit-norm neurons
    x = jax.random.normal(jax.random.key(0), (3, 24))
    np.testing.assert_array_equal(layer(x), jnp.matmul(x, w, precision="highest"))
    perms = [np.asarray(layer.perm_in[...]), np.asarray(layer.perm_out[...])]
    for p, size in zip(perms, (24, 40), strict=True):
        np.testing.assert_array_equal(np.sort(p), np.arange(size))


def test_poetize_converts_divisible_layers_and_reports_the_rest():
    model = build_transformer("tiny", rngs=nnx.Rngs(0))
    kernel = model.blocks[0].mlp.up.kernel[...]
    report = poetize_report(model, 32)
    assert len(report.converted) == 10 and report.skipped == ()
    report = poetize_report(model, 128, exclude=("lm_head", "qkv"))
    assert ("blocks.0.attn.qkv", "excluded") in report.skipped
    assert any("352" in why for _, why in report.skipped)  # the SwiGLU width, 11 * 32
    with pytest.warns(UserWarning, match="left dense"):
        poetize(model, 128)
    assert {p for p, _ in poet_layers(model)} == {f"blocks.{i}.attn.{n}" for i in (0, 1)
                                                  for n in ("qkv", "out")}
    poetize(model, 32)  # the rest
    layer = model.blocks[0].mlp.up
    assert isinstance(layer, PoetLinear) and isinstance(layer.poet_base, PoetBase)
    assert isinstance(layer.perm_in, PoetPermutation)
    assert layer.poet_base.get_metadata()["logical_axes"] == ("embed", "mlp")
    x = jax.random.normal(jax.random.key(0), (2, 3, 128))
    unit = kernel / jnp.linalg.norm(kernel, axis=0)
    np.testing.assert_allclose(layer(x), jnp.matmul(x, unit, precision="highest"), rtol=1e-5,
                               atol=1e-6)
    with pytest.raises(ValueError, match="block_size"):
        poetize(model, 1)


def test_bad_block_sizes_are_named():
    with pytest.raises(ValueError, match="block_size must be an int >= 2"):
        PoetLinear(8, 8, block_size=1, rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match="must divide"):
        PoetLinear(8, 12, block_size=8, rngs=nnx.Rngs(0))
