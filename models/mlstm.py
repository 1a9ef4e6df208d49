"""The mLSTM layer of xLSTM as a token mixer of the composable language model.

Beck et al., "xLSTM: Extended Long Short-Term Memory", arXiv 2405.04517: the mLSTM cell
(Section 2.3) inside the paper's pre-up-projection mLSTM block, over the pure op
:func:`jaxlib_ext.pallas_kernels.mlstm.mlstm`. With ``x [B, T, d]`` (the block's normalised
input), ``H`` heads, key width ``K = head_dim`` and value width
``V = expand_v * head_dim``::

    x_m = W_up x,   z = W_z x                                  [B, T, H*V]  (1) two branches
    x_c = SiLU(conv_W(x_m))                                    causal depthwise conv, width W
    q_h = x_c,h Wq_h,  k_h = x_c,h Wk_h,  v_h = x_m,h Wv_h     per head h  (2) Wq_h, Wk_h: [V, K]
    i~  = W_i x + b_i,  f~ = W_f x + b_f                       [B, T, H]   (3) gate pre-acts
    h   = mLSTM(q, k, v, i~, f~),  i = exp(i~), f = sigmoid(f~), q scaled by K^-1/2   (4)
    y   = W_o( (RMSNorm_head(h) + s * x_c) * SiLU(z) )                     (5)

(4) is the paper's stabilised mLSTM cell (``C_t = f_t C_{t-1} + i_t v_t k_t^T``,
``n_t = f_t n_{t-1} + i_t k_t``, ``h_t = C_t q_t / max(|n_t^T q_t|, 1)``, the running max
state ``m`` keeping ``exp(i~)`` finite); full sequences run the op's ``method`` (and
``xla_form``), cached calls of at most ``decode_recurrent_max_len`` tokens its ``"reference"``
path (the recurrence). Decoding keeps
constant memory: an :class:`MLSTMCache` holds the cell state ``(C, n, m)`` and the conv's last
``W - 1`` inputs.

Choices where the block is simplified, and why:
- The up-projection width is ``H*V`` (the paper's factor 2 is ``H*V = 2d``; the tiny presets
  use ``H*V = d``), so the layer shares the head geometry (``n_heads``, ``head_dim``,
  ``expand_v``) of the other mixers of the composable LM.
- The q/k/v projections are block-diagonal with one block per head (the paper's are
  block-diagonal with blocks of 4 channels): a head reads only its own ``V`` channels, and the
  projections shard over heads like the rest of the layer.
- The gate pre-activations (3) are linear in the layer input ``x``, one scalar per head (the
  paper's reference code computes them from ``[q, k, v]``; xLSTM 7B, arXiv 2503.13427, from
  ``x``, which is cheaper and independent of the conv). Biases: ``b_f = linspace(3, 6)`` over
  heads (forget gates near 1 at init: long memory), ``b_i = 0``. No soft cap: the stabiliser
  keeps the cell exact for any pre-activation.
- The output norm is a per-head RMSNorm with a learned scale (the paper's GroupNorm is a
  per-head LayerNorm; RMSNorm is xLSTM 7B's and this library's delta mixers' choice); ``s`` is
  the block's learnable skip from the conv output, one value per channel, initialised to 1.
- Inits: ``N(0, 0.02)`` for every projection (the library's convention), the conv as
  :class:`~jaxlib_ext.models.ShortConvolution`'s.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxlib_ext.models.layers import RMSNorm, dense_init, rms_norm
from jaxlib_ext.models.short_conv import ShortConvolution
from jaxlib_ext.pallas_kernels import SUPPORTED_CHUNK_SIZES
from jaxlib_ext.pallas_kernels.mlstm import METHODS as MLSTM_METHODS
from jaxlib_ext.pallas_kernels.mlstm import XLA_FORMS as MLSTM_XLA_FORMS
from jaxlib_ext.pallas_kernels.mlstm import MLSTMState, mlstm, zero_state

__all__ = ["MLSTMConfig", "MLSTMMixerConfig", "MLSTMCache", "MLSTMLayer"]

#: Forget-gate bias at init, ``(first head, last head)`` of a linspace.
FORGET_BIAS_INIT = (3.0, 6.0)


@dataclasses.dataclass(frozen=True)
class MLSTMConfig:
    """Sizes and op settings of one :class:`MLSTMLayer`.

    ``n_heads`` heads of key width ``head_dim`` and value width ``expand_v * head_dim``;
    ``conv_size``: width of the causal conv; ``norm_eps``: the head norm's epsilon. ``method``,
    ``xla_form``, ``chunk_size``: the mLSTM op's path on full sequences (``method`` one of
    :data:`MLSTM_METHODS`, ``"auto" | "reference" | "xla"``; ``xla_form`` one of
    :data:`MLSTM_XLA_FORMS`, ``"chunk" | "parallel"``, the form of ``"xla"``; chunk size
    ``None`` is the op's default, 64); cached calls of at most ``decode_recurrent_max_len``
    tokens run its ``"reference"`` path (the recurrence).
    """

    d_model: int = 128
    n_heads: int = 2
    head_dim: int = 32
    expand_v: int = 2
    conv_size: int = 4
    norm_eps: float = 1e-6
    method: str = "auto"
    xla_form: str = "chunk"
    chunk_size: int | None = None
    decode_recurrent_max_len: int = 64

    def __post_init__(self):
        for name in ("d_model", "n_heads", "head_dim", "expand_v", "conv_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | np.integer) or value <= 0:
                raise ValueError(f"MLSTMConfig.{name} must be a positive int, got {value!r}")
        value = self.decode_recurrent_max_len
        if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 0:
            raise ValueError(
                f"MLSTMConfig.decode_recurrent_max_len must be an int >= 0, got {value!r}"
            )
        if self.method not in MLSTM_METHODS:
            raise ValueError(
                f"MLSTMConfig.method must be one of {MLSTM_METHODS} for mixer 'mlstm', got "
                f"{self.method!r}"
            )
        if self.xla_form not in MLSTM_XLA_FORMS:
            raise ValueError(
                f"MLSTMConfig.xla_form must be one of {MLSTM_XLA_FORMS}, got {self.xla_form!r}"
            )
        if self.chunk_size is not None and self.chunk_size not in SUPPORTED_CHUNK_SIZES:
            raise ValueError(
                f"MLSTMConfig.chunk_size must be None or one of {SUPPORTED_CHUNK_SIZES}, got "
                f"{self.chunk_size!r}"
            )
        if not self.norm_eps > 0:
            raise ValueError(f"MLSTMConfig.norm_eps must be > 0, got {self.norm_eps}")

    @property
    def value_dim(self) -> int:
        return self.expand_v * self.head_dim

    @property
    def inner_dim(self) -> int:
        """Width ``H*V`` of the up-projected branches."""
        return self.n_heads * self.value_dim


@dataclasses.dataclass(frozen=True)
class MLSTMMixerConfig:
    """The ``"mlstm"`` mixer of a language-model block: :class:`MLSTMConfig` without the fields
    the backbone sets (``d_model``, ``norm_eps``); :meth:`layer_config` adds them."""

    kind: ClassVar[str] = "mlstm"
    n_heads: int = 4
    head_dim: int = 32
    expand_v: int = 2
    conv_size: int = 4
    method: str = "auto"
    xla_form: str = "chunk"
    chunk_size: int | None = None
    decode_recurrent_max_len: int = 64

    def __post_init__(self):
        self.layer_config(128, 1e-6)  # the layer's own validation, at a neutral width

    def layer_config(self, d_model: int, norm_eps: float) -> MLSTMConfig:
        """The :class:`MLSTMConfig` of this mixer in a model of width ``d_model``."""
        return MLSTMConfig(d_model=d_model, norm_eps=norm_eps, **dataclasses.asdict(self))


class MLSTMCache(NamedTuple):
    """Decode state of one :class:`MLSTMLayer`, of a size that does not grow with position.

    ``state``: the cell state ``(C [B, H, K, V], n [B, H, K], m [B, H])`` float32 in the op's
    stabilised units; ``conv``: ``[B, W-1, H*V]``, the conv's last ``W - 1`` inputs.
    """

    state: MLSTMState
    conv: jax.Array


def _linear(i, o, axes, rngs, *, bias=None):
    """``nnx.Linear`` with ``N(0, 0.02)`` kernel and logical axes ``axes``; ``bias`` (an array
    ``[o]``) adds a bias initialised to it, sharded like the output axis."""
    lin = nnx.Linear(
        i, o, use_bias=bias is not None, kernel_init=dense_init,
        kernel_metadata={"logical_axes": axes},
        bias_metadata={"logical_axes": axes[-1:], "weight_decay": False}, rngs=rngs,
    )
    if bias is not None:
        lin.bias.set_value(jnp.asarray(bias, jnp.float32))
    return lin


def _head_weight(rngs, h, i, o):
    """A per-head projection ``[H, i, o]``, ``N(0, 0.02)``, sharded over heads."""
    return nnx.Param(dense_init(rngs.params(), (h, i, o), jnp.float32),
                     logical_axes=("heads", None, None))


class MLSTMLayer(nnx.Module):
    """The mLSTM token mixer (module docstring, (1)-(5)).

    Parameters: ``up_proj``, ``z_proj`` (``d -> H*V``), ``conv`` (depthwise, ``H*V`` channels),
    ``q_weight``, ``k_weight`` (``[H, V, K]``), ``v_weight`` (``[H, V, V]``), ``i_proj``,
    ``f_proj`` (``d -> H`` with bias), ``o_norm`` (scale ``[V]``), ``skip`` (``[H, V]``),
    ``o_proj`` (``H*V -> d``).

    ``__call__(x [B, T, d], cache=None) -> (y [B, T, d], new_cache or None)``: without a cache
    the full sequence; with an :class:`MLSTMCache` (from :meth:`init_cache`) the tokens after
    the cached ones, returning the updated cache.
    """

    def __init__(self, cfg: MLSTMConfig, *, rngs: nnx.Rngs):
        if not isinstance(cfg, MLSTMConfig):
            raise TypeError(f"cfg must be an MLSTMConfig, got {type(cfg).__name__}")
        self.cfg = cfg
        d, h, kd, vd, inner = cfg.d_model, cfg.n_heads, cfg.head_dim, cfg.value_dim, cfg.inner_dim
        self.up_proj = _linear(d, inner, ("embed", "heads"), rngs)
        self.z_proj = _linear(d, inner, ("embed", "heads"), rngs)
        self.conv = ShortConvolution(inner, cfg.conv_size, rngs=rngs)
        self.q_weight = _head_weight(rngs, h, vd, kd)
        self.k_weight = _head_weight(rngs, h, vd, kd)
        self.v_weight = _head_weight(rngs, h, vd, vd)
        self.i_proj = _linear(d, h, ("embed", "heads"), rngs, bias=np.zeros(h))
        self.f_proj = _linear(d, h, ("embed", "heads"), rngs,
                              bias=np.linspace(*FORGET_BIAS_INIT, h))
        self.o_norm = RMSNorm(vd, eps=cfg.norm_eps, logical_axis="kv")
        self.skip = nnx.Param(jnp.ones((h, vd), jnp.float32), logical_axes=("heads", None),
                              weight_decay=False)
        self.o_proj = _linear(inner, d, ("heads", "embed"), rngs)

    def init_cache(self, batch: int, max_len: int | None = None) -> MLSTMCache:
        """Zero decode state for ``batch`` sequences (float32); ``max_len`` is ignored (the
        state has one size at any length)."""
        if isinstance(batch, bool) or not isinstance(batch, int | np.integer) or batch <= 0:
            raise ValueError(f"init_cache: batch must be a positive int, got {batch!r}")
        c = self.cfg
        return MLSTMCache(zero_state(int(batch), c.n_heads, c.head_dim, c.value_dim),
                          self.conv.init_state(int(batch)))

    def gates(self, x: jax.Array) -> tuple[jax.Array, jax.Array]:
        """Input- and forget-gate pre-activations ``(i~, f~)`` ``[B, T, H]`` float32, (3)."""
        return self.i_proj(x).astype(jnp.float32), self.f_proj(x).astype(jnp.float32)

    def __call__(self, x: jax.Array, cache: MLSTMCache | None = None):
        self._check(x, cache)
        c = self.cfg
        b, t, _ = x.shape
        h, vd = c.n_heads, c.value_dim
        x_m = self.up_proj(x)  # (1)
        z = self.z_proj(x)
        x_c, conv_state = self.conv(x_m, None if cache is None else cache.conv)
        x_m, x_c = x_m.reshape(b, t, h, vd), x_c.reshape(b, t, h, vd)
        q = jnp.einsum("bthv,hvk->bthk", x_c, self.q_weight[...].astype(x.dtype))  # (2)
        k = jnp.einsum("bthv,hvk->bthk", x_c, self.k_weight[...].astype(x.dtype))
        v = jnp.einsum("bthv,hvw->bthw", x_m, self.v_weight[...].astype(x.dtype))
        i_gate, f_gate = self.gates(x)  # (3)
        cached = cache is not None
        method = c.method
        if cached and t <= c.decode_recurrent_max_len:
            method = "reference"
        out, state = mlstm(  # (4)
            q, k, v, i_gate, f_gate, scale=c.head_dim**-0.5,
            initial_state=cache.state if cached else None, output_final_state=cached,
            method=method, xla_form=c.xla_form, chunk_size=c.chunk_size,
        )
        out = rms_norm(out, self.o_norm.scale[...], c.norm_eps).astype(jnp.float32)  # (5)
        out = out + self.skip[...] * x_c.astype(jnp.float32)
        out = out * jax.nn.silu(z.reshape(b, t, h, vd).astype(jnp.float32))
        y = self.o_proj(out.reshape(b, t, h * vd).astype(x.dtype))
        return y, (MLSTMCache(state, conv_state) if cached else None)

    def _check(self, x, cache):
        name = type(self).__name__
        d = self.cfg.d_model
        if not hasattr(x, "ndim") or x.ndim != 3 or x.shape[-1] != d:
            raise ValueError(f"{name}: x must be [B, T, d_model={d}], got "
                             f"{getattr(x, 'shape', type(x).__name__)}")
        if not jnp.issubdtype(x.dtype, jnp.floating):
            raise ValueError(f"{name}: x must have a floating dtype, got {x.dtype}")
        if cache is None:
            return
        if not isinstance(cache, MLSTMCache):
            raise ValueError(f"{name}: cache must be an MLSTMCache (init_cache), got "
                             f"{type(cache).__name__}")
        if cache.conv.shape[0] != x.shape[0]:
            raise ValueError(f"{name}: cache batch {cache.conv.shape[0]} != x batch "
                             f"{x.shape[0]}")
