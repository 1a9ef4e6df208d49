"""The skeleton shared by the delta-rule token mixers (MDN, GDN).

A delta-rule mixer maps hidden states ``x [B, T, d]`` to ``y [B, T, d]``::

    q, k, v = SiLU(conv_W(W_q x)), SiLU(conv_W(W_k x)), SiLU(conv_W(W_v x))  (short causal convs)
    o       = the model's gates and delta-rule op over q, k, v           (DeltaMixer._delta_rule)
    y       = W_o( RMSNorm_head(o) * act(W_g x) )                        (gated head norm)

with ``act`` the model's output gate (:attr:`DeltaMixer.gate_activation`). Full-sequence calls run
the op with the configured ``method``; cached calls of at most ``decode_recurrent_max_len`` tokens
run its ``"reference"`` path, the step-by-step recurrence (as fla switches to ``fused_recurrent``
for ``q_len <= 64``). The language models built on these mixers are :mod:`jaxlib_ext.models.lm`'s.

Conventions:
- L2 norm is ``x * rsqrt(sum x^2 + 1e-6)`` (fla's ``l2norm``).
- Linear and conv weights use ``N(0, 0.02)`` (fla's ``initializer_range``, no residual rescale).
- ``U(0, c)`` inits are drawn on ``(0, c]`` so that ``log`` never sees 0.
- Per-head gate vectors carry ``weight_decay=False`` metadata (fla's ``_no_weight_decay``).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import ClassVar, NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

from jaxlib_ext.models.layers import (
    RMSNorm,
    dense_init,
    rms_norm,
    swiglu_hidden_size,
)
from jaxlib_ext.models.short_conv import ShortConvolution
from jaxlib_ext.pallas_kernels import METHODS, SUPPORTED_CHUNK_SIZES

__all__ = [
    "DeltaNetConfig",
    "DeltaRuleConfig",
    "DELTANET_PRESETS",
    "l2_normalize",
    "LayerCache",
    "DeltaMixer",
]


@dataclasses.dataclass(frozen=True)
class DeltaNetConfig:
    """Configuration of the MDN and GDN language models.

    ``tau_factor``, ``min_log_mu`` and ``use_output_correction`` only affect MDN. The value head
    dim is ``V = expand_v * head_dim``. ``method`` (one of
    :data:`~jaxlib_ext.pallas_kernels.METHODS`: ``"auto" | "reference" | "xla" | "pallas"``)
    and ``chunk_size`` select the op path for full-sequence calls; cached calls of at most
    ``decode_recurrent_max_len`` tokens use the ``"reference"`` path (the recurrence).
    """

    vocab_size: int = 256
    d_model: int = 128
    n_layers: int = 2
    n_heads: int = 2
    head_dim: int = 32
    expand_v: int = 2
    conv_size: int = 4
    mlp_hidden: int | None = None  # None: 256 * ceil(d * 8/3 / mlp_multiple_of) (hidden_ratio 4)
    mlp_multiple_of: int = 256
    tau_factor: float = 1.0
    min_log_mu: float | None = -2.0
    use_output_correction: bool = True
    norm_eps: float = 1e-6
    max_seq_len: int = 256
    method: str = "auto"
    chunk_size: int | None = None  # None: the op's default for the dtype and head_dim
    decode_recurrent_max_len: int = 64

    def __post_init__(self):
        for name in (
            "vocab_size", "d_model", "n_layers", "n_heads", "head_dim", "expand_v", "conv_size",
            "mlp_multiple_of", "max_seq_len",
        ):
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0:
                raise ValueError(f"DeltaNetConfig.{name} must be a positive int, got {value!r}")
        if self.mlp_hidden is not None and self.mlp_hidden <= 0:
            raise ValueError(f"DeltaNetConfig.mlp_hidden must be positive, got {self.mlp_hidden}")
        if not self.tau_factor > 0:
            raise ValueError(f"DeltaNetConfig.tau_factor must be > 0, got {self.tau_factor}")
        if self.min_log_mu is not None and not self.min_log_mu < 0:
            raise ValueError(f"DeltaNetConfig.min_log_mu must be < 0, got {self.min_log_mu}")
        if self.method not in METHODS:
            raise ValueError(f"DeltaNetConfig.method must be one of {METHODS}, got {self.method!r}")
        if self.chunk_size is not None and self.chunk_size not in SUPPORTED_CHUNK_SIZES:
            raise ValueError(
                f"DeltaNetConfig.chunk_size must be one of {SUPPORTED_CHUNK_SIZES}, "
                f"got {self.chunk_size}"
            )

    @property
    def value_dim(self) -> int:
        return self.expand_v * self.head_dim

    @property
    def tau(self) -> float:
        return math.sqrt(self.d_model / self.tau_factor)

    @property
    def hidden(self) -> int:
        return self.mlp_hidden or swiglu_hidden_size(self.d_model, 4.0, self.mlp_multiple_of)


@dataclasses.dataclass(frozen=True)
class DeltaRuleConfig:
    """The fields a delta-rule token mixer of a language-model block adds to the backbone's
    width and norm epsilon (the Gated DeltaNet mixer's; MDN's config adds its own).

    :meth:`layer_config` gives the layer's :class:`DeltaNetConfig` for a backbone.
    """

    kind: ClassVar[str]
    n_heads: int = 4
    head_dim: int = 32
    expand_v: int = 2
    conv_size: int = 4
    method: str = "auto"
    chunk_size: int | None = None
    decode_recurrent_max_len: int = 64

    def __post_init__(self):
        self.layer_config(128, 1e-6)  # the layer's own validation, at a neutral width

    def layer_config(self, d_model: int, norm_eps: float) -> DeltaNetConfig:
        """The :class:`DeltaNetConfig` of this mixer in a model of width ``d_model``."""
        fields = dataclasses.asdict(self)
        return DeltaNetConfig(d_model=d_model, norm_eps=norm_eps, **fields)


def _paper(d, k, tau_factor, min_log_mu, max_seq_len=4096):
    # 21 layers, 6 heads, expand_v 2, GPT-2 vocabulary, untied embeddings (arXiv 2605.05838)
    return DeltaNetConfig(
        vocab_size=50257, d_model=d, n_layers=21, n_heads=6, head_dim=k, expand_v=2,
        tau_factor=tau_factor, min_log_mu=min_log_mu, max_seq_len=max_seq_len,
    )


#: Size presets of the MDN and GDN language models. ``"tiny"`` is sized for CPU tests and demos;
#: ``"400m"`` and ``"1.3b"`` are the MDN paper's models (arXiv 2605.05838), whose GDN baseline has
#: the same dimensions.
DELTANET_PRESETS: dict[str, DeltaNetConfig] = {
    "tiny": DeltaNetConfig(
        d_model=128, n_layers=2, n_heads=2, head_dim=32, expand_v=2, mlp_multiple_of=32,
        max_seq_len=256, tau_factor=1.0, min_log_mu=-2.0,
    ),
    "400m": _paper(1024, 128, 1.0, -2.0),
    "1.3b": _paper(2048, 256, 8.0, -1.0),
}


def l2_normalize(x: jax.Array, eps: float = 1e-6) -> jax.Array:
    """``x * rsqrt(sum(x^2) + eps)`` over the last axis (fla's ``l2norm`` convention)."""
    x32 = x.astype(jnp.float32)
    return (x32 * jax.lax.rsqrt(jnp.sum(x32 * x32, axis=-1, keepdims=True) + eps)).astype(x.dtype)


# --------------------------------------------------------------------------- init helpers


def log_uniform_open(key, shape, high):
    """``log U(0, high]``: draws ``high * (1 - u)`` with ``u ~ U[0, 1)``, never 0."""
    return jnp.log(high * (1.0 - jax.random.uniform(key, shape, jnp.float32)))


def dt_bias_init(key, shape, dt_min=1e-3, dt_max=1e-1, floor=1e-4):
    """Mamba2 ``dt_bias = softplus^{-1}(dt)``, ``dt = exp(U(log dt_min, log dt_max)) >= floor``."""
    u = jax.random.uniform(key, shape, jnp.float32)
    dt = jnp.exp(u * (math.log(dt_max) - math.log(dt_min)) + math.log(dt_min))
    dt = jnp.maximum(dt, floor)
    return dt + jnp.log(-jnp.expm1(-dt))


def head_param(value):
    """A per-head gate vector ``[H]``: sharded over heads, excluded from weight decay."""
    return nnx.Param(value, logical_axes=("heads",), weight_decay=False)


def linear(i, o, axes, rngs):
    """Bias-free ``nnx.Linear`` with ``N(0, 0.02)`` kernel and logical axes ``axes``."""
    return nnx.Linear(
        i, o, use_bias=False, kernel_init=dense_init, kernel_metadata={"logical_axes": axes},
        rngs=rngs,
    )


# --------------------------------------------------------------------------- caches


class LayerCache(NamedTuple):
    """Decode state of one recurrent layer.

    ``state``: MDN ``[2, B, H, K, V]`` holding ``(S, M)``; GDN ``[B, H, K, V]``. ``conv_q``,
    ``conv_k``: ``[B, W-1, H*K]``; ``conv_v``: ``[B, W-1, H*V]`` (the last ``W-1`` conv inputs).
    """

    state: jax.Array
    conv_q: jax.Array
    conv_k: jax.Array
    conv_v: jax.Array


# --------------------------------------------------------------------------- mixer


class DeltaMixer(nnx.Module):
    """q/k/v projections and short convs, the op call with its cache, the gated head norm.

    A model subclasses it with its gate parameters (created after ``super().__init__`` so that the
    parameter draws keep their order), :attr:`gate_activation`, :meth:`_state_shape` and
    :meth:`_delta_rule`. ``__call__(x [B, T, d], cache=None) -> (y [B, T, d], new_cache or None)``.
    """

    #: Output gate ``act`` of ``RMSNorm_head(o) * act(W_g x)``.
    gate_activation: Callable[[jax.Array], jax.Array]

    def __init__(self, cfg: DeltaNetConfig, *, rngs: nnx.Rngs):
        self.cfg = cfg
        d, h, kd, vd = cfg.d_model, cfg.n_heads, cfg.head_dim, cfg.value_dim
        self.q_proj = linear(d, h * kd, ("embed", "heads"), rngs)
        self.k_proj = linear(d, h * kd, ("embed", "heads"), rngs)
        self.v_proj = linear(d, h * vd, ("embed", "heads"), rngs)
        self.q_conv = ShortConvolution(h * kd, cfg.conv_size, rngs=rngs)
        self.k_conv = ShortConvolution(h * kd, cfg.conv_size, rngs=rngs)
        self.v_conv = ShortConvolution(h * vd, cfg.conv_size, rngs=rngs)
        self.g_proj = linear(d, h * vd, ("embed", "heads"), rngs)
        self.o_norm = RMSNorm(vd, eps=cfg.norm_eps, logical_axis="kv")
        self.o_proj = linear(h * vd, d, ("heads", "embed"), rngs)

    def _state_shape(self, batch: int) -> tuple[int, ...]:
        """Shape of the op's recurrent state for ``batch`` sequences."""
        raise NotImplementedError

    def _delta_rule(self, x, q, k, v, **op_options):
        """The model's gates of ``x`` and its op over the conv outputs ``q, k [B, T, H, K]``,
        ``v [B, T, H, V]``; returns ``(o [B, T, H, V], final state or None)``. ``op_options`` are
        the op's ``scale``, ``initial_state``, ``output_final_state``, ``method``, ``chunk_size``.
        """
        raise NotImplementedError

    def init_cache(self, batch: int, max_len: int | None = None) -> LayerCache:
        """Zero decode state for ``batch`` sequences; ``max_len`` is ignored (the recurrent
        state has one size at any length)."""
        if not isinstance(batch, int) or batch <= 0:
            raise ValueError(f"init_cache: batch must be a positive int, got {batch!r}")
        return LayerCache(
            jnp.zeros(self._state_shape(batch), jnp.float32),
            self.q_conv.init_state(batch),
            self.k_conv.init_state(batch),
            self.v_conv.init_state(batch),
        )

    def __call__(self, x: jax.Array, cache: LayerCache | None = None):
        self._check(x, cache)
        c = self.cfg
        q, k, v, conv_states = self._qkv(x, cache)
        cached = cache is not None
        o, state = self._delta_rule(
            x, q, k, v,
            scale=c.head_dim**-0.5,
            initial_state=cache.state if cached else None,
            output_final_state=cached,
            method="reference" if cached and x.shape[1] <= c.decode_recurrent_max_len else c.method,
            chunk_size=c.chunk_size,
        )
        y = self._output(x, o)
        return y, (LayerCache(state, *conv_states) if cached else None)

    def _qkv(self, x, cache):
        b, t, _ = x.shape
        c = self.cfg
        q, cq = self.q_conv(self.q_proj(x), None if cache is None else cache.conv_q)
        k, ck = self.k_conv(self.k_proj(x), None if cache is None else cache.conv_k)
        v, cv = self.v_conv(self.v_proj(x), None if cache is None else cache.conv_v)
        q = q.reshape(b, t, c.n_heads, c.head_dim)
        k = k.reshape(b, t, c.n_heads, c.head_dim)
        v = v.reshape(b, t, c.n_heads, c.value_dim)
        return q, k, v, (cq, ck, cv)

    def _output(self, x, o):
        b, t, _ = x.shape
        c = self.cfg
        g = self.g_proj(x).reshape(b, t, c.n_heads, c.value_dim)
        o = rms_norm(o, self.o_norm.scale[...], c.norm_eps).astype(jnp.float32)
        o = o * self.gate_activation(g.astype(jnp.float32))
        return self.o_proj(o.reshape(b, t, c.n_heads * c.value_dim).astype(x.dtype))

    def _check(self, x, cache):
        c = self.cfg
        if x.ndim != 3 or x.shape[-1] != c.d_model:
            raise ValueError(
                f"{type(self).__name__}: x must be [B, T, d_model={c.d_model}], got {x.shape}"
            )
        if cache is not None and cache.conv_q.shape[0] != x.shape[0]:
            raise ValueError(
                f"{type(self).__name__}: cache batch {cache.conv_q.shape[0]} != x batch "
                f"{x.shape[0]}"
            )
