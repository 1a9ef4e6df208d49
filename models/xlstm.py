"""xLSTM students of a Llama teacher: hybrid mLSTM + sliding-window attention token mixers.

The student of "Effective Distillation to Hybrid xLSTM Architectures" (Hauzenberger et al.,
arXiv 2603.15590) replaces each attention layer of a pretrained decoder by a hybrid mixer: a
global mLSTM (:func:`jaxlib_ext.pallas_kernels.mlstm.mlstm`, linear memory) and sliding-window
softmax attention with sink tokens (SWA, local and exact), combined per head by a learned gate
and read out by the teacher's output projection. With ``x [B, T, dim]`` and the teacher's
projections (copied by :func:`from_teacher`)::

    q, k, v   = RoPE(W_q x), RoPE(W_k x), W_v x                  (grouped-query heads)
    y_swa     = softmax attention of q over the keys in the window and the sink tokens
    phi_h(z)  = softmax(z W_h + b_h)                         (over the feature axis, head h)
    y_mlstm   = mLSTM(phi_q(q), phi_k(k), v, i~, f~)
    i~, f~    = cap(W_i x + b_i), cap(W_f x + b_f)
    y         = W_o( g * y_mlstm + (1 - g) * y_swa )              g in [0, 1] per head

The feature maps ``phi_q`` (one per query head) and ``phi_k`` (one per key/value head) are
learnable head-wise maps with a softmax over the feature axis, as in the paper after Hedgehog
(Zhang et al., arXiv 2402.04347); they start at ``W_h = I``, ``b_h = 0`` (Hedgehog's
initialisation: ``phi_h(z) = softmax(z)``). Only the mLSTM reads the mapped q, k; the SWA
branch reads the rotated q, k themselves. ``feature_map="none"`` is the ablation without maps
(``y_mlstm = mLSTM(q, k, v, i~, f~)``).

The paper's exact gating formula, window and number of sinks are not public; this module
implements the form ``g = sigmoid(W_g x + b_g)`` per head by default and makes the rest
configurable (:class:`XLSTMConfig`): ``gate="head"`` (data-dependent, one value per head),
``"channel"`` (data-dependent, one per head and channel), ``"static"`` (a learned constant per
head), ``"attention"`` (``g = 0``: the SWA branch alone, the weight-transfer check), the window
(default 512) and the sinks (default 4, the first tokens of the sequence). ``mode="mlstm"`` is a
pure-mLSTM student (no attention at all: ``y = W_o y_mlstm``).

Choices where the paper is silent, and why:
- The mLSTM reads the same (rotated) q, k, v as the attention, the key/value heads repeated to
  the query heads after their feature map (``mlstm_rope=False`` feeds the maps the un-rotated
  q, k instead). Its normaliser ``max(|n^T q|, 1)`` keeps ``y_mlstm`` a weighted average of
  values like ``y_swa``, so no extra norm sits before the shared ``W_o``.
- A feature map is ``softmax(z W_h + b_h)`` of width ``D`` with a bias (as Hedgehog's
  ``Linear``), not the two-sided map of Hedgehog's reference code (a softmax over
  ``[u, -u]``, ``u = z W_h + b_h``, of width ``2 D``): the mLSTM state keeps the teacher's head
  width. It is computed in float32 and handed to the mLSTM in the dtype of q, k.
- With the feature maps the mLSTM's query scale is 1, not its default ``D ** -0.5``: softmax
  features are non-negative and sum to 1, so ``phi(k)^T phi(q)`` lies in ``[0, 1]`` already
  and Hedgehog's linear attention divides by no ``sqrt(D)``; a further ``D ** -0.5`` would
  only shrink ``n^T q`` below the normaliser's floor of 1. (``feature_map="none"`` keeps the
  default scale.) Even at scale 1, ``n_t^T q_t = sum_{s <= t} F_st i_s phi(k_s)^T phi(q_t)``
  (``F_st`` the product of the forget gates after ``s``) is of order ``t / D`` early in a
  sequence (near-uniform features, forget gates near 1, ``i_s`` near 1), so the
  floor ``max(|n^T q|, 1)`` dominates for the first ``~ D / exp(b_i)`` tokens and shrinks
  ``y_mlstm`` there; the trained input-gate bias ``b_i`` (initialised to
  :attr:`XLSTMConfig.input_gate_bias_init`) scales ``n^T q`` by ``exp(b_i)``, and no other
  parameter is added for it.
- The feature maps and their biases carry ``weight_decay=False`` metadata
  (:func:`jaxlib_ext.optim.recipes.decay_mask`): decay would pull ``W_h`` towards 0, that is
  towards uniform features under which all keys look alike, not towards the identity they
  start at.
- The mLSTM gate pre-activations are soft-capped ``c tanh(x / c)`` with ``c = 15`` as in
  xLSTM 7B (arXiv 2503.13427); the forget-gate biases start at ``linspace(3, 6)`` over heads
  (forget gates near 1: long memory from the start), the input-gate biases at 0.

Interface: the token-mixer protocol of :mod:`~jaxlib_ext.models.registry`,
``mixer(x [B, T, dim], cache=None) -> (y [B, T, dim], cache)``, so a student replaces
``block.attn`` of a Llama :class:`~jaxlib_ext.models.LanguageModel` (:mod:`~jaxlib_ext.models.
llama`; :func:`student_from_teacher`). The tokens are positions ``0 .. T-1`` of a fresh
sequence, or follow the ``cache.length`` cached ones: they set the RoPE angles, and the window
and the sinks count them.
Decoding keeps constant memory: an :class:`XLSTMCache` holds the mLSTM state, the sink tokens'
keys/values and a ring buffer of the last ``window`` keys/values, whatever the position.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxlib_ext.models._saved_methods import read_saved_methods
from jaxlib_ext.models.attention import Attention, AttentionConfig, attention
from jaxlib_ext.models.layers import apply_rope, dense_init
from jaxlib_ext.pallas_kernels import SUPPORTED_CHUNK_SIZES
from jaxlib_ext.pallas_kernels.mlstm import METHODS as MLSTM_METHODS
from jaxlib_ext.pallas_kernels.mlstm import XLA_FORMS as MLSTM_XLA_FORMS
from jaxlib_ext.pallas_kernels.mlstm import MLSTMState, mlstm, zero_state

__all__ = [
    "MODES",
    "GATES",
    "FEATURE_MAPS",
    "XLSTMConfig",
    "XLSTMCache",
    "XLSTMMixer",
    "sliding_window_mask",
    "softmax_feature_map",
    "from_teacher",
    "student_from_teacher",
]

#: Student kinds: the hybrid mixer, or the mLSTM alone.
MODES = ("hybrid", "mlstm")
#: Gate forms of the hybrid mixer (module docstring).
GATES = ("head", "channel", "static", "attention")
#: Feature maps of the mLSTM's q and k: head-wise softmax maps, or none (module docstring).
FEATURE_MAPS = ("softmax", "none")


@dataclasses.dataclass(frozen=True)
class XLSTMConfig:
    """The student's own settings (the attention geometry is the teacher's
    :class:`~jaxlib_ext.models.attention.AttentionConfig`).

    On sequences of at most ``window`` tokens the SWA branch alone is the teacher's attention,
    so a hybrid can match the teacher there by closing its gate; distillation has to see
    sequences longer than the window for the mLSTM to learn anything.

    Attributes:
      mode: a kind of :data:`MODES`, ``"hybrid"`` (default) or ``"mlstm"``.
      window: SWA window in tokens, an int ``>= max(1, n_sinks)`` (query ``t`` reads
        ``t - window < s <= t``; default 512).
      n_sinks: the first tokens every query reads, an int ``>= 0`` (0 for none; default 4).
      gate: a form of :data:`GATES` (default ``"head"``).
      gate_bias_init: the gate's initial pre-activation bias (``0``: ``g = 1/2``).
      mlstm_rope: whether the mLSTM's feature maps read rotated q, k (default True).
      feature_map: the map of the mLSTM's q and k, a kind of :data:`FEATURE_MAPS`:
        ``"softmax"`` (default; learnable head-wise ``softmax(z W_h + b_h)``, query scale 1,
        arXiv 2402.04347) or ``"none"`` (q, k as they are, query scale ``D ** -0.5``).
      gate_soft_cap: ``c`` of ``c tanh(x / c)`` on the mLSTM gate pre-activations, positive
        (``None``: uncapped; default 15).
      input_gate_bias_init: the initial input-gate bias of every head (default 0).
      forget_gate_bias_init: ``(first, last)`` of a linspace of forget-gate biases over heads
        (default ``(3, 6)``); stored as a tuple of floats.
      method: the mLSTM op's path on full sequences, one of
        :data:`jaxlib_ext.pallas_kernels.mlstm.METHODS`, ``"auto" | "reference" | "xla"``
        (default ``"auto"``).
      xla_form: the form of the ``"xla"`` method, one of
        :data:`jaxlib_ext.pallas_kernels.mlstm.XLA_FORMS`, ``"chunk" | "parallel"`` (default
        ``"chunk"``).
      chunk_size: the mLSTM op's chunk size, one of
        :data:`jaxlib_ext.pallas_kernels.SUPPORTED_CHUNK_SIZES` (default 64).
      decode_recurrent_max_len: cached calls of at most this many tokens run the mLSTM's
        ``"reference"`` path (the recurrence), an int ``>= 0`` (default 64).

    Raises:
      ValueError: if a field is out of range or not one of its choices.

    References:
      Hauzenberger et al., Effective Distillation to Hybrid xLSTM Architectures,
      arXiv 2603.15590.
    """

    mode: str = "hybrid"
    window: int = 512
    n_sinks: int = 4
    gate: str = "head"
    gate_bias_init: float = 0.0
    mlstm_rope: bool = True
    feature_map: str = "softmax"
    gate_soft_cap: float | None = 15.0
    input_gate_bias_init: float = 0.0
    forget_gate_bias_init: tuple[float, float] = (3.0, 6.0)
    method: str = "auto"
    xla_form: str = "chunk"
    chunk_size: int = 64
    decode_recurrent_max_len: int = 64

    def __post_init__(self):
        if self.mode not in MODES:
            raise ValueError(f"XLSTMConfig.mode must be one of {MODES}, got {self.mode!r}")
        if self.gate not in GATES:
            raise ValueError(f"XLSTMConfig.gate must be one of {GATES}, got {self.gate!r}")
        if self.feature_map not in FEATURE_MAPS:
            raise ValueError(f"XLSTMConfig.feature_map must be one of {FEATURE_MAPS}, "
                             f"got {self.feature_map!r}")
        for name, low in (("window", 1), ("n_sinks", 0), ("decode_recurrent_max_len", 0)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < low:
                raise ValueError(f"XLSTMConfig.{name} must be an int >= {low}, got {value!r}")
        if self.window < self.n_sinks:
            raise ValueError(f"XLSTMConfig.window ({self.window}) must be at least n_sinks "
                             f"({self.n_sinks})")
        if self.gate_soft_cap is not None and not self.gate_soft_cap > 0:
            raise ValueError(
                f"XLSTMConfig.gate_soft_cap must be positive or None, got {self.gate_soft_cap}"
            )
        if self.method not in MLSTM_METHODS:
            raise ValueError(
                f"XLSTMConfig.method must be one of {MLSTM_METHODS}, got {self.method!r}"
            )
        if self.xla_form not in MLSTM_XLA_FORMS:
            raise ValueError(
                f"XLSTMConfig.xla_form must be one of {MLSTM_XLA_FORMS}, got {self.xla_form!r}"
            )
        if self.chunk_size not in SUPPORTED_CHUNK_SIZES:
            raise ValueError(
                f"XLSTMConfig.chunk_size must be one of {SUPPORTED_CHUNK_SIZES}, "
                f"got {self.chunk_size!r}"
            )
        if len(self.forget_gate_bias_init) != 2:
            raise ValueError(
                "XLSTMConfig.forget_gate_bias_init must be (first, last), got "
                f"{self.forget_gate_bias_init!r}"
            )
        # a tuple of floats whatever came (a JSON list): the config stays hashable
        bias = tuple(float(b) for b in self.forget_gate_bias_init)
        object.__setattr__(self, "forget_gate_bias_init", bias)

    def to_dict(self) -> dict:
        """The fields as a JSON-ready dict."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d) -> XLSTMConfig:
        """The config of a :meth:`to_dict` dict (``d``: field names to values).

        A saved dict may carry the mLSTM op's per-op method names (``"recurrent" |
        "parallel" | "chunk"``); they are read as ``"reference"``, or ``"xla"`` in that
        ``xla_form`` (:func:`~jaxlib_ext.models._saved_methods.read_saved_methods`).
        """
        return cls(**read_saved_methods(d))


class XLSTMCache(NamedTuple):
    """Decode state of one :class:`XLSTMMixer`, of a size that does not grow with position.

    The four key/value buffers are ``None`` for a pure-mLSTM student.

    Attributes:
      mlstm: the mLSTM state ``(C [B, H, D, D], n [B, H, D], m [B, H])``.
      sink_k: ``[B, n_sinks, Hkv, D]`` keys (rotated) of the first tokens.
      sink_v: ``[B, n_sinks, Hkv, D]`` values of the first tokens.
      window_k: ``[B, window, Hkv, D]`` keys (rotated), a ring buffer (token ``s`` in slot
        ``s mod window``).
      window_v: ``[B, window, Hkv, D]`` values, the same ring buffer.
      length: tokens consumed (int32 scalar).
    """

    mlstm: MLSTMState
    sink_k: jax.Array | None
    sink_v: jax.Array | None
    window_k: jax.Array | None
    window_v: jax.Array | None
    length: jax.Array


def sliding_window_mask(query_index, key_index, key_valid, *, window: int, n_sinks: int):
    """The sliding-window mask with sink tokens.

    Query token ``t`` reads key token ``s`` when the key is valid, ``s <= t`` and ``s`` is a
    sink (``s < n_sinks``) or in the window (``s > t - window``).

    Args:
      query_index: ``[T]`` token indices of the queries.
      key_index: ``[S]`` token indices of the keys.
      key_valid: ``bool[S]``, False for key slots that hold no token.
      window: the window in tokens.
      n_sinks: the number of first tokens every query reads.

    Returns:
      ``bool[T, S]``, True where query ``t`` may read key ``s``.
    """
    t = query_index[:, None]
    s = key_index[None, :]
    return key_valid[None, :] & (s <= t) & ((s < n_sinks) | (s > t - window))


def softmax_feature_map(x: jax.Array, weight: jax.Array, bias: jax.Array) -> jax.Array:
    """Head-wise softmax feature maps ``phi_h(x) = softmax(x W_h + b_h)`` (arXiv 2402.04347).

    The softmax runs over the feature axis, in float32: every feature vector is non-negative
    and sums to 1.

    Args:
      x: ``[B, T, H, D]`` queries or keys.
      weight: ``[H, D, E]``, one matrix per head.
      bias: ``[H, E]``, one vector per head.

    Returns:
      ``[B, T, H, E]`` features in ``x.dtype``.
    """
    z = jnp.einsum("bthd,hde->bthe", x.astype(jnp.float32), weight.astype(jnp.float32))
    return jax.nn.softmax(z + bias.astype(jnp.float32), axis=-1).astype(x.dtype)


def _linear(i, o, axes, rngs, *, bias=None):
    """``nnx.Linear`` with ``N(0, 0.02)`` kernel; ``bias`` (an array of shape ``[o]``) adds a
    bias initialised to it."""
    lin = nnx.Linear(
        i, o, use_bias=bias is not None, kernel_init=dense_init,
        kernel_metadata={"logical_axes": axes}, rngs=rngs,
    )
    if bias is not None:
        lin.bias.set_value(jnp.asarray(bias, jnp.float32))
    return lin


class XLSTMMixer(nnx.Module):
    """The student token mixer (module docstring) over the teacher's attention geometry ``cfg``
    at model width ``d_model``.

    Parameters: ``qkv`` and ``out``, the layout of the teacher's
    :class:`~jaxlib_ext.models.attention.Attention` (``dim -> (H + 2 Hkv) D`` and ``H D ->
    dim``; copies of the teacher's by :func:`from_teacher`), ``i_proj``, ``f_proj`` (``dim ->
    H``, with bias: the mLSTM gate pre-activations), with ``feature_map="softmax"`` the feature
    maps ``phi_q [H, D, D]``, ``phi_q_bias [H, D]`` (one per query head) and ``phi_k [Hkv, D,
    D]``, ``phi_k_bias [Hkv, D]`` (one per key/value head), initialised to the identity and
    zero (:func:`softmax_feature_map`), and by gate form ``g_proj`` (``dim -> H``, ``"head"``;
    ``dim -> H*D``, ``"channel"``) or ``g_bias [H]`` (``"static"``).

    ``__call__(x [B, T, dim], cache=None) -> (y [B, T, dim], cache)``: without a cache the full
    sequence, returning ``None``; with an :class:`XLSTMCache` (from :meth:`init_cache`) the
    tokens after the cached ones, returning the updated cache.

    Args:
      cfg: the teacher's attention geometry (heads, head width, RoPE).
      d_model: the model width ``dim``, a positive int.
      config: the student's own settings; ``None`` means ``XLSTMConfig()``.
      rngs: the parameter initialisation keys.

    Raises:
      TypeError: if ``cfg`` is not an :class:`~jaxlib_ext.models.attention.AttentionConfig`
        or ``config`` not an :class:`XLSTMConfig`.
      ValueError: if ``d_model`` is not a positive int.

    References:
      Hauzenberger et al., Effective Distillation to Hybrid xLSTM Architectures,
      arXiv 2603.15590.
    """

    def __init__(self, cfg: AttentionConfig, d_model: int, config: XLSTMConfig | None = None, *,
                 rngs: nnx.Rngs):
        config = XLSTMConfig() if config is None else config
        if not isinstance(cfg, AttentionConfig):
            raise TypeError(f"cfg must be an AttentionConfig, got {type(cfg).__name__}")
        if isinstance(d_model, bool) or not isinstance(d_model, int) or d_model <= 0:
            raise ValueError(f"d_model must be a positive int, got {d_model!r}")
        if not isinstance(config, XLSTMConfig):
            raise TypeError(f"config must be an XLSTMConfig, got {type(config).__name__}")
        self.cfg = cfg
        self.d_model = d_model
        self.config = config
        dim, h, hkv, d = d_model, cfg.n_heads, cfg.kv_heads, cfg.head_dim
        # q, k and v drawn one after the other, so that the fresh gate parameters below get
        # the same draws whatever the projections' layout
        q, k = (dense_init(rngs.params(), (dim, w), jnp.float32) for w in (h * d, hkv * d))
        self.qkv = nnx.Linear(
            dim, (h + 2 * hkv) * d, use_bias=False,
            kernel_init=lambda key, shape, dtype: jnp.concatenate(
                [q, k, dense_init(key, (dim, hkv * d), dtype)], axis=1),
            kernel_metadata={"logical_axes": ("embed", "heads")}, rngs=rngs)
        self.out = _linear(h * d, dim, ("heads", "embed"), rngs)
        self.i_proj = _linear(dim, h, ("embed", "heads"), rngs,
                              bias=np.full(h, config.input_gate_bias_init))
        self.f_proj = _linear(dim, h, ("embed", "heads"), rngs,
                              bias=np.linspace(*config.forget_gate_bias_init, h))
        if config.feature_map == "softmax":
            for name, heads in (("phi_q", h), ("phi_k", hkv)):
                eye = jnp.broadcast_to(jnp.eye(d, dtype=jnp.float32), (heads, d, d))
                setattr(self, name, nnx.Param(eye, logical_axes=("heads", None, None),
                                              weight_decay=False))
                setattr(self, f"{name}_bias", nnx.Param(
                    jnp.zeros((heads, d), jnp.float32), logical_axes=("heads", None),
                    weight_decay=False))
        hybrid = config.mode == "hybrid"
        if hybrid and config.gate in ("head", "channel"):
            width = h if config.gate == "head" else h * d
            self.g_proj = _linear(dim, width, ("embed", "heads"), rngs,
                                  bias=np.full(width, config.gate_bias_init))
        if hybrid and config.gate == "static":
            self.g_bias = nnx.Param(jnp.full((h,), config.gate_bias_init, jnp.float32),
                                    logical_axes=("heads",), weight_decay=False)

    # -- cache
    def init_cache(self, batch_size: int, max_len: int | None = None,
                   dtype=jnp.float32) -> XLSTMCache:
        """An empty :class:`XLSTMCache` for ``batch_size`` sequences.

        Args:
          batch_size: the number of sequences, a positive int.
          max_len: accepted for the teacher's interface and ignored: the cache has the same
            size at any length.
          dtype: the dtype of the key/value buffers (the mLSTM state is float32).

        Returns:
          An :class:`XLSTMCache` of zeros and ``length = 0``.

        Raises:
          ValueError: if ``batch_size`` is not a positive int.
        """
        if isinstance(batch_size, bool) or not isinstance(batch_size, int | np.integer) \
                or batch_size <= 0:
            raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
        c, cfg = self.config, self.cfg
        d = cfg.head_dim
        state = zero_state(batch_size, cfg.n_heads, d, d, jnp.float32)
        if c.mode == "mlstm":
            return XLSTMCache(state, None, None, None, None, jnp.zeros((), jnp.int32))
        sink, ring = (batch_size, c.n_sinks, cfg.kv_heads, d), (batch_size, c.window,
                                                                  cfg.kv_heads, d)
        # four distinct buffers, so that a jitted step may donate the cache
        return XLSTMCache(state, jnp.zeros(sink, dtype), jnp.zeros(sink, dtype),
                          jnp.zeros(ring, dtype), jnp.zeros(ring, dtype),
                          jnp.zeros((), jnp.int32))

    # -- forward
    def __call__(self, x: jax.Array, cache: XLSTMCache | None = None):
        """Mixes the tokens of ``x``, after the cached ones if any.

        Args:
          x: ``[B, T, dim]`` floating inputs.
          cache: an :class:`XLSTMCache` of earlier tokens (:meth:`init_cache`), or ``None``
            for a fresh sequence.

        Returns:
          ``(y [B, T, dim], cache)``: the updated cache, or ``None`` without one.

        Raises:
          ValueError: if ``x`` is not a floating ``[B, T, dim]`` array, or ``cache`` is not an
            :class:`XLSTMCache` of this batch, window, sinks and mode.
        """
        self._check(x, cache)
        c, cfg = self.config, self.cfg
        b, t, _ = x.shape
        h, hkv, d = cfg.n_heads, cfg.kv_heads, cfg.head_dim
        qkv = self.qkv(x)
        q = qkv[..., : h * d].reshape(b, t, h, d)
        k = qkv[..., h * d : (h + hkv) * d].reshape(b, t, hkv, d)
        v = qkv[..., (h + hkv) * d :].reshape(b, t, hkv, d)
        start = jnp.zeros((), jnp.int32) if cache is None else cache.length
        positions = start + jnp.arange(t, dtype=jnp.int32)
        rope = dict(theta=cfg.rope_theta, convention=cfg.rope_convention)
        qr, kr = apply_rope(q, positions, **rope), apply_rope(k, positions, **rope)

        y_mlstm, state = self._mlstm(x, *((qr, kr) if c.mlstm_rope else (q, k)), v, cache)
        if c.mode == "mlstm":
            out, new_cache = y_mlstm, None
            if cache is not None:
                new_cache = cache._replace(mlstm=state, length=cache.length + t)
        else:
            y_swa, new_cache = self._swa(qr, kr, v, cache)
            if new_cache is not None:
                new_cache = new_cache._replace(mlstm=state)
            out = self._combine(x, y_mlstm, y_swa)
        return self.out(out.reshape(b, t, h * d)), new_cache

    def _mlstm(self, x, q, k, v, cache):
        """The mLSTM branch on q ``[B, T, H, D]``, k, v ``[B, T, Hkv, D]``, after the cached
        state if any: ``(y [B, T, H, D], state)`` (``state`` ``None`` without a cache)."""
        c = self.config
        scale = None
        if c.feature_map == "softmax":
            q = softmax_feature_map(q, self.phi_q[...], self.phi_q_bias[...])
            k = softmax_feature_map(k, self.phi_k[...], self.phi_k_bias[...])
            scale = 1.0
        groups = self.cfg.n_heads // self.cfg.kv_heads
        k, v = jnp.repeat(k, groups, axis=2), jnp.repeat(v, groups, axis=2)
        i_gate = self._cap(self.i_proj(x).astype(jnp.float32))
        f_gate = self._cap(self.f_proj(x).astype(jnp.float32))
        cached = cache is not None
        method = c.method
        if cached and x.shape[1] <= c.decode_recurrent_max_len:
            method = "reference"
        y, state = mlstm(
            q, k, v, i_gate, f_gate, scale=scale,
            initial_state=cache.mlstm if cached else None, output_final_state=cached,
            method=method, xla_form=c.xla_form, chunk_size=c.chunk_size,
        )
        return y, state

    def _cap(self, x):
        cap = self.config.gate_soft_cap
        return x if cap is None else cap * jnp.tanh(x / cap)

    def _swa(self, q, k, v, cache):
        """Sliding-window attention with sinks over the new and the cached tokens."""
        c = self.config
        t = q.shape[1]
        if cache is None:
            index = jnp.arange(t)
            mask = sliding_window_mask(index, index, jnp.ones((t,), bool), window=c.window,
                                       n_sinks=c.n_sinks)
            return attention(q, k, v, mask), None
        start = cache.length
        new_index = start + jnp.arange(t)
        sink_index = jnp.arange(c.n_sinks)
        slot = jnp.arange(c.window)
        ring_index = start - 1 - jnp.mod(start - 1 - slot, c.window)  # newest token in each slot
        keys_index = jnp.concatenate([sink_index, ring_index, new_index])
        valid = jnp.concatenate([
            sink_index < start,  # written
            (ring_index >= 0) & (ring_index >= c.n_sinks),  # written, not a sink (read above)
            jnp.ones((t,), bool),
        ])
        mask = sliding_window_mask(new_index, keys_index, valid, window=c.window,
                                   n_sinks=c.n_sinks)
        dt = q.dtype
        keys = jnp.concatenate([cache.sink_k.astype(dt), cache.window_k.astype(dt), k], axis=1)
        values = jnp.concatenate([cache.sink_v.astype(dt), cache.window_v.astype(dt), v], axis=1)
        y = attention(q, keys, values, mask)

        # the new tokens that are sinks, and the last `window` new tokens into their ring slots
        sink_slot = jnp.where(new_index < c.n_sinks, new_index, c.n_sinks)  # out of range: drop
        sink_k = cache.sink_k.at[:, sink_slot].set(k.astype(cache.sink_k.dtype), mode="drop")
        sink_v = cache.sink_v.at[:, sink_slot].set(v.astype(cache.sink_v.dtype), mode="drop")
        keep = min(t, c.window)
        ring_slot = jnp.mod(new_index[t - keep :], c.window)
        window_k = cache.window_k.at[:, ring_slot].set(
            k[:, t - keep :].astype(cache.window_k.dtype))
        window_v = cache.window_v.at[:, ring_slot].set(
            v[:, t - keep :].astype(cache.window_v.dtype))
        return y, XLSTMCache(cache.mlstm, sink_k, sink_v, window_k, window_v, start + t)

    def _combine(self, x, y_mlstm, y_swa):
        gate = self.config.gate
        if gate == "attention":
            return y_swa
        b, t, h, d = y_swa.shape
        if gate == "static":
            g = jax.nn.sigmoid(self.g_bias[...])[:, None]
        elif gate == "head":
            g = jax.nn.sigmoid(self.g_proj(x).astype(jnp.float32)).reshape(b, t, h, 1)
        else:
            g = jax.nn.sigmoid(self.g_proj(x).astype(jnp.float32)).reshape(b, t, h, d)
        out = g * y_mlstm.astype(jnp.float32) + (1.0 - g) * y_swa.astype(jnp.float32)
        return out.astype(y_swa.dtype)

    def _check(self, x, cache):
        name = type(self).__name__
        dim = self.d_model
        if not hasattr(x, "ndim") or x.ndim != 3 or x.shape[-1] != dim:
            raise ValueError(f"{name}: x must be [B, T, dim={dim}], got "
                             f"{getattr(x, 'shape', type(x).__name__)}")
        if not jnp.issubdtype(x.dtype, jnp.floating):
            raise ValueError(f"{name}: x must have a floating dtype, got {x.dtype}")
        if cache is None:
            return
        if not isinstance(cache, XLSTMCache):
            raise ValueError(f"{name}: cache must be an XLSTMCache (init_cache), got "
                             f"{type(cache).__name__}")
        if cache.mlstm.C.shape[0] != x.shape[0]:
            raise ValueError(f"{name}: cache batch {cache.mlstm.C.shape[0]} != x batch "
                             f"{x.shape[0]}")
        hybrid = self.config.mode == "hybrid"
        if hybrid != (cache.window_k is not None) or (
            hybrid and (cache.window_k.shape[1], cache.sink_k.shape[1])
            != (self.config.window, self.config.n_sinks)
        ):
            raise ValueError(f"{name}: cache was made for another window, sinks or mode")


def from_teacher(attention: Attention, config: XLSTMConfig | None = None,
                 rngs: nnx.Rngs | None = None) -> XLSTMMixer:
    """A student mixer initialised from a teacher attention layer (arXiv 2603.15590).

    The student has copies of the teacher's ``qkv`` and ``out`` projections and fresh mLSTM
    gate, feature-map (``phi_q``, ``phi_k``, ``phi_q_bias``, ``phi_k_bias``) and mixing-gate
    parameters.

    Args:
      attention: the teacher's :class:`~jaxlib_ext.models.attention.Attention`; it is not
        changed.
      config: the student's settings; ``None`` means ``XLSTMConfig()``.
      rngs: the keys of the fresh parameters (required).

    Returns:
      The :class:`XLSTMMixer`.

    Raises:
      ValueError: if ``rngs`` is ``None`` or ``attention`` is not an ``Attention``.

    References:
      Hauzenberger et al., Effective Distillation to Hybrid xLSTM Architectures,
      arXiv 2603.15590.
    """
    if rngs is None:
        raise ValueError("rngs: from_teacher draws the new gate parameters and needs an nnx.Rngs")
    if not isinstance(attention, Attention):
        raise ValueError(f"attention: expected an Attention mixer (the teacher's "
                         f"blocks[i].attn), got {type(attention).__name__}")
    student = XLSTMMixer(attention.cfg, attention.d_model, config, rngs=rngs)
    student.qkv, student.out = nnx.clone(attention.qkv), nnx.clone(attention.out)
    return student


def student_from_teacher(teacher, config: XLSTMConfig | None = None, *, rngs: nnx.Rngs,
                         layers=None):
    """A copy of a teacher LM with :func:`from_teacher` students in place of its attention.

    Embeddings, norms, MLPs and the remaining layers are copies of the teacher's. The teacher
    is not changed.

    Args:
      teacher: a Llama :class:`~jaxlib_ext.models.LanguageModel`.
      config: the students' settings; ``None`` means ``XLSTMConfig()``.
      rngs: the keys of the students' fresh parameters.
      layers: the block indices to replace, ints in ``[0, n_layers)``; ``None`` means all.

    Returns:
      The student :class:`~jaxlib_ext.models.LanguageModel`.

    Raises:
      ValueError: if an index of ``layers`` is out of range, or as :func:`from_teacher`.

    References:
      Hauzenberger et al., Effective Distillation to Hybrid xLSTM Architectures,
      arXiv 2603.15590.
    """
    n = len(teacher.blocks)
    chosen = range(n) if layers is None else list(layers)
    for i in chosen:
        if isinstance(i, bool) or not isinstance(i, int | np.integer) or not 0 <= i < n:
            raise ValueError(f"layers: expected block indices in [0, {n}), got {i!r}")
    student = nnx.clone(teacher)
    for i in chosen:
        student.blocks[i].attn = from_teacher(teacher.blocks[i].attn, config, rngs)
    return student
