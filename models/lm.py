"""Composable language models: the config, the presets and the builders.

Every language model is a :class:`~jaxlib_ext.models._backbone.LanguageModel` of pre-norm
blocks ``token mixer + feed-forward`` (LLaMA-style, arXiv 2302.13971), the two parts chosen
independently by name from :mod:`~jaxlib_ext.models.registry`:

* mixers (:data:`MIXERS`): ``"attention"`` (causal softmax attention with RoPE,
  :class:`~jaxlib_ext.models.attention.Attention`), ``"mdn"``
  (:class:`~jaxlib_ext.models.MomentumDeltaNet`, arXiv 2605.05838), ``"gdn"``
  (:class:`~jaxlib_ext.models.GatedDeltaNet`, arXiv 2412.06464), ``"mlstm"``
  (:class:`~jaxlib_ext.models.MLSTMLayer`, the mLSTM layer of xLSTM, arXiv 2405.04517);
* FFNs (:data:`FFNS`): ``"swiglu"`` (:class:`~jaxlib_ext.models.SwiGLU`), ``"moe"`` (a standard
  mixture of experts) and ``"latent_moe"`` (LatentMoE, arXiv 2601.18089), both the
  :class:`~jaxlib_ext.models.latent_moe.LatentMoE` layer (``latent_dim=None`` for ``"moe"``).

:class:`LMConfig` is nested: the backbone's sizes, then ``mixer`` and ``ffn``, each its part's
own config (``AttentionConfig``, ``MDNConfig``, ``GDNConfig``, ``MLSTMMixerConfig``;
``SwiGLUConfig``, ``LatentMoEConfig``). Sizes come from :func:`lm_config` and :data:`LM_PRESETS`;
field overrides are given flat (``n_heads=8``, ``num_experts=16``: a key names a field of the
backbone or of the chosen parts, :data:`FLAT_ALIASES` the flat names of the FFN's fields), as
``--arch key=value`` gives them on the command line.

:meth:`LanguageModel.logits_and_metrics` averages every metric name an FFN reports over the
blocks that report it (the mixture of experts: ``moe_load_max``, ``moe_load_min``,
``moe_load_cv``; 1, 1, 0 when balanced); the training loop logs them with the loss.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from flax import nnx

from jaxlib_ext.models._backbone import Block, LanguageModel
from jaxlib_ext.models._delta_mixer import DELTANET_PRESETS
from jaxlib_ext.models._saved_methods import read_saved_methods
from jaxlib_ext.models.attention import TRANSFORMER_PRESETS, AttentionConfig, TransformerConfig
from jaxlib_ext.models.layers import SwiGLUConfig
from jaxlib_ext.models.registry import (
    FFN_REGISTRY,
    FFNS,
    MIXER_REGISTRY,
    MIXERS,
    ffn_part,
    mixer_part,
)

__all__ = [
    "MIXERS",
    "FFNS",
    "FLAT_ALIASES",
    "LMConfig",
    "LM_PRESETS",
    "MODEL_MIXERS",
    "MOE_SIZES",
    "Block",
    "LanguageModel",
    "build_lm",
    "build_transformer",
    "build_mdn",
    "build_gdn",
    "lm_config",
    "arch_keys",
    "compose",
    "check_expert_mesh",
]

_BACKBONE = ("vocab_size", "d_model", "n_layers", "max_seq_len", "norm_eps", "tie_embeddings")

#: Flat names of FFN fields (the mixer's ``method`` keeps the bare name ``method``).
FLAT_ALIASES: dict[str, str] = {
    "mlp_hidden": "hidden",
    "mlp_multiple_of": "multiple_of",
    "moe_method": "method",
    "router_bias_rate": "bias_update_rate",
}


def _fields(cls) -> set[str]:
    return {f.name for f in dataclasses.fields(cls)}


_KNOWN = set(_BACKBONE) | set(FLAT_ALIASES) | {
    f for r in (MIXER_REGISTRY, FFN_REGISTRY) for p in r.values() for f in _fields(p.config)}


def _route(mixer: str, ffn: str, values: Mapping, *, strict: bool):
    """``values`` (flat keys) split into backbone, mixer and FFN fields. A field of another
    registered part is dropped (the flat record lists every part's fields); with ``strict``, a
    key that no part has raises."""
    m_fields, f_fields = _fields(mixer_part(mixer).config), _fields(ffn_part(ffn).config)
    backbone, m, f = {}, {}, {}
    for key, value in values.items():
        if key in _BACKBONE:
            backbone[key] = value
        elif key in FLAT_ALIASES and FLAT_ALIASES[key] in f_fields:
            f[FLAT_ALIASES[key]] = value
        elif key in m_fields:
            m[key] = value
        elif key in f_fields and key != "method":
            f[key] = value
        elif strict and key not in _KNOWN:
            raise ValueError(
                f"LMConfig: field {key!r} does not apply to mixer {mixer!r} or ffn {ffn!r}; "
                f"their fields: {sorted(_BACKBONE) + sorted(m_fields)} and "
                f"{sorted(k for k, v in FLAT_ALIASES.items() if v in f_fields) or sorted(f_fields)}"
            )
    return backbone, m, f


def _part_config(cls, fields: Mapping, flat_names: Mapping[str, str] | None = None):
    """``cls(**fields)`` whose errors name the flat ``LMConfig`` fields (the names that
    :meth:`LMConfig.from_flat` and ``--arch`` take, ``flat_names`` mapping a part's field to
    its flat name) rather than the part's class."""
    for name in ("n_heads", "head_dim"):  # every mixer's sizes, named as flat fields
        value = fields.get(name, 1)
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ValueError(f"LMConfig.{name} must be a positive int, got {value!r}")
    try:
        return cls(**fields)
    except ValueError as e:
        message = str(e)
        for field, flat in (flat_names or {}).items():
            message = message.replace(f"{cls.__name__}.{field} ", f"{cls.__name__}.{flat} ")
        raise ValueError(message.replace(f"{cls.__name__}.", "LMConfig.")) from e


@dataclasses.dataclass(frozen=True)
class LMConfig:
    """A composed language model: backbone sizes, the token mixer's and the FFN's configs.

    Attributes:
      vocab_size: the vocabulary size, a positive int (default 256).
      d_model: the model width, a positive int (default 128).
      n_layers: the number of blocks, a positive int (default 2).
      max_seq_len: the longest sequence, a positive int (default 256).
      norm_eps: the RMSNorm epsilon, positive (default 1e-6).
      tie_embeddings: the output head is the transposed embedding (Llama presets) instead of
        its own ``[d_model, vocab]`` matrix (default False).
      mixer: the mixer's config, a ``config`` class of
        :data:`~jaxlib_ext.models.registry.MIXER_REGISTRY` (its ``kind`` is the mixer's name).
      ffn: the FFN's config, a ``config`` class of
        :data:`~jaxlib_ext.models.registry.FFN_REGISTRY` (``kind``: ``"swiglu"``, ``"moe"`` or
        ``"latent_moe"``).

    A part's field reads through the config too (``cfg.num_experts`` is
    ``cfg.ffn.num_experts``); :meth:`replace` takes flat keys. :meth:`to_dict` is JSON-ready
    (each part a dict with its ``kind``); :meth:`from_dict` reads it back, and the flat records
    of the one-level config as well.

    Raises:
      ValueError: if a part is not the config of a registered mixer or FFN, a backbone field
        is out of range, ``ffn.latent_dim > d_model``, or the mixer's layer rejects its config
        at this width.
    """

    vocab_size: int = 256
    d_model: int = 128
    n_layers: int = 2
    max_seq_len: int = 256
    norm_eps: float = 1e-6
    tie_embeddings: bool = False
    mixer: Any = dataclasses.field(default_factory=lambda: MIXER_REGISTRY["attention"].config())
    ffn: Any = dataclasses.field(default_factory=SwiGLUConfig)

    def __post_init__(self):
        for kind, registry, names in (("mixer", MIXER_REGISTRY, MIXERS),
                                      ("ffn", FFN_REGISTRY, FFNS)):
            part = getattr(self, kind)
            name = getattr(part, "kind", None)
            if name not in registry or not isinstance(part, registry[name].config):
                raise ValueError(f"LMConfig.{kind} must be the config of one of {names}, got "
                                 f"{part!r}")
        for name in ("vocab_size", "d_model", "n_layers", "max_seq_len"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"LMConfig.{name} must be a positive int, got {value!r}")
        if not self.norm_eps > 0:
            raise ValueError(f"LMConfig.norm_eps must be positive, got {self.norm_eps}")
        if not isinstance(self.tie_embeddings, bool):
            raise ValueError(f"LMConfig.tie_embeddings must be a bool, got "
                             f"{self.tie_embeddings!r}")
        latent = getattr(self.ffn, "latent_dim", None)
        if latent is not None and latent > self.d_model:
            raise ValueError(f"LMConfig.latent_dim must be an int in (0, d_model={self.d_model}]"
                             f" for ffn 'latent_moe', got {latent!r}")
        if hasattr(self.mixer, "layer_config"):  # the layer's own validation at this width
            self.mixer.layer_config(self.d_model, self.norm_eps)

    def __getattr__(self, name):
        # a part's field, read flat (only called when normal lookup fails)
        if name.startswith("__"):
            raise AttributeError(name)
        for part in ("ffn", "mixer"):
            cfg = self.__dict__.get(part)
            field = FLAT_ALIASES.get(name, name) if part == "ffn" else name
            if cfg is not None and field in _fields(type(cfg)) and (
                    part == "mixer" or name != "method"):
                return getattr(cfg, field)
        raise AttributeError(f"LMConfig has no field {name!r}")

    @property
    def mixer_name(self) -> str:
        """The mixer's registry name (its config's ``kind``)."""
        return self.mixer.kind

    @property
    def ffn_name(self) -> str:
        """The FFN's registry name (its config's ``kind``)."""
        return self.ffn.kind

    @property
    def is_moe(self) -> bool:
        """Whether the FFN is a mixture of experts (``"moe"`` or ``"latent_moe"``)."""
        return self.ffn.kind in ("moe", "latent_moe")

    @property
    def hidden(self) -> int:
        """SwiGLU width (``swiglu`` FFN)."""
        return self.ffn.width(self.d_model)

    @classmethod
    def from_flat(cls, mixer: str = "attention", ffn: str = "swiglu", **fields) -> LMConfig:
        """The config of ``mixer + ffn`` with flat field values (module docstring).

        Args:
          mixer: a name of :data:`MIXERS`.
          ffn: a name of :data:`FFNS`.
          **fields: flat field values of the backbone and the chosen parts (the FFN's by the
            names of :data:`FLAT_ALIASES` or their own).

        Returns:
          The :class:`LMConfig`.

        Raises:
          ValueError: if a name is unknown, a key belongs to neither the backbone nor the
            chosen parts, or a value is out of range.
        """
        return cls._compose(mixer, ffn, {}, fields)

    @classmethod
    def _compose(cls, mixer: str, ffn: str, base: Mapping, overrides: Mapping) -> LMConfig:
        b0, m0, f0 = _route(mixer, ffn, base, strict=False)
        b1, m1, f1 = _route(mixer, ffn, overrides, strict=True)
        f = {**f0, **f1}
        if ffn == "moe" and f.get("latent_dim") is not None:
            raise ValueError("LMConfig.latent_dim must be None for ffn 'moe' (use ffn "
                             f"'latent_moe'), got {f['latent_dim']!r}")
        if ffn == "latent_moe" and not isinstance(f.get("latent_dim"), int):
            raise ValueError("LMConfig.latent_dim must be an int in (0, d_model] for ffn "
                             f"'latent_moe', got {f.get('latent_dim')!r}")
        return cls(**{**b0, **b1}, mixer=_part_config(mixer_part(mixer).config, {**m0, **m1}),
                   ffn=_part_config(ffn_part(ffn).config, f,
                                    {v: k for k, v in FLAT_ALIASES.items()}))

    def flat(self) -> dict:
        """Every field flat.

        Returns:
          A dict of the backbone's fields, the mixer's, then the FFN's (with the flat names of
          :data:`FLAT_ALIASES`).
        """
        out = {k: getattr(self, k) for k in _BACKBONE}
        out.update(dataclasses.asdict(self.mixer))
        inverse = {v: k for k, v in FLAT_ALIASES.items()}
        out.update({inverse.get(k, k): v for k, v in dataclasses.asdict(self.ffn).items()})
        return out

    def replace(self, **fields) -> LMConfig:
        """A copy with flat field values replaced.

        Args:
          **fields: flat field values (keys as for :meth:`from_flat`).

        Returns:
          The new :class:`LMConfig` of the same mixer and FFN.

        Raises:
          ValueError: as :meth:`from_flat`.
        """
        return LMConfig._compose(self.mixer_name, self.ffn_name, self.flat(), fields)

    @classmethod
    def from_config(cls, cfg, mixer: str, ffn: str = "swiglu", **overrides) -> LMConfig:
        """The composed config of a size config.

        Args:
          cfg: a size config, :class:`TransformerConfig` for ``mixer="attention"``,
            :class:`DeltaNetConfig` for the others; its fields the parts do not have are
            dropped.
          mixer: a name of :data:`MIXERS`.
          ffn: a name of :data:`FFNS`.
          **overrides: flat field values that replace the size config's.

        Returns:
          The :class:`LMConfig`.

        Raises:
          ValueError: as :meth:`from_flat`.
        """
        values = dataclasses.asdict(cfg)
        if isinstance(cfg, TransformerConfig):
            values["mlp_hidden"] = cfg.hidden
        return cls._compose(mixer, ffn, values, overrides)

    def to_dict(self) -> dict:
        """The config as a JSON-ready dict: the backbone's fields, and ``mixer`` and ``ffn``
        each as a dict of its fields with its ``kind``."""
        out = {k: getattr(self, k) for k in _BACKBONE}
        out["mixer"] = {"kind": self.mixer_name, **dataclasses.asdict(self.mixer)}
        out["ffn"] = {"kind": self.ffn_name, **dataclasses.asdict(self.ffn)}
        return out

    @classmethod
    def from_dict(cls, d: Mapping) -> LMConfig:
        """Reads back a config.

        Args:
          d: a dict of :meth:`to_dict`, or a flat record (``mixer`` and ``ffn`` as names, the
            other fields flat). A saved dict may name a method by the per-op names
            (``"recurrent"``, ``"chunk"``, ``"parallel"``; the FFN's ``"ragged"``,
            ``"dense"``); they are read as the library's
            (:func:`~jaxlib_ext.models._saved_methods.read_saved_methods`).

        Returns:
          The :class:`LMConfig`.
        """
        d = dict(d)
        if isinstance(d.get("mixer", "attention"), str):  # a flat record
            d = read_saved_methods(d, ("method", "moe_method"))
            return cls._compose(d.pop("mixer", "attention"), d.pop("ffn", "swiglu"), d, {})
        mixer, ffn = read_saved_methods(d.pop("mixer")), read_saved_methods(d.pop("ffn"))
        m_kind, f_kind = mixer.pop("kind"), ffn.pop("kind")
        return cls(**d, mixer=mixer_part(m_kind).config(**mixer),
                   ffn=ffn_part(f_kind).config(**ffn))


# --------------------------------------------------------------------------- presets


def _llama(*, vocab_size: int, d_model: int, n_layers: int, n_heads: int, n_kv_heads: int,
           head_dim: int, hidden: int, rope_theta: float, max_seq_len: int) -> LMConfig:
    """A Llama-architecture decoder (arXiv 2302.13971): grouped-query attention with RoPE in
    the ``"half"`` pair layout, SwiGLU, RMSNorm at eps ``1e-5``, tied embeddings."""
    return LMConfig(
        vocab_size=vocab_size, d_model=d_model, n_layers=n_layers, max_seq_len=max_seq_len,
        norm_eps=1e-5, tie_embeddings=True,
        mixer=AttentionConfig(n_heads=n_heads, head_dim=head_dim, n_kv_heads=n_kv_heads,
                              rope_theta=rope_theta),
        ffn=SwiGLUConfig(hidden=hidden),
    )


def _tiny(mixer: str, ffn: str, **moe) -> LMConfig:
    base = dict(d_model=128, n_layers=2, n_heads=4, head_dim=32, max_seq_len=256)
    if mixer != "attention":  # the delta-rule tiny preset: 2 heads of K = 32, V = 64
        base.update(n_heads=2, head_dim=32, expand_v=2)
    return LMConfig.from_flat(mixer, ffn, **base, **moe)


#: Named presets of the composed models. ``"moe-tiny"`` and ``"latent-moe-tiny"`` are CPU-sized
#: attention models whose FFN is a mixture of 8 experts, top-2, expert width 128, with a shared
#: expert of width 128 (the latent one at latent width 32 = d/4 with 4x the experts and top-k,
#: arXiv 2601.18089's reinvestment of the saving); ``"mdn-latent-moe-tiny"`` is the MDN
#: counterpart. ``"llama-tiny"`` is a CPU-sized Llama (4 query heads sharing 2 key/value heads);
#: ``"smollm2-135m"`` is SmolLM2-135M's architecture (the distillation teacher of arXiv
#: 2603.15590's small-scale runs; :func:`~jaxlib_ext.models.llama.load_gguf` reads its weights).
LM_PRESETS: dict[str, LMConfig] = {
    "llama-tiny": _llama(vocab_size=256, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2,
                         head_dim=16, hidden=128, rope_theta=10_000.0, max_seq_len=2048),
    "smollm2-135m": _llama(vocab_size=49152, d_model=576, n_layers=30, n_heads=9, n_kv_heads=3,
                           head_dim=64, hidden=1536, rope_theta=100_000.0, max_seq_len=8192),
    "moe-tiny": _tiny("attention", "moe", num_experts=8, top_k=2, expert_dim=128,
                      shared_expert_dim=128),
    "latent-moe-tiny": _tiny("attention", "latent_moe", num_experts=32, top_k=8, expert_dim=128,
                             latent_dim=32, shared_expert_dim=128),
    "mdn-latent-moe-tiny": _tiny("mdn", "latent_moe", num_experts=32, top_k=8, expert_dim=128,
                                 latent_dim=32, shared_expert_dim=128),
}

#: The mixture-of-experts fields a size preset of the FFN table uses when ``ffn`` is ``moe`` or
#: ``latent_moe`` (``latent_dim`` only for ``latent_moe``).
MOE_SIZES: dict[str, dict] = {
    "tiny": dict(num_experts=8, top_k=2, expert_dim=128, shared_expert_dim=128),
    "small": dict(num_experts=16, top_k=2, expert_dim=256, shared_expert_dim=256),
}

#: The named models (``--model``): each is its mixer with a SwiGLU FFN.
MODEL_MIXERS: dict[str, str] = {"transformer": "attention", "mdn": "mdn", "gdn": "gdn"}


def _size_table(mixer: str) -> dict:
    return TRANSFORMER_PRESETS if mixer == "attention" else DELTANET_PRESETS


def lm_config(mixer: str | None, ffn: str | None = "swiglu", preset: str = "tiny", *,
              vocab_size: int | None = None, **overrides) -> LMConfig:
    """The :class:`LMConfig` of ``mixer + ffn`` at a size ``preset``, with flat ``overrides``.

    ``preset`` is a name of :data:`LM_PRESETS` (which fixes mixer and FFN; ``mixer``/``ffn``
    then must agree or be ``None``) or a size of the mixer's table
    (:data:`~jaxlib_ext.models.TRANSFORMER_PRESETS` for attention,
    :data:`~jaxlib_ext.models.DELTANET_PRESETS` for mdn, gdn and mlstm) whose FFN fields come from
    :data:`MOE_SIZES` for a mixture of experts (``latent_dim = d_model // 4`` for latent_moe,
    with the experts and top-k multiplied by 4, arXiv 2601.18089's reinvestment of the saving).

    Args:
      mixer: a name of :data:`MIXERS`; ``None`` means the preset's mixer, or ``"attention"``
        for a size preset.
      ffn: a name of :data:`FFNS`; ``None`` means the preset's FFN, or ``"swiglu"`` for a size
        preset.
      preset: a name of :data:`LM_PRESETS` or a size of the mixer's table.
      vocab_size: the vocabulary size; ``None`` means the preset's.
      **overrides: flat field values (keys as for :meth:`LMConfig.from_flat`).

    Returns:
      The :class:`LMConfig`.

    Raises:
      ValueError: if ``mixer`` or ``ffn`` disagrees with a named preset, a name or preset is
        unknown, or an override does not apply or is out of range.
    """
    if vocab_size is not None:
        overrides["vocab_size"] = vocab_size
    if preset in LM_PRESETS:
        cfg = LM_PRESETS[preset]
        for kind, value, have in (("mixer", mixer, cfg.mixer_name), ("ffn", ffn, cfg.ffn_name)):
            if value is not None and value != have:
                raise ValueError(f"preset {preset!r} has {kind} {have!r}, not {value!r}")
        return cfg.replace(**overrides)
    mixer = mixer or "attention"
    ffn = ffn or "swiglu"
    mixer_part(mixer), ffn_part(ffn)  # the names, before the size
    table = _size_table(mixer)
    if preset not in table:
        raise ValueError(
            f"unknown {mixer} preset {preset!r}; choose from {sorted(table)} or "
            f"{sorted(LM_PRESETS)}"
        )
    moe: dict = {}
    if ffn != "swiglu":
        moe = dict(MOE_SIZES[preset if preset in MOE_SIZES else "small"])
        if ffn == "latent_moe":
            moe.update(latent_dim=max(table[preset].d_model // 4, 1),
                       num_experts=4 * moe["num_experts"], top_k=4 * moe["top_k"])
    size = table[preset]
    values = dataclasses.asdict(size)
    if isinstance(size, TransformerConfig):
        values["mlp_hidden"] = size.hidden
    return LMConfig._compose(mixer, ffn, {**values, **moe}, overrides)


def build_lm(preset: str | LMConfig = "tiny", *, mixer: str | None = None, ffn: str | None = None,
             vocab_size: int | None = None, rngs: nnx.Rngs, **overrides) -> LanguageModel:
    """A :class:`LanguageModel` of ``mixer + ffn`` at a preset, or of a given config.

    Args:
      preset: a preset name as for :func:`lm_config`, or an :class:`LMConfig`.
      mixer: a name of :data:`MIXERS` (see :func:`lm_config`); unused with an
        :class:`LMConfig`.
      ffn: a name of :data:`FFNS` (see :func:`lm_config`); unused with an :class:`LMConfig`.
      vocab_size: the vocabulary size; ``None`` means the preset's or the config's.
      rngs: the parameter initialisation keys.
      **overrides: flat field values (keys as for :meth:`LMConfig.from_flat`).

    Returns:
      The :class:`LanguageModel`.

    Raises:
      ValueError: as :func:`lm_config` and :meth:`LMConfig.replace`.
    """
    if isinstance(preset, LMConfig):
        if vocab_size is not None:
            overrides["vocab_size"] = vocab_size
        cfg = preset.replace(**overrides) if overrides else preset
    else:
        cfg = lm_config(mixer, ffn, preset, vocab_size=vocab_size, **overrides)
    return LanguageModel(cfg, rngs=rngs)


def _named_builder(model: str):
    mixer = MODEL_MIXERS[model]

    def build(preset: str = "tiny", *, vocab_size: int | None = None, rngs: nnx.Rngs,
              **overrides) -> LanguageModel:
        table = _size_table(mixer)
        if preset not in table:
            raise ValueError(f"unknown {model} preset {preset!r}; choose from {sorted(table)}")
        return build_lm(preset, mixer=mixer, ffn="swiglu", vocab_size=vocab_size, rngs=rngs,
                        **overrides)

    build.__name__ = build.__qualname__ = f"build_{model}"
    table_name = "TRANSFORMER_PRESETS" if mixer == "attention" else "DELTANET_PRESETS"
    build.__doc__ = (
        f"The ``{mixer} + swiglu`` :class:`LanguageModel` at a size of {table_name}.\n\n"
        f"    :func:`build_lm` with ``mixer={mixer!r}`` and ``ffn='swiglu'``.\n\n"
        "    Args:\n"
        f"      preset: a size name of {table_name}.\n"
        "      vocab_size: the vocabulary size; ``None`` means the preset's.\n"
        "      rngs: the parameter initialisation keys.\n"
        "      **overrides: flat field values (keys as for :meth:`LMConfig.from_flat`).\n\n"
        "    Returns:\n"
        "      The :class:`LanguageModel`.\n\n"
        "    Raises:\n"
        f"      ValueError: if ``preset`` is not a size of {table_name}, or as\n"
        "        :func:`build_lm`.\n"
    )
    return build


build_transformer = _named_builder("transformer")
build_mdn = _named_builder("mdn")
build_gdn = _named_builder("gdn")


# --------------------------------------------------------------------------- assembly rules


def arch_keys() -> list[str]:
    """The flat keys an override may name (``--arch key=value``).

    Returns:
      The sorted list of the backbone's fields but ``vocab_size`` (the corpus sets it), every
      registered part's fields and the names of :data:`FLAT_ALIASES`.
    """
    keys = set(_BACKBONE) - {"vocab_size"}
    for part in MIXER_REGISTRY.values():
        keys |= _fields(part.config)
    for part in FFN_REGISTRY.values():
        keys |= _fields(part.config) - set(FLAT_ALIASES.values())
    return sorted(keys | set(FLAT_ALIASES))


def compose(*, model: str | None = None, mixer: str | None = None, ffn: str | None = None,
            preset: str = "tiny", vocab_size: int, overrides: Mapping | None = None) -> LMConfig:
    """The :class:`LMConfig` a training run asks for.

    Args:
      model: a name of :data:`MODEL_MIXERS` whose mixer is used unless ``mixer`` is given,
        or ``None``.
      mixer: a name of :data:`MIXERS`, or ``None`` (the model's, the preset's or
        ``"attention"``).
      ffn: a name of :data:`FFNS`, or ``None`` (the preset's, or ``"swiglu"``).
      preset: a name of :data:`LM_PRESETS` or a size of the mixer's table.
      vocab_size: the vocabulary size.
      overrides: flat field values (keys as for :meth:`LMConfig.from_flat`), or ``None``.

    Returns:
      The :class:`LMConfig` (:func:`lm_config`).

    Raises:
      ValueError: naming the argument (``model``, ``mixer``, ``ffn``, ``preset``) that is
        unknown or disagrees.
    """
    if model is not None and model not in MODEL_MIXERS:
        raise ValueError(f"model: unknown model {model!r}; choose from {sorted(MODEL_MIXERS)}")
    mixer = mixer or (MODEL_MIXERS[model] if model else None)
    if preset not in LM_PRESETS:
        mixer = mixer or "attention"
    return lm_config(mixer, ffn, preset, vocab_size=vocab_size, **dict(overrides or {}))


def check_expert_mesh(cfg: LMConfig, mesh_shape: Mapping[str, int]) -> None:
    """Checks that a mesh's ``expert`` axis fits the model.

    A mesh with an ``expert`` axis of size ``P > 1`` needs a mixture-of-experts FFN whose
    ``num_experts`` ``P`` divides.

    Args:
      cfg: the model's config.
      mesh_shape: the mesh's axis sizes by name.

    Raises:
      ValueError: naming ``mesh``, if the expert axis is larger than 1 and the FFN is not a
        mixture of experts or its ``num_experts`` is not a multiple of the axis size.
    """
    experts = dict(mesh_shape).get("expert", 1)
    if experts <= 1:
        return
    if not cfg.is_moe:
        raise ValueError(f"mesh: an expert axis ({experts}) needs a model with ffn moe or "
                         "latent_moe")
    if cfg.ffn.num_experts % experts:
        raise ValueError(f"mesh: the expert axis ({experts}) does not divide the model's "
                         f"{cfg.ffn.num_experts} experts; use an expert axis that divides it "
                         "(or num_experts=...)")
