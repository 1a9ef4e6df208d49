"""The public API of jaxlib_ext.models: every name in ``__all__`` exists, the builders the CLI
registers resolve, and every model takes the same size-only preset names."""

from __future__ import annotations

import pytest
from flax import nnx

import jaxlib_ext.models as models


def test_all_names_exist_and_are_unique():
    assert len(set(models.__all__)) == len(models.__all__)
    missing = [n for n in models.__all__ if not hasattr(models, n)]
    assert not missing, missing


# model name -> (builder, its preset table)
BUILDERS = {
    "transformer": (models.build_transformer, models.TRANSFORMER_PRESETS),
    "mdn": (models.build_mdn, models.DELTANET_PRESETS),
    "gdn": (models.build_gdn, models.DELTANET_PRESETS),
}


@pytest.mark.parametrize("name", BUILDERS)
def test_builders_take_size_only_presets(name):
    build, presets = BUILDERS[name]
    assert "tiny" in presets and all("-" not in p for p in presets)
    for preset, cfg in presets.items():
        model = nnx.eval_shape(lambda p=preset: build(p, rngs=nnx.Rngs(0)))
        mixer = "attention" if name == "transformer" else name
        # vocab_size=None keeps the preset's
        assert model.cfg == models.LMConfig.from_config(cfg, mixer)
    model = nnx.eval_shape(lambda: build("tiny", vocab_size=77, rngs=nnx.Rngs(0), n_layers=1))
    assert (model.cfg.vocab_size, len(model.blocks)) == (77, 1)
    with pytest.raises(ValueError, match=r"unknown .* preset '.*-tiny'; choose from"):
        build(f"{name}-tiny", rngs=nnx.Rngs(0))


def test_preset_param_count_takes_a_builder():
    assert models.preset_param_count(models.build_gdn) == models.param_count(
        nnx.eval_shape(lambda: models.build_gdn("tiny", rngs=nnx.Rngs(0)))
    )
    with pytest.raises(TypeError, match="build"):
        models.preset_param_count("400m")
