"""Momentum DeltaNet (MDN) and Gated DeltaNet (GDN) layers and language models in Flax NNX.

Momentum DeltaNet: Huang et al., "Momentum DeltaNet", arXiv 2605.05838 (ICML 2026); our notes
``shared/papers/models.md`` section 1. Gated DeltaNet: Yang, Kautz & Hatamizadeh,
arXiv 2412.06464. Both layers are thin modules over the pure ops
:func:`jaxlib_ext.pallas_kernels.mdn.momentum_delta_rule` and
:func:`jaxlib_ext.pallas_kernels.gated_delta.gated_delta_rule`; the pure pieces of the layer
(gate parameterisation, L2 norm, the 2x2 stability system) are functions beside the modules.

MDN layer, per token ``x`` (notes section 1.3)::

    q, k, v = SiLU(conv4(W_q x)), SiLU(conv4(W_k x)), SiLU(conv4(W_v x))   (short causal convs)
    q      <- q - exp(D_log) * k                                         (output correction)
    log_alpha_hat = -exp(A_log) * softplus(a + dt_bias)                  (Mamba2-style decay)
    log_mu        = max(-exp(Mu_log) * softplus(m + mu_bias), min_log_mu)
    eta    = tanh(e / tau) + 1,  tau = sqrt(d / tau_factor)
    theta  = arctan(eta * exp(log_factor))                               (stability constraint)
    beta   = sin^2(theta) * sigmoid(b)
    log_alpha = log cos^2(theta) + log_alpha_hat
    q_hat, k_hat = q / ||q||, k / ||k||;   k <- eta * k_hat;   p <- alpha * k_hat
    o      = momentum_delta_rule(q_hat, k, v, p, log_alpha, log_mu, beta, ...)
    y      = W_o( RMSNorm_head(o) * sigmoid(W_g x) )

with ``a, b, m, e`` per-head scalars ``W_{a,b,m,e} x``. The op's ``eta`` argument multiplies
``k`` once inside ``M_t = mu M + eta k w^T``; we pass ``k = k_hat`` with ``eta = eta``, which is
the same recurrence as ``k <- eta k_hat`` with unit ``eta`` (the fla kernel also scales by ``eta``
exactly once); passing ``eta * k_hat`` *and* ``eta`` would apply it twice.

Choices where the notes leave room (documented here as the brief asks):
- L2 norm is ``x * rsqrt(sum x^2 + 1e-6)`` (fla's ``l2norm``), not the ``x / (||x|| + 1e-6)``
  of the MDN recurrent kernel; the two differ by O(1e-6 / ||x||).
- ``sin^2(arctan x) = x^2 / (1 + x^2)`` and ``log cos^2(arctan x) = -log1p(x^2)`` are evaluated
  in closed form (exact identities; no rounded angle goes through ``log(cos(.)^2)``).
- ``U(0, c)`` inits are drawn on ``(0, c]`` so that ``log`` never sees 0.
- Linear and conv weights use ``N(0, 0.02)`` (fla ``initializer_range``; no residual rescale,
  matching the MDN modeling file's default ``prenorm_residual_strategy=None``).
- Gate vectors carry ``weight_decay=False`` metadata (fla's ``_no_weight_decay``).
"""

from __future__ import annotations

import dataclasses
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

from jaxlib_ext.models.layers import (
    Embedding,
    LMHead,
    RMSNorm,
    SwiGLU,
    dense_init,
    rms_norm,
    swiglu_hidden_size,
)
from jaxlib_ext.models.short_conv import ShortConvolution
from jaxlib_ext.pallas_kernels import gated_delta as _gdn_ops
from jaxlib_ext.pallas_kernels import mdn as _mdn_ops

__all__ = [
    "DeltaNetConfig",
    "MDN_PRESETS",
    "GDN_PRESETS",
    "MDNGates",
    "mdn_gates",
    "gdn_gates",
    "l2_normalize",
    "momentum_transition_matrix",
    "momentum_eigenvalues",
    "LayerCache",
    "LMCache",
    "MomentumDeltaNet",
    "GatedDeltaNet",
    "MDNLanguageModel",
    "GDNLanguageModel",
    "build_mdn",
    "build_gdn",
    "param_count",
    "preset_param_count",
]

_METHODS = ("auto", "recurrent", "chunk", "pallas")


# --------------------------------------------------------------------------- configs


@dataclasses.dataclass(frozen=True)
class DeltaNetConfig:
    """Configuration shared by the MDN and GDN language models.

    ``tau_factor``, ``min_log_mu`` and ``use_output_correction`` only affect MDN. The value head
    dim is ``V = expand_v * head_dim``. ``method``/``chunk_size`` select the op path for
    full-sequence calls; cached calls of at most ``decode_recurrent_max_len`` tokens use the
    recurrent path (as fla switches to ``fused_recurrent`` for ``q_len <= 64``).
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
    chunk_size: int = 64
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
        if self.method not in _METHODS:
            raise ValueError(
                f"DeltaNetConfig.method must be one of {_METHODS}, got {self.method!r}"
            )
        if self.chunk_size not in (16, 32, 64, 128):
            raise ValueError(
                f"DeltaNetConfig.chunk_size must be one of (16, 32, 64, 128), got {self.chunk_size}"
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


def _paper(d, k, tau_factor, min_log_mu, max_seq_len=4096):
    # notes section 1.4: 21 layers, 6 heads, expand_v 2, GPT-2 vocabulary, untied embeddings
    return DeltaNetConfig(
        vocab_size=50257, d_model=d, n_layers=21, n_heads=6, head_dim=k, expand_v=2,
        tau_factor=tau_factor, min_log_mu=min_log_mu, max_seq_len=max_seq_len,
    )


# `tiny` trains a few hundred steps on 2 CPU cores in about a minute; the paper sizes follow
# notes section 1.4 (GDN-400M "same dims as MDN").
_TINY = DeltaNetConfig(
    d_model=128, n_layers=2, n_heads=2, head_dim=32, expand_v=2, mlp_multiple_of=32,
    max_seq_len=256, tau_factor=1.0, min_log_mu=-2.0,
)
MDN_PRESETS: dict[str, DeltaNetConfig] = {
    "mdn-tiny": _TINY,
    "mdn-400m": _paper(1024, 128, 1.0, -2.0),
    "mdn-1.3b": _paper(2048, 256, 8.0, -1.0),
}
GDN_PRESETS: dict[str, DeltaNetConfig] = {
    "gdn-tiny": _TINY,
    "gdn-400m": _paper(1024, 128, 1.0, -2.0),
    "gdn-1.3b": _paper(2048, 256, 8.0, -1.0),
}


def _resolve_preset(preset: str, presets: dict[str, DeltaNetConfig], prefix: str):
    name = preset if preset in presets else f"{prefix}-{preset}"
    if name not in presets:
        raise ValueError(
            f"unknown {prefix} preset {preset!r}; choose from {sorted(presets)} "
            f"(or the same without the '{prefix}-' prefix)"
        )
    return presets[name]


# --------------------------------------------------------------------------- pure pieces


def l2_normalize(x: jax.Array, eps: float = 1e-6) -> jax.Array:
    """``x * rsqrt(sum(x^2) + eps)`` over the last axis (fla's ``l2norm`` convention)."""
    x32 = x.astype(jnp.float32)
    return (x32 * jax.lax.rsqrt(jnp.sum(x32 * x32, axis=-1, keepdims=True) + eps)).astype(x.dtype)


class MDNGates(NamedTuple):
    """Per-token, per-head gates of the momentum delta rule, all ``[..., H]`` float32."""

    log_alpha: jax.Array
    log_mu: jax.Array
    beta: jax.Array
    eta: jax.Array


def _softplus(x):
    return jax.nn.softplus(x)


def mdn_gates(
    a: jax.Array,
    b: jax.Array,
    m: jax.Array,
    e: jax.Array,
    *,
    A_log: jax.Array,
    Mu_log: jax.Array,
    dt_bias: jax.Array,
    mu_bias: jax.Array,
    log_factor: jax.Array,
    tau: float,
    min_log_mu: float | None,
) -> MDNGates:
    """MDN gate parameterisation (notes section 1.3), in float32.

    Args:
      a, b, m, e: ``[..., H]`` raw per-head projections of the token.
      A_log, Mu_log, dt_bias, mu_bias, log_factor: ``[H]`` parameters.
      tau: temperature of ``eta``; ``sqrt(d / tau_factor)``.
      min_log_mu: lower clamp of ``log_mu`` (``None``: no clamp).

    Returns:
      :class:`MDNGates` with ``alpha = cos^2(theta) alpha_hat``, ``beta = sin^2(theta) sigmoid(b)``,
      ``theta = arctan(eta exp(log_factor))``. Every value it emits gives the 2x2 system of
      :func:`momentum_transition_matrix` a spectral radius below one (``alpha beta eta <= eta/4``).
    """
    f32 = jnp.float32
    a, b, m, e = (jnp.asarray(x, f32) for x in (a, b, m, e))
    log_alpha_hat = -jnp.exp(A_log.astype(f32)) * _softplus(a + dt_bias.astype(f32))  # Mamba2
    log_mu = -jnp.exp(Mu_log.astype(f32)) * _softplus(m + mu_bias.astype(f32))
    if min_log_mu is not None:
        log_mu = jnp.maximum(log_mu, min_log_mu)
    eta = jnp.tanh(e / tau) + 1.0  # in (0, 2)
    x = eta * jnp.exp(log_factor.astype(f32))  # tan(theta), theta = arctan(eta e^{log_factor})
    x2 = x * x
    sin2 = x2 / (1.0 + x2)  # sin^2(arctan x)
    log_cos2 = -jnp.log1p(x2)  # log cos^2(arctan x)
    beta = sin2 * jax.nn.sigmoid(b)
    log_alpha = log_cos2 + log_alpha_hat
    return MDNGates(log_alpha, log_mu, beta, eta)


def gdn_gates(a, b, *, A_log, dt_bias):
    """Gated DeltaNet gates: ``(g, beta) = (-exp(A_log) softplus(a + dt_bias), sigmoid(b))``."""
    f32 = jnp.float32
    a, b = jnp.asarray(a, f32), jnp.asarray(b, f32)
    g = -jnp.exp(A_log.astype(f32)) * _softplus(a + dt_bias.astype(f32))
    return g, jax.nn.sigmoid(b)


def momentum_transition_matrix(log_alpha, log_mu, beta, eta) -> jax.Array:
    """The homogeneous 2x2 system along a unit key ``k_hat`` with ``p = alpha k_hat``.

    With ``s = k_hat^T S`` and ``m = k_hat^T M`` (notes section 1.3, our derivation)::

        [s_t]   [alpha (1 - beta eta)   -beta mu] [s_{t-1}]
        [m_t] = [alpha eta                   mu ] [m_{t-1}]

    Returns ``[..., 2, 2]`` for gates of any common shape.
    """
    alpha, mu = jnp.exp(log_alpha), jnp.exp(log_mu)
    row0 = jnp.stack([alpha * (1.0 - beta * eta), -beta * mu], axis=-1)
    row1 = jnp.stack([alpha * eta, mu], axis=-1)
    return jnp.stack([row0, row1], axis=-2)


def momentum_eigenvalues(log_alpha, log_mu, beta, eta) -> jax.Array:
    """Eigenvalues ``[..., 2]`` (complex) of :func:`momentum_transition_matrix`, in closed form.

    ``lambda^2 - (alpha (1 - beta eta) + mu) lambda + alpha mu = 0``; complex-conjugate roots have
    modulus ``sqrt(alpha mu)``.
    """
    alpha, mu = jnp.exp(log_alpha), jnp.exp(log_mu)
    tr = alpha * (1.0 - beta * eta) + mu
    det = alpha * mu
    ctype = jnp.complex128 if tr.dtype == jnp.float64 else jnp.complex64
    root = jnp.sqrt((tr * tr - 4.0 * det).astype(ctype))
    return jnp.stack([(tr + root) / 2.0, (tr - root) / 2.0], axis=-1)


# --------------------------------------------------------------------------- init helpers


def _log_uniform_open(key, shape, high):
    """``log U(0, high]``: draws ``high * (1 - u)`` with ``u ~ U[0, 1)``, never 0."""
    return jnp.log(high * (1.0 - jax.random.uniform(key, shape, jnp.float32)))


def _dt_bias_init(key, shape, dt_min=1e-3, dt_max=1e-1, floor=1e-4):
    """Mamba2 ``dt_bias = softplus^{-1}(dt)``, ``dt = exp(U(log dt_min, log dt_max)) >= floor``."""
    u = jax.random.uniform(key, shape, jnp.float32)
    dt = jnp.exp(u * (math.log(dt_max) - math.log(dt_min)) + math.log(dt_min))
    dt = jnp.maximum(dt, floor)
    return dt + jnp.log(-jnp.expm1(-dt))


def _head_param(value):
    return nnx.Param(value, logical_axes=("heads",), weight_decay=False)


def _linear(i, o, axes, rngs):
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


class LMCache(NamedTuple):
    """Decode state of a whole LM: one :class:`LayerCache` per block and the tokens consumed."""

    layers: tuple[LayerCache, ...]
    position: jax.Array  # int32 scalar


# --------------------------------------------------------------------------- layers


class _DeltaMixerBase(nnx.Module):
    """The parts MDN and GDN share: q/k/v projections + short convs, gated head norm, o_proj."""

    gate_activation = staticmethod(jax.nn.sigmoid)

    def __init__(self, cfg: DeltaNetConfig, *, rngs: nnx.Rngs):
        self.cfg = cfg
        d, h, kd, vd = cfg.d_model, cfg.n_heads, cfg.head_dim, cfg.value_dim
        self.q_proj = _linear(d, h * kd, ("embed", "heads"), rngs)
        self.k_proj = _linear(d, h * kd, ("embed", "heads"), rngs)
        self.v_proj = _linear(d, h * vd, ("embed", "heads"), rngs)
        self.q_conv = ShortConvolution(h * kd, cfg.conv_size, rngs=rngs)
        self.k_conv = ShortConvolution(h * kd, cfg.conv_size, rngs=rngs)
        self.v_conv = ShortConvolution(h * vd, cfg.conv_size, rngs=rngs)
        self.g_proj = _linear(d, h * vd, ("embed", "heads"), rngs)
        self.o_norm = RMSNorm(vd, eps=cfg.norm_eps, logical_axis="kv")
        self.o_proj = _linear(h * vd, d, ("heads", "embed"), rngs)

    # state shape of the op; overridden
    def _state_shape(self, batch):
        raise NotImplementedError

    def init_cache(self, batch: int) -> LayerCache:
        """Zero decode state for ``batch`` sequences."""
        if not isinstance(batch, int) or batch <= 0:
            raise ValueError(f"init_cache: batch must be a positive int, got {batch!r}")
        return LayerCache(
            jnp.zeros(self._state_shape(batch), jnp.float32),
            self.q_conv.init_state(batch),
            self.k_conv.init_state(batch),
            self.v_conv.init_state(batch),
        )

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

    def _method(self, t: int, cached: bool) -> str:
        c = self.cfg
        if cached and t <= c.decode_recurrent_max_len:
            return "recurrent"
        return c.method

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


class MomentumDeltaNet(_DeltaMixerBase):
    """The Momentum DeltaNet token mixer (arXiv 2605.05838; notes section 1.3).

    ``__call__(x [B, T, d], cache=None) -> (y [B, T, d], new_cache or None)``. See the module
    docstring for the equations, inits and the choices made where the notes leave room.
    """

    gate_activation = staticmethod(jax.nn.sigmoid)

    def __init__(self, cfg: DeltaNetConfig, *, rngs: nnx.Rngs):
        super().__init__(cfg, rngs=rngs)
        d, h = cfg.d_model, cfg.n_heads
        self.a_proj = _linear(d, h, ("embed", "heads"), rngs)
        self.b_proj = _linear(d, h, ("embed", "heads"), rngs)
        self.m_proj = _linear(d, h, ("embed", "heads"), rngs)
        self.e_proj = _linear(d, h, ("embed", "heads"), rngs)
        self.A_log = _head_param(_log_uniform_open(rngs.params(), (h,), 16.0))  # log U(0,16)
        self.Mu_log = _head_param(_log_uniform_open(rngs.params(), (h,), 16.0))  # log U(0,16)
        dt_bias = _dt_bias_init(rngs.params(), (h,))
        self.dt_bias = _head_param(dt_bias)
        self.mu_bias = _head_param(jnp.array(dt_bias))  # a copy of dt_bias at init
        self.log_factor = _head_param(_log_uniform_open(rngs.params(), (h,), 4.0))  # log U(0,4)
        if cfg.use_output_correction:
            self.D_log = _head_param(_log_uniform_open(rngs.params(), (h,), 1.0))  # log U(0,1)
        else:
            self.D_log = None

    def _state_shape(self, batch):
        c = self.cfg
        return (2, batch, c.n_heads, c.head_dim, c.value_dim)

    def gates(self, x: jax.Array) -> MDNGates:
        """The gates this layer emits for hidden states ``x [B, T, d]`` (``[B, T, H]`` each)."""
        c = self.cfg
        return mdn_gates(
            self.a_proj(x), self.b_proj(x), self.m_proj(x), self.e_proj(x),
            A_log=self.A_log[...], Mu_log=self.Mu_log[...], dt_bias=self.dt_bias[...],
            mu_bias=self.mu_bias[...], log_factor=self.log_factor[...], tau=c.tau,
            min_log_mu=c.min_log_mu,
        )

    def __call__(self, x: jax.Array, cache: LayerCache | None = None):
        self._check(x, cache)
        c = self.cfg
        q, k, v, conv_states = self._qkv(x, cache)
        gates = self.gates(x)
        if c.use_output_correction:  # on the raw conv outputs, before the L2 norm
            q = (q - jnp.exp(self.D_log[...])[:, None] * k).astype(k.dtype)
        q_hat, k_hat = l2_normalize(q), l2_normalize(k)
        p = (jnp.exp(gates.log_alpha)[..., None] * k_hat).astype(k_hat.dtype)  # p = alpha k_hat
        # k <- eta k_hat: the op applies eta once (M += eta k w^T), so k_hat goes in as k.
        o, state = _mdn_ops.momentum_delta_rule(
            q_hat, k_hat, v, p, gates.log_alpha, gates.log_mu, gates.beta, gates.eta,
            scale=c.head_dim**-0.5,
            initial_state=None if cache is None else cache.state,
            output_final_state=cache is not None,
            method=self._method(x.shape[1], cache is not None),
            chunk_size=c.chunk_size,
        )
        y = self._output(x, o)
        new_cache = None if cache is None else LayerCache(state, *conv_states)
        return y, new_cache


class GatedDeltaNet(_DeltaMixerBase):
    """The Gated DeltaNet token mixer (arXiv 2412.06464) with the same skeleton as MDN.

    ``g = -exp(A_log) softplus(a + dt_bias)``, ``beta = sigmoid(b)``, L2-normalised q and k,
    ``S_t = alpha_t S_{t-1} + beta_t k_t (v_t - alpha_t S_{t-1}^T k_t)^T``, output
    ``RMSNorm_head(o) * SiLU(W_g x)`` (fla's ``FusedRMSNormGated`` default), then ``o_proj``.
    """

    gate_activation = staticmethod(jax.nn.silu)

    def __init__(self, cfg: DeltaNetConfig, *, rngs: nnx.Rngs):
        super().__init__(cfg, rngs=rngs)
        d, h = cfg.d_model, cfg.n_heads
        self.a_proj = _linear(d, h, ("embed", "heads"), rngs)
        self.b_proj = _linear(d, h, ("embed", "heads"), rngs)
        self.A_log = _head_param(_log_uniform_open(rngs.params(), (h,), 16.0))
        self.dt_bias = _head_param(_dt_bias_init(rngs.params(), (h,)))

    def _state_shape(self, batch):
        c = self.cfg
        return (batch, c.n_heads, c.head_dim, c.value_dim)

    def gates(self, x: jax.Array):
        """``(g, beta)``, each ``[B, T, H]`` float32."""
        return gdn_gates(self.a_proj(x), self.b_proj(x), A_log=self.A_log[...],
                         dt_bias=self.dt_bias[...])

    def __call__(self, x: jax.Array, cache: LayerCache | None = None):
        self._check(x, cache)
        c = self.cfg
        q, k, v, conv_states = self._qkv(x, cache)
        g, beta = self.gates(x)
        o, state = _gdn_ops.gated_delta_rule(
            l2_normalize(q), l2_normalize(k), v, g, beta,
            scale=c.head_dim**-0.5,
            initial_state=None if cache is None else cache.state,
            output_final_state=cache is not None,
            method=self._method(x.shape[1], cache is not None),
            chunk_size=c.chunk_size,
        )
        y = self._output(x, o)
        new_cache = None if cache is None else LayerCache(state, *conv_states)
        return y, new_cache


# --------------------------------------------------------------------------- LMs


class _Block(nnx.Module):
    """Pre-norm block: ``x + mixer(norm(x))``, then ``x + SwiGLU(norm(x))``."""

    def __init__(self, cfg: DeltaNetConfig, mixer_cls, *, rngs: nnx.Rngs):
        self.attn_norm = RMSNorm(cfg.d_model, eps=cfg.norm_eps)
        self.attn = mixer_cls(cfg, rngs=rngs)
        self.mlp_norm = RMSNorm(cfg.d_model, eps=cfg.norm_eps)
        self.mlp = SwiGLU(cfg.d_model, cfg.hidden, rngs=rngs)

    def __call__(self, x, cache=None):
        y, cache = self.attn(self.attn_norm(x), cache)
        x = x + y
        return x + self.mlp(self.mlp_norm(x)), cache


class _DeltaLM(nnx.Module):
    mixer_cls: type = None

    def __init__(self, cfg: DeltaNetConfig, *, rngs: nnx.Rngs):
        self.cfg = cfg
        self.max_seq_len = cfg.max_seq_len
        self.embed = Embedding(cfg.vocab_size, cfg.d_model, rngs=rngs)
        self.blocks = nnx.List(
            [_Block(cfg, self.mixer_cls, rngs=rngs) for _ in range(cfg.n_layers)]
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

    def __call__(self, tokens: jax.Array) -> jax.Array:
        """Full-sequence forward: ``int32[B, T] -> float32 logits [B, T, vocab]``."""
        self._check_tokens(tokens, "__call__")
        if tokens.shape[1] > self.max_seq_len:
            raise ValueError(
                f"{type(self).__name__}: sequence length {tokens.shape[1]} exceeds max_seq_len "
                f"{self.max_seq_len}"
            )
        x = self.embed(tokens)
        for block in self.blocks:
            x, _ = block(x)
        return self.lm_head(self.final_norm(x))

    def init_cache(self, batch: int) -> LMCache:
        """A zero :class:`LMCache` for ``batch`` sequences (states float32)."""
        layers = tuple(block.attn.init_cache(batch) for block in self.blocks)
        return LMCache(layers, jnp.zeros((), jnp.int32))

    def decode_step(self, tokens: jax.Array, cache: LMCache) -> tuple[jax.Array, LMCache]:
        """Consume ``tokens [B, T']`` after the cached prefix; ``T' = 1`` is one decode step.

        Returns ``(logits [B, T', vocab], new_cache)``. Longer ``T'`` prefills with the chunk
        path (``T' > decode_recurrent_max_len``) or the recurrent path. Feeding a sequence
        piece by piece gives the logits of one full forward.
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
            x, layer_cache = block(x, layer_cache)
            new_layers.append(layer_cache)
        logits = self.lm_head(self.final_norm(x))
        return logits, LMCache(tuple(new_layers), cache.position + tokens.shape[1])


class MDNLanguageModel(_DeltaLM):
    """Momentum DeltaNet LM: embedding, ``n_layers`` x (MDN mixer + SwiGLU), norm, untied head.

    ``__call__(tokens int32[B, T]) -> logits float32[B, T, vocab]``; decoding with
    :meth:`init_cache` and :meth:`decode_step`.
    """

    mixer_cls = MomentumDeltaNet


class GDNLanguageModel(_DeltaLM):
    """Gated DeltaNet LM with the same skeleton as :class:`MDNLanguageModel`."""

    mixer_cls = GatedDeltaNet


def build_mdn(
    preset: str = "mdn-tiny", *, vocab_size: int = 256, rngs: nnx.Rngs, **overrides
) -> MDNLanguageModel:
    """Registry factory: an :class:`MDNLanguageModel` from a preset (``"tiny"`` aliases
    ``"mdn-tiny"``; also ``"mdn-400m"``, ``"mdn-1.3b"``) plus config overrides."""
    cfg = dataclasses.replace(
        _resolve_preset(preset, MDN_PRESETS, "mdn"), vocab_size=vocab_size, **overrides
    )
    return MDNLanguageModel(cfg, rngs=rngs)


def build_gdn(
    preset: str = "gdn-tiny", *, vocab_size: int = 256, rngs: nnx.Rngs, **overrides
) -> GDNLanguageModel:
    """Registry factory: a :class:`GDNLanguageModel` (``"tiny"`` aliases ``"gdn-tiny"``)."""
    cfg = dataclasses.replace(
        _resolve_preset(preset, GDN_PRESETS, "gdn"), vocab_size=vocab_size, **overrides
    )
    return GDNLanguageModel(cfg, rngs=rngs)


def param_count(module: nnx.Module) -> int:
    """Number of scalars in the module's ``nnx.Param`` leaves (works on abstract modules)."""
    return sum(math.prod(x.shape) for x in jax.tree.leaves(nnx.state(module, nnx.Param)))


def preset_param_count(preset: str, *, family: str = "mdn", vocab_size: int | None = None) -> int:
    """Parameter count of a preset without allocating it (``nnx.eval_shape``).

    ``family`` is ``"mdn"`` or ``"gdn"``; ``vocab_size`` defaults to the preset's (50257 for the
    paper sizes, 256 for tiny).
    """
    builders = {"mdn": (build_mdn, MDN_PRESETS), "gdn": (build_gdn, GDN_PRESETS)}
    if family not in builders:
        raise ValueError(f"preset_param_count: family must be 'mdn' or 'gdn', got {family!r}")
    build, presets = builders[family]
    if vocab_size is None:
        vocab_size = _resolve_preset(preset, presets, family).vocab_size
    abstract = nnx.eval_shape(lambda: build(preset, vocab_size=vocab_size, rngs=nnx.Rngs(0)))
    return param_count(abstract)
