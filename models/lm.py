"""Composable language models: every block is a token mixer plus a feed-forward part.

A block is pre-norm, ``x <- x + mixer(norm(x))`` then ``x <- x + ffn(norm(x))``; the model is an
embedding, ``n_layers`` blocks, a final RMSNorm and an untied head (LLaMA-style, arXiv
2302.13971). The two parts are chosen independently, so any mixer goes with any FFN:

* mixers (:data:`MIXERS`): ``"attention"`` (causal softmax attention with RoPE,
  :class:`~jaxlib_ext.models.transformer.Attention`), ``"mdn"``
  (:class:`~jaxlib_ext.models.MomentumDeltaNet`, arXiv 2605.05838), ``"gdn"``
  (:class:`~jaxlib_ext.models.GatedDeltaNet`, arXiv 2412.06464), ``"mlstm"``
  (:class:`~jaxlib_ext.models.MLSTMLayer`, the mLSTM layer of xLSTM, arXiv 2405.04517);
* FFNs (:data:`FFNS`): ``"swiglu"`` (:class:`~jaxlib_ext.models.SwiGLU`), ``"moe"`` (a standard
  mixture of experts) and ``"latent_moe"`` (LatentMoE, arXiv 2601.18089), both the
  :class:`~jaxlib_ext.models.latent_moe.LatentMoE` layer (``latent_dim=None`` for ``"moe"``).

:class:`LMConfig` is one flat, JSON-serialisable record of a composed model (the mixer's and the
FFN's fields side by side; a field the chosen parts do not read is ignored). The Transformer, MDN
and GDN language models are the presets ``attention + swiglu``, ``mdn + swiglu``, ``gdn +
swiglu`` of :class:`LanguageModel`: their builders give the same parameters (same draws, same
tree) as :func:`build_lm` on :meth:`LMConfig.from_config` of their configs.

Interfaces. A mixer is ``mixer(x [B, T, d], cache=None) -> (y [B, T, d], new_cache or None)``
with ``init_cache(batch)`` when it can decode. An FFN is ``ffn(x [B, T, d])`` returning ``y``,
or ``(y, metrics)`` with ``metrics`` a mapping of scalar arrays: the mixture of experts reports
its router's load (``moe_load_max``, ``moe_load_min``, ``moe_load_cv``; 1, 1, 0 when balanced)
and, called with ``train=True``, updates its correction bias (``update_bias``).
:meth:`LanguageModel.logits_and_metrics` averages every metric name over the blocks that report
it; the training loop logs them with the loss.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping

import jax
import jax.numpy as jnp
from flax import nnx

from jaxlib_ext.models._delta_mixer import DeltaNetConfig, LMCache
from jaxlib_ext.models.latent_moe import LatentMoE
from jaxlib_ext.models.layers import Embedding, LMHead, RMSNorm, SwiGLU, swiglu_hidden_size

__all__ = [
    "MIXERS",
    "FFNS",
    "LMConfig",
    "LM_PRESETS",
    "Block",
    "LanguageModel",
    "build_lm",
    "lm_config",
]

MIXERS = ("attention", "mdn", "gdn", "mlstm")
FFNS = ("swiglu", "moe", "latent_moe")
MOE_METHODS = ("ragged", "pallas", "dense")


@dataclasses.dataclass(frozen=True)
class LMConfig:
    """A composed language model: backbone sizes, the token mixer's and the FFN's fields.

    Mixer fields: ``n_heads``, ``head_dim`` (every mixer); ``rope_theta`` (attention);
    ``expand_v`` ... ``decode_recurrent_max_len`` (mdn, gdn; see
    :class:`~jaxlib_ext.models.DeltaNetConfig`; mlstm reads ``expand_v``, ``conv_size``,
    ``method``, ``chunk_size``, ``decode_recurrent_max_len``, see
    :class:`~jaxlib_ext.models.MLSTMConfig`). FFN fields: ``mlp_hidden``, ``mlp_multiple_of``
    (swiglu: width ``mlp_hidden`` or ``swiglu_hidden_size(d, 4, mlp_multiple_of)``);
    ``num_experts`` ... ``moe_method`` (moe, latent_moe: the arguments of
    :class:`~jaxlib_ext.models.latent_moe.LatentMoE`, ``router_bias_rate`` its
    ``bias_update_rate``, 0 for no balancing; ``latent_dim`` is required by
    ``latent_moe`` and must be ``None`` for ``moe``; ``shared_expert_dim=None`` means no shared
    expert).
    """

    mixer: str = "attention"
    ffn: str = "swiglu"
    vocab_size: int = 256
    d_model: int = 128
    n_layers: int = 2
    max_seq_len: int = 256
    norm_eps: float = 1e-6
    # token mixer
    n_heads: int = 4
    head_dim: int = 32
    rope_theta: float = 10_000.0
    expand_v: int = 2
    conv_size: int = 4
    tau_factor: float = 1.0
    min_log_mu: float | None = -2.0
    use_output_correction: bool = True
    method: str = "auto"
    chunk_size: int | None = None
    decode_recurrent_max_len: int = 64
    # feed-forward: SwiGLU
    mlp_hidden: int | None = None
    mlp_multiple_of: int = 32
    # feed-forward: mixture of experts
    num_experts: int = 8
    top_k: int = 2
    expert_dim: int = 128
    latent_dim: int | None = None
    shared_expert_dim: int | None = None
    routed_scaling: float = 1.0
    router_bias_rate: float = 1e-3
    moe_method: str = "ragged"

    def __post_init__(self):
        if self.mixer not in MIXERS:
            raise ValueError(f"LMConfig.mixer must be one of {MIXERS}, got {self.mixer!r}")
        if self.ffn not in FFNS:
            raise ValueError(f"LMConfig.ffn must be one of {FFNS}, got {self.ffn!r}")
        for name in ("vocab_size", "d_model", "n_layers", "max_seq_len", "n_heads", "head_dim",
                     "mlp_multiple_of", "num_experts", "top_k", "expert_dim"):
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0:
                raise ValueError(f"LMConfig.{name} must be a positive int, got {value!r}")
        if self.ffn in ("moe", "latent_moe"):
            if self.top_k > self.num_experts:
                raise ValueError(
                    f"LMConfig.top_k {self.top_k} exceeds LMConfig.num_experts {self.num_experts}"
                )
            if self.moe_method not in MOE_METHODS:
                raise ValueError(
                    f"LMConfig.moe_method must be one of {MOE_METHODS}, got {self.moe_method!r}"
                )
        if self.ffn == "latent_moe" and not (
            isinstance(self.latent_dim, int) and 0 < self.latent_dim <= self.d_model
        ):
            raise ValueError(
                f"LMConfig.latent_dim must be an int in (0, d_model={self.d_model}] for ffn "
                f"'latent_moe', got {self.latent_dim!r}"
            )
        if self.ffn == "moe" and self.latent_dim is not None:
            raise ValueError(
                "LMConfig.latent_dim must be None for ffn 'moe' (use ffn 'latent_moe'), got "
                f"{self.latent_dim!r}"
            )
        self.mixer_config()  # the mixer's own validation

    @property
    def hidden(self) -> int:
        """SwiGLU width."""
        return self.mlp_hidden or swiglu_hidden_size(self.d_model, 4.0, self.mlp_multiple_of)

    @property
    def is_moe(self) -> bool:
        return self.ffn in ("moe", "latent_moe")

    def mixer_config(self):
        """The mixer's config: a :class:`TransformerConfig` (attention), a
        :class:`DeltaNetConfig` (mdn, gdn) or an :class:`MLSTMConfig` (mlstm) with this model's
        sizes."""
        from jaxlib_ext.models.mlstm import MLSTMConfig
        from jaxlib_ext.models.transformer import TransformerConfig

        if self.mixer == "mlstm":
            return MLSTMConfig(
                d_model=self.d_model, n_heads=self.n_heads, head_dim=self.head_dim,
                expand_v=self.expand_v, conv_size=self.conv_size, norm_eps=self.norm_eps,
                method=self.method, chunk_size=self.chunk_size,
                decode_recurrent_max_len=self.decode_recurrent_max_len,
            )

        common = dict(vocab_size=self.vocab_size, d_model=self.d_model, n_layers=self.n_layers,
                      n_heads=self.n_heads, head_dim=self.head_dim, mlp_hidden=self.hidden,
                      max_seq_len=self.max_seq_len, norm_eps=self.norm_eps)
        if self.mixer == "attention":
            return TransformerConfig(rope_theta=self.rope_theta, **common)
        return DeltaNetConfig(
            expand_v=self.expand_v, conv_size=self.conv_size, mlp_multiple_of=self.mlp_multiple_of,
            tau_factor=self.tau_factor, min_log_mu=self.min_log_mu,
            use_output_correction=self.use_output_correction, method=self.method,
            chunk_size=self.chunk_size, decode_recurrent_max_len=self.decode_recurrent_max_len,
            **common,
        )

    @classmethod
    def from_config(cls, cfg, mixer: str, ffn: str = "swiglu", **overrides) -> LMConfig:
        """The composed config of a :class:`TransformerConfig` (``mixer="attention"``) or a
        :class:`DeltaNetConfig` (``"mdn"``, ``"gdn"``) with ``ffn`` and field ``overrides``."""
        from jaxlib_ext.models.transformer import TransformerConfig

        fields = {f.name for f in dataclasses.fields(cls)}
        values = {k: v for k, v in dataclasses.asdict(cfg).items() if k in fields}
        if isinstance(cfg, TransformerConfig):
            values["mlp_hidden"] = cfg.hidden
        return cls(mixer=mixer, ffn=ffn, **{**values, **overrides})

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping) -> LMConfig:
        return cls(**d)


# --------------------------------------------------------------------------- parts


def make_mixer(cfg: LMConfig, rngs: nnx.Rngs) -> nnx.Module:
    """The token mixer ``cfg.mixer`` of one block."""
    from jaxlib_ext.models.gdn import GatedDeltaNet
    from jaxlib_ext.models.mdn import MomentumDeltaNet
    from jaxlib_ext.models.mlstm import MLSTMLayer
    from jaxlib_ext.models.transformer import Attention

    cls = {"attention": Attention, "mdn": MomentumDeltaNet, "gdn": GatedDeltaNet,
           "mlstm": MLSTMLayer}[cfg.mixer]
    return cls(cfg.mixer_config(), rngs=rngs)


def make_ffn(cfg: LMConfig, rngs: nnx.Rngs) -> nnx.Module:
    """The feed-forward part ``cfg.ffn`` of one block."""
    if cfg.ffn == "swiglu":
        return SwiGLU(cfg.d_model, cfg.hidden, rngs=rngs)
    return LatentMoE(
        cfg.d_model, num_experts=cfg.num_experts, top_k=cfg.top_k, expert_dim=cfg.expert_dim,
        latent_dim=cfg.latent_dim if cfg.ffn == "latent_moe" else None,
        shared_expert_dim=cfg.shared_expert_dim, routed_scaling=cfg.routed_scaling,
        bias_update_rate=cfg.router_bias_rate, method=cfg.moe_method, rngs=rngs,
    )


class Block(nnx.Module):
    """Pre-norm block ``x + mixer(norm(x))``, then ``x + ffn(norm(x))``.

    ``mixer`` and ``ffn`` are factories ``rngs -> module``, called in that order (so the
    parameter draws follow the block's layout). ``__call__(x, cache=None, *, train=False) ->
    (x, cache, metrics)``; ``train`` lets a mixture-of-experts FFN update its correction bias.
    """

    def __init__(self, d_model: int, norm_eps: float, mixer: Callable, ffn: Callable, *,
                 rngs: nnx.Rngs):
        self.attn_norm = RMSNorm(d_model, eps=norm_eps)
        self.attn = mixer(rngs)
        self.mlp_norm = RMSNorm(d_model, eps=norm_eps)
        self.mlp = ffn(rngs)

    def __call__(self, x, cache=None, *, train: bool = False):
        y, cache = self.attn(self.attn_norm(x), cache)
        x = x + y
        if isinstance(self.mlp, LatentMoE):
            out = self.mlp(self.mlp_norm(x), update_bias=train)
        else:
            out = self.mlp(self.mlp_norm(x))
        y, metrics = out if isinstance(out, tuple) else (out, {})
        return x + y, cache, metrics


class LanguageModel(nnx.Module):
    """Embedding, ``n_layers`` x :class:`Block` (mixer + FFN), final norm, untied head.

    ``__call__(tokens int32[B, T]) -> logits float32[B, T, vocab]``;
    :meth:`logits_and_metrics` also returns the FFNs' metrics; decoding with
    :meth:`init_cache` and :meth:`decode_step` when the mixer keeps a cache (mdn, gdn, mlstm).

    Args:
      cfg: any config with ``vocab_size, d_model, n_layers, max_seq_len, norm_eps``
        (:class:`LMConfig`, or a mixer's own config for the preset models); kept as ``cfg``.
      mixer, ffn: factories ``rngs -> module`` of one block's parts (default: from ``cfg``, an
        :class:`LMConfig`).
    """

    def __init__(self, cfg, *, mixer: Callable | None = None, ffn: Callable | None = None,
                 rngs: nnx.Rngs):
        self.cfg = cfg
        self.max_seq_len = cfg.max_seq_len
        mixer = mixer or (lambda r: make_mixer(cfg, r))
        ffn = ffn or (lambda r: make_ffn(cfg, r))
        self.embed = Embedding(cfg.vocab_size, cfg.d_model, rngs=rngs)
        self.blocks = nnx.List(
            [Block(cfg.d_model, cfg.norm_eps, mixer, ffn, rngs=rngs) for _ in range(cfg.n_layers)]
        )
        self.final_norm = RMSNorm(cfg.d_model, eps=cfg.norm_eps)
        self.lm_head = LMHead(cfg.d_model, cfg.vocab_size, rngs=rngs)

    def _check_tokens(self, tokens, what):
        name = type(self).__name__
        if not hasattr(tokens, "ndim") or tokens.ndim != 2:
            shape = getattr(tokens, "shape", type(tokens).__name__)
            raise ValueError(f"{name}.{what}: tokens must be [B, T], got {shape}")
        if not jnp.issubdtype(tokens.dtype, jnp.integer):
            raise ValueError(f"{name}.{what}: tokens must be integer, got dtype {tokens.dtype}")

    def logits_and_metrics(self, tokens: jax.Array, *, train: bool = False
                           ) -> tuple[jax.Array, dict[str, jax.Array]]:
        """Full-sequence forward: ``(logits float32[B, T, vocab], metrics)``; ``metrics`` maps
        each name an FFN reports to its mean over the blocks that report it. ``train=True``
        lets the FFNs update their ``nnx.BatchStat`` state (a router's correction bias)."""
        self._check_tokens(tokens, "__call__")
        if tokens.shape[1] > self.max_seq_len:
            raise ValueError(
                f"{type(self).__name__}: sequence length {tokens.shape[1]} exceeds max_seq_len "
                f"{self.max_seq_len}"
            )
        x = self.embed(tokens)
        reported: dict[str, list] = {}
        for block in self.blocks:
            x, _, metrics = block(x, train=train)
            for name, value in metrics.items():
                reported.setdefault(name, []).append(jnp.asarray(value, jnp.float32))
        metrics = {name: jnp.mean(jnp.stack(v)) for name, v in reported.items()}
        return self.lm_head(self.final_norm(x)), metrics

    def __call__(self, tokens: jax.Array) -> jax.Array:
        """Full-sequence forward: ``int32[B, T] -> float32 logits [B, T, vocab]``."""
        return self.logits_and_metrics(tokens)[0]

    def init_cache(self, batch: int) -> LMCache:
        """A zero :class:`LMCache` for ``batch`` sequences (states float32)."""
        if not all(hasattr(block.attn, "init_cache") for block in self.blocks):
            raise ValueError(
                f"{type(self).__name__}.init_cache: the token mixer "
                f"{type(self.blocks[0].attn).__name__} keeps no decode cache"
            )
        layers = tuple(block.attn.init_cache(batch) for block in self.blocks)
        return LMCache(layers, jnp.zeros((), jnp.int32))

    def decode_step(self, tokens: jax.Array, cache: LMCache) -> tuple[jax.Array, LMCache]:
        """Consume ``tokens [B, T']`` after the cached prefix; ``T' = 1`` is one decode step.

        Returns ``(logits [B, T', vocab], new_cache)``. Feeding a sequence piece by piece gives
        the logits of one full forward.
        """
        self._check_tokens(tokens, "decode_step")
        if len(cache.layers) != len(self.blocks):
            raise ValueError(
                f"{type(self).__name__}.decode_step: cache has {len(cache.layers)} layers, model "
                f"has {len(self.blocks)}"
            )
        x = self.embed(tokens)
        new_layers = []
        for block, layer_cache in zip(self.blocks, cache.layers, strict=True):
            x, layer_cache, _ = block(x, layer_cache)
            new_layers.append(layer_cache)
        logits = self.lm_head(self.final_norm(x))
        return logits, LMCache(tuple(new_layers), cache.position + tokens.shape[1])


# --------------------------------------------------------------------------- presets


def _tiny(mixer: str, ffn: str, **moe) -> LMConfig:
    base = dict(d_model=128, n_layers=2, n_heads=4, head_dim=32, max_seq_len=256,
                mlp_multiple_of=32)
    if mixer != "attention":  # the delta-rule tiny preset: 2 heads of K = 32, V = 64
        base.update(n_heads=2, head_dim=32, expand_v=2)
    return LMConfig(mixer=mixer, ffn=ffn, **base, **moe)


#: Named presets of the composed models. ``"moe-tiny"`` and ``"latent-moe-tiny"`` are CPU-sized
#: attention models whose FFN is a mixture of 8 experts, top-2, expert width 128, with a shared
#: expert of width 128 (the latent one at latent width 32 = d/4 with 4x the experts and top-k,
#: arXiv 2601.18089's reinvestment of the saving); ``"mdn-latent-moe-tiny"`` is the MDN
#: counterpart.
LM_PRESETS: dict[str, LMConfig] = {
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


def lm_config(mixer: str, ffn: str = "swiglu", preset: str = "tiny", *,
              vocab_size: int | None = None, **overrides) -> LMConfig:
    """The :class:`LMConfig` of ``mixer + ffn`` at a size ``preset``.

    ``preset`` is a name of :data:`LM_PRESETS` (which fixes mixer and FFN; ``mixer``/``ffn``
    then must agree or be ``None``) or a size of the mixer's table
    (:data:`~jaxlib_ext.models.TRANSFORMER_PRESETS` for attention,
    :data:`~jaxlib_ext.models.DELTANET_PRESETS` for mdn, gdn and mlstm) whose FFN fields come from
    :data:`MOE_SIZES` for a mixture of experts (``latent_dim = d_model // 4`` for latent_moe,
    with the experts and top-k multiplied by 4, arXiv 2601.18089's reinvestment of the saving).
    """
    if vocab_size is not None:
        overrides["vocab_size"] = vocab_size
    if preset in LM_PRESETS:
        cfg = LM_PRESETS[preset]
        for kind, value, have in (("mixer", mixer, cfg.mixer), ("ffn", ffn, cfg.ffn)):
            if value is not None and value != have:
                raise ValueError(f"preset {preset!r} has {kind} {have!r}, not {value!r}")
        return dataclasses.replace(cfg, **overrides)
    from jaxlib_ext.models._delta_mixer import DELTANET_PRESETS
    from jaxlib_ext.models.transformer import TRANSFORMER_PRESETS

    mixer = mixer or "attention"
    ffn = ffn or "swiglu"
    if mixer not in MIXERS:
        raise ValueError(f"mixer must be one of {MIXERS}, got {mixer!r}")
    if ffn not in FFNS:
        raise ValueError(f"ffn must be one of {FFNS}, got {ffn!r}")
    table = TRANSFORMER_PRESETS if mixer == "attention" else DELTANET_PRESETS
    if preset not in table:
        raise ValueError(
            f"unknown {mixer} preset {preset!r}; choose from {sorted(table)} or "
            f"{sorted(LM_PRESETS)}"
        )
    moe: dict = {}
    if ffn != "swiglu":
        size = preset if preset in MOE_SIZES else "small"
        moe = dict(MOE_SIZES[size])
        if ffn == "latent_moe":
            base = table[preset]
            moe.update(latent_dim=max(base.d_model // 4, 1), num_experts=4 * moe["num_experts"],
                       top_k=4 * moe["top_k"])
    return LMConfig.from_config(table[preset], mixer, ffn, **{**moe, **overrides})


def build_lm(preset: str | LMConfig = "tiny", *, mixer: str | None = None, ffn: str | None = None,
             vocab_size: int | None = None, rngs: nnx.Rngs, **overrides) -> LanguageModel:
    """A :class:`LanguageModel` of ``mixer + ffn`` (see :func:`lm_config`), or of an
    :class:`LMConfig` given as ``preset``."""
    if isinstance(preset, LMConfig):
        if vocab_size is not None:
            overrides["vocab_size"] = vocab_size
        cfg = dataclasses.replace(preset, **overrides)
    else:
        cfg = lm_config(mixer, ffn, preset, vocab_size=vocab_size, **overrides)
    return LanguageModel(cfg, rngs=rngs)
