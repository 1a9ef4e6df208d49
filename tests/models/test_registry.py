"""The mixer/FFN registry: every name builds its registered module from its registered config,
and an unknown name is refused naming the LMConfig field."""

import pytest
from flax import nnx

from jaxlib_ext.models import FFNS, MIXERS, lm_config
from jaxlib_ext.models import registry as R


def test_the_exported_names_are_the_registry():
    assert MIXERS == tuple(R.MIXER_REGISTRY) and FFNS == tuple(R.FFN_REGISTRY)


@pytest.mark.parametrize("mixer", MIXERS)
def test_every_mixer_builds_its_registered_module(mixer):
    cfg = lm_config(mixer, "swiglu", "tiny", vocab_size=64)
    part = R.mixer_part(mixer)
    assert isinstance(cfg.mixer, part.config)
    assert isinstance(R.make_mixer(cfg, nnx.Rngs(0)), part.module)


@pytest.mark.parametrize("ffn", FFNS)
def test_every_ffn_builds_its_registered_module(ffn):
    cfg = lm_config("attention", ffn, "tiny", vocab_size=64)
    part = R.ffn_part(ffn)
    assert isinstance(cfg.ffn, part.config)
    assert isinstance(R.make_ffn(cfg, nnx.Rngs(0)), part.module)


def test_unknown_names_name_the_field():
    with pytest.raises(ValueError, match="LMConfig.mixer must be one of"):
        R.mixer_part("rnn")
    with pytest.raises(ValueError, match="LMConfig.ffn must be one of"):
        R.ffn_part("mlp")
