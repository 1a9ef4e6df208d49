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
    MIXERS,
    TRANSFORMER_PRESETS,
    LMConfig,
    build_gdn,
    build_lm,
    build_mdn,
    build_transformer,
    param_count,
)

PRESET_MODELS = {
    "attention": (build_transformer, TRANSFORMER_PRESETS),
    "mdn": (build_mdn, DELTANET_PRESETS),
    "gdn": (build_gdn, DELTANET_PRESETS),
}

# Every mixer at a CPU-test size (one layer, d = 32) with every FFN.
SMALL = dict(vocab_size=61, d_model=32, n_layers=1, n_heads=2, head_dim=8, max_seq_len=32,
             mlp_multiple_of=16, num_experts=4, top_k=2, expert_dim=16, shared_expert_dim=16)


def _small(mixer, ffn, **kw) -> LMConfig:
    latent = {"latent_dim": 8} if ffn == "latent_moe" else {}
    return LMConfig(mixer=mixer, ffn=ffn, **{**SMALL, **latent, **kw})


@pytest.mark.parametrize("mixer", MIXERS)
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
    tokens = jax.random.randint(jax.random.key(0), (2, 16), 0, 61)
    np.testing.assert_array_equal(old(tokens), new(tokens))
    assert new.cfg == LMConfig.from_config(presets["tiny"], mixer, vocab_size=61,
                                           max_seq_len=32)
