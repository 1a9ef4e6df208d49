"""The token mixers and feed-forward parts of the composable language model, by name.

One table per kind: :data:`MIXER_REGISTRY` and :data:`FFN_REGISTRY` map a name to a
:class:`Part`, the part's config class and module class and how a block builds the module
from its config and the backbone's sizes. :data:`MIXERS` and :data:`FFNS` are the names. A
new mixer is one config class with a ``kind`` name, one module class and one entry here.

Protocols. A mixer is ``mixer(x [B, T, d], cache=None) -> (y [B, T, d], new_cache or None)``
with ``init_cache(batch, max_len)`` when it can decode: without a cache the tokens are
positions ``0 .. T-1`` of a fresh sequence; with one they follow the tokens it has consumed.
An FFN has ``forward(x [B, T, d], *, train=False) -> (y, metrics)``, ``metrics`` a mapping of
scalar arrays (``train`` lets a mixture of experts update its router's correction bias).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from flax import nnx

from jaxlib_ext.models.attention import Attention, AttentionConfig
from jaxlib_ext.models.gdn import GatedDeltaNet, GDNConfig
from jaxlib_ext.models.latent_moe import LatentMoE, LatentMoEConfig
from jaxlib_ext.models.layers import SwiGLU, SwiGLUConfig
from jaxlib_ext.models.mdn import MDNConfig, MomentumDeltaNet
from jaxlib_ext.models.mlstm import MLSTMLayer, MLSTMMixerConfig

__all__ = [
    "Part",
    "MIXER_REGISTRY",
    "FFN_REGISTRY",
    "MIXERS",
    "FFNS",
    "mixer_part",
    "ffn_part",
    "make_mixer",
    "make_ffn",
]


@dataclasses.dataclass(frozen=True)
class Part:
    """One registered part of a language-model block.

    Attributes:
      config: the part's config class (with a ``kind`` name).
      module: the part's module class.
      build: ``build(config, backbone, rngs) -> module``; ``backbone`` has ``d_model``,
        ``n_layers`` and ``norm_eps``.
    """

    config: type
    module: type
    build: Callable


def _delta(cfg, backbone, rngs, *, module):
    return module(cfg.layer_config(backbone.d_model, backbone.norm_eps), rngs=rngs)


MIXER_REGISTRY: dict[str, Part] = {
    "attention": Part(AttentionConfig, Attention, lambda c, b, r: Attention(
        c, d_model=b.d_model, n_layers=b.n_layers, rngs=r)),
    "mdn": Part(MDNConfig, MomentumDeltaNet,
                lambda c, b, r: _delta(c, b, r, module=MomentumDeltaNet)),
    "gdn": Part(GDNConfig, GatedDeltaNet, lambda c, b, r: _delta(c, b, r, module=GatedDeltaNet)),
    "mlstm": Part(MLSTMMixerConfig, MLSTMLayer, lambda c, b, r: MLSTMLayer(
        c.layer_config(b.d_model, b.norm_eps), rngs=r)),
}

FFN_REGISTRY: dict[str, Part] = {
    "swiglu": Part(SwiGLUConfig, SwiGLU, lambda c, b, r: SwiGLU(
        b.d_model, c.width(b.d_model), rngs=r)),
    # one layer for both: the standard mixture of experts is LatentMoE without a latent width
    "moe": Part(LatentMoEConfig, LatentMoE, lambda c, b, r: LatentMoE(b.d_model, c, rngs=r)),
    "latent_moe": Part(LatentMoEConfig, LatentMoE,
                       lambda c, b, r: LatentMoE(b.d_model, c, rngs=r)),
}

MIXERS: tuple[str, ...] = tuple(MIXER_REGISTRY)
FFNS: tuple[str, ...] = tuple(FFN_REGISTRY)


def _part(registry: dict, names: tuple, kind: str, name: str) -> Part:
    if name not in registry:
        raise ValueError(f"LMConfig.{kind} must be one of {names}, got {name!r}")
    return registry[name]


def mixer_part(name: str) -> Part:
    """The registered mixer of a name.

    Args:
      name: a name of :data:`MIXERS`.

    Returns:
      Its :class:`Part`.

    Raises:
      ValueError: naming ``LMConfig.mixer``, if ``name`` is unknown.
    """
    return _part(MIXER_REGISTRY, MIXERS, "mixer", name)


def ffn_part(name: str) -> Part:
    """The registered FFN of a name.

    Args:
      name: a name of :data:`FFNS`.

    Returns:
      Its :class:`Part`.

    Raises:
      ValueError: naming ``LMConfig.ffn``, if ``name`` is unknown.
    """
    return _part(FFN_REGISTRY, FFNS, "ffn", name)


def make_mixer(cfg, rngs: nnx.Rngs) -> nnx.Module:
    """The token mixer of one block.

    Args:
      cfg: the LM config (``mixer`` and the backbone's ``d_model``, ``n_layers``,
        ``norm_eps``).
      rngs: the parameter initialisation keys.

    Returns:
      The mixer module.
    """
    return mixer_part(cfg.mixer.kind).build(cfg.mixer, cfg, rngs)


def make_ffn(cfg, rngs: nnx.Rngs) -> nnx.Module:
    """The feed-forward part of one block.

    Args:
      cfg: the LM config (``ffn`` and the backbone's ``d_model``, ``n_layers``,
        ``norm_eps``).
      rngs: the parameter initialisation keys.

    Returns:
      The FFN module.
    """
    return ffn_part(cfg.ffn.kind).build(cfg.ffn, cfg, rngs)
