"""mLSTM cell, the plain stabilised recurrence (a ``lax.scan`` over time).

The matrix-memory LSTM of xLSTM (Beck et al., arXiv 2405.04517, the mLSTM cell), with an
exponential input gate and a sigmoid forget gate. Un-stabilised, per batch, head and step ``t``
with ``q_t, k_t`` in ``R^K``, ``v_t`` in ``R^V``, ``i_t = exp(i~_t)``, ``f_t = sigmoid(f~_t)``::

    C_t = f_t C_{t-1} + i_t k_t v_t^T                     (M1)  C: [K, V]
    n_t = f_t n_{t-1} + i_t k_t                           (M2)  n: [K]
    h_t = C_t^T q^_t / max(|n_t^T q^_t|, 1),   q^_t = scale q_t   (M3)

``exp(i~)`` overflows float32 beyond ``i~ ~ 88``, so the state is kept in units of a running
log-scale ``m`` (the xLSTM paper's stabiliser), with ``lf_t = log sigmoid(f~_t)``::

    m_t  = max(lf_t + m_{t-1}, i~_t)                      (S1)
    f'_t = exp(lf_t + m_{t-1} - m_t),  i'_t = exp(i~_t - m_t)   (S2)
    C_t  = f'_t C_{t-1} + i'_t k_t v_t^T,  n_t = f'_t n_{t-1} + i'_t k_t   (S3)
    h_t  = C_t^T q^_t / max(|n_t^T q^_t|, exp(-m_t))      (S4)

The stabilised ``(C_t, n_t)`` are the un-stabilised ones times ``exp(-m_t)``, so (S4) is (M3)
exactly: the lower bound ``exp(-m_t)`` is the bound ``1`` in stabilised units. No epsilon is
added to the denominator (``exp(-m_t) > 0`` already keeps it positive), so the stabilised and
un-stabilised forms agree to rounding. The zero state is ``C = 0, n = 0, m = 0``.

This module is the ground truth the parallel and chunkwise forms are tested against; it does
no argument validation (the public op in ``jaxlib_ext.pallas_kernels.mlstm`` does).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from jaxlib_ext.pallas_kernels._common import compute_dtype, like_varying, resolve_scale


class MLSTMState(NamedTuple):
    """Stabilised mLSTM state: ``C [B, H, K, V]``, ``n [B, H, K]``, ``m [B, H]``.

    The un-stabilised memory is ``exp(m) C`` and ``exp(m) n`` (module docstring, (S1)-(S4)).
    """

    C: jax.Array
    n: jax.Array
    m: jax.Array


def zero_state(batch: int, heads: int, key_dim: int, value_dim: int, dtype=jnp.float32):
    """The initial state ``C = 0, n = 0, m = 0``.

    Args:
      batch: ``B``.
      heads: ``H``.
      key_dim: ``K``.
      value_dim: ``V``.
      dtype: dtype of the three arrays.

    Returns:
      An :class:`MLSTMState` with ``C`` ``[B, H, K, V]``, ``n`` ``[B, H, K]`` and ``m`` ``[B, H]``.
    """
    return MLSTMState(
        jnp.zeros((batch, heads, key_dim, value_dim), dtype),
        jnp.zeros((batch, heads, key_dim), dtype),
        jnp.zeros((batch, heads), dtype),
    )


def cast_state(state, dtype) -> MLSTMState:
    """``state`` as an :class:`MLSTMState` in ``dtype``.

    Args:
      state: any 3-sequence ``(C, n, m)`` of arrays.
      dtype: the target dtype.

    Returns:
      The :class:`MLSTMState` ``(C, n, m)``, each cast to ``dtype``.
    """
    C, n, m = state
    return MLSTMState(C.astype(dtype), n.astype(dtype), m.astype(dtype))


def mlstm_recurrent(
    q,
    k,
    v,
    i_gate,
    f_gate,
    *,
    scale=None,
    initial_state=None,
    output_final_state=False,
):
    """Step-by-step stabilised mLSTM, (S1)-(S4) of the module docstring.

    Args:
      q, k: ``[B, T, H, K]``. v: ``[B, T, H, V]``.
      i_gate, f_gate: ``[B, T, H]`` input- and forget-gate pre-activations.
      scale: query scale; ``None`` means ``K ** -0.5``.
      initial_state: an :class:`MLSTMState` (or ``(C, n, m)``), or ``None`` for zeros.
      output_final_state: also return the state after step ``T``.

    Returns:
      ``(h, final_state)``: ``h`` ``[B, T, H, V]`` in ``q.dtype``; ``final_state`` an
      :class:`MLSTMState` in the compute dtype (float32, or float64 when any input is float64),
      or ``None``.
    """
    state_arrays = () if initial_state is None else tuple(initial_state)
    dt = compute_dtype(q, k, v, i_gate, f_gate, *state_arrays)
    B, T, H, K = q.shape
    V = v.shape[-1]
    scale = resolve_scale(scale, K)

    def time_major(x):
        return jnp.moveaxis(jnp.asarray(x).astype(dt), 1, 0)  # [T, B, H, ...]

    qs = time_major(q) * jnp.asarray(scale, dt)
    ks, vs = time_major(k), time_major(v)
    ig = time_major(i_gate)
    lf = jax.nn.log_sigmoid(time_major(f_gate))
    state0 = zero_state(B, H, K, V, dt) if initial_state is None else cast_state(initial_state, dt)
    state0 = like_varying(state0, q, k, v, i_gate, f_gate)  # the scan body's type (shard_map)

    def step(state, xs):
        C, n, m = state
        q_t, k_t, v_t, i_t, lf_t = xs
        m_new = jnp.maximum(lf_t + m, i_t)  # (S1)
        f_s = jnp.exp(lf_t + m - m_new)  # (S2)
        i_s = jnp.exp(i_t - m_new)
        C = f_s[..., None, None] * C + (i_s[..., None] * k_t)[..., :, None] * v_t[..., None, :]
        n = f_s[..., None] * n + i_s[..., None] * k_t  # (S3)
        num = jnp.einsum("bhkv,bhk->bhv", C, q_t)
        den = jnp.maximum(jnp.abs(jnp.einsum("bhk,bhk->bh", n, q_t)), jnp.exp(-m_new))  # (S4)
        return MLSTMState(C, n, m_new), num / den[..., None]

    final, h = jax.lax.scan(step, state0, (qs, ks, vs, ig, lf))
    h = jnp.moveaxis(h, 0, 1).astype(q.dtype)
    return h, (final if output_final_state else None)
