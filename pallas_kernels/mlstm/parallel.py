"""mLSTM cell, the quadratic parallel form (pure JAX), stabilised.

Unrolling (M1)-(M3) of ``mlstm.reference`` from an entering state ``(C_0, n_0, m_0)`` (stabilised,
un-stabilised memory ``exp(m_0) C_0``) with ``F_t = sum_{r<=t} lf_r``::

    log D_ts = sum_{r=s+1}^{t} lf_r + i~_s   (s <= t, else -inf)   (P1)  decay times input gate
    w_t      = F_t + m_0                                         (P2)  the entering state's
    m_t      = max(w_t, max_s log D_ts)                          (P3)  the stabiliser of (S1)
    num_t    = exp(w_t - m_t) C_0^T q^_t + sum_s exp(log D_ts - m_t) (q^_t . k_s) v_s
    den_t    = max(|exp(w_t - m_t) n_0 . q^_t + sum_s exp(log D_ts - m_t) (q^_t . k_s)|, exp(-m_t))
    h_t      = num_t / den_t                                            (P4)

``m_t`` is the recurrent stabiliser (S1) itself (the max of every log-weight reaching step
``t``), so the output is (S4) exactly and the state after the last step is
``C_T = exp(w_T - m_T) C_0 + sum_s exp(log D_Ts - m_T) k_s v_s^T`` (``n_T`` likewise) with
``m_T`` as in (P3). The segment sums of (P1) are built without subtracting prefix sums
(:func:`~jaxlib_ext.pallas_kernels._common.segsum`). ``T x T`` memory and ``T^2 (K + V)`` work per
head: the form for short sequences, and the intra-chunk block of the chunkwise form
(``mlstm.chunk``), which calls :func:`mlstm_block` on every chunk at once.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxlib_ext.pallas_kernels._common import compute_dtype, resolve_scale, segsum
from jaxlib_ext.pallas_kernels.mlstm.reference import MLSTMState, cast_state, zero_state


def mlstm_block(qs, k, v, ig, lf, state: MLSTMState, *, final_state: bool = True):
    """(P1)-(P4) on one block of ``L`` steps, batched over any leading axes ``...``.

    Args:
      qs, k: ``[..., L, K]`` (``qs`` already scaled). v: ``[..., L, V]``.
      ig, lf: ``[..., L]`` input-gate pre-activations and forget-gate log values (``ig = -inf``
        and ``lf = 0`` make a step that changes nothing: the chunk form's time padding).
      state: the entering :class:`MLSTMState`, with leading axes ``...``.
      final_state: also return the state after the block.

    Returns:
      ``(h [..., L, V], state after the block or None)``, in the inputs' dtype.
    """
    C0, n0, m0 = state
    logD = segsum(lf) + ig[..., None, :]  # (P1)
    w = jnp.cumsum(lf, axis=-1) + m0[..., None]  # (P2)
    m = jnp.maximum(w, jnp.max(logD, axis=-1))  # (P3)
    D = jnp.exp(logD - m[..., None])
    inter = jnp.exp(w - m)
    S = jnp.einsum("...tk,...sk->...ts", qs, k) * D
    num = inter[..., None] * jnp.einsum("...tk,...kv->...tv", qs, C0) + jnp.einsum(
        "...ts,...sv->...tv", S, v
    )
    dot = inter * jnp.einsum("...tk,...k->...t", qs, n0) + jnp.sum(S, axis=-1)
    h = num / jnp.maximum(jnp.abs(dot), jnp.exp(-m))[..., None]  # (P4)
    if not final_state:
        return h, None
    m_end = m[..., -1]
    w_end = jnp.exp(w[..., -1] - m_end)
    d_end = D[..., -1, :]  # exp(log D_Ts - m_T)
    C = w_end[..., None, None] * C0 + jnp.einsum("...s,...sk,...sv->...kv", d_end, k, v)
    n = w_end[..., None] * n0 + jnp.einsum("...s,...sk->...k", d_end, k)
    return h, MLSTMState(C, n, m_end)


def mlstm_parallel(
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
    """Quadratic parallel mLSTM, (P1)-(P4) over the whole sequence.

    Same arguments and results as
    :func:`jaxlib_ext.pallas_kernels.mlstm.reference.mlstm_recurrent`. No validation (the
    public op does it).

    Args:
      q, k: ``[B, T, H, K]`` queries and keys.
      v: ``[B, T, H, V]`` values.
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

    def head_major(x):
        return jnp.moveaxis(jnp.asarray(x).astype(dt), 2, 1)  # [B, H, T, ...]

    qs = head_major(q) * jnp.asarray(scale, dt)
    ks, vs = head_major(k), head_major(v)
    ig = jnp.swapaxes(jnp.asarray(i_gate).astype(dt), 1, 2)
    lf = jax.nn.log_sigmoid(jnp.swapaxes(jnp.asarray(f_gate).astype(dt), 1, 2))
    state0 = zero_state(B, H, K, V, dt) if initial_state is None else cast_state(initial_state, dt)
    h, final = mlstm_block(qs, ks, vs, ig, lf, state0, final_state=bool(output_final_state))
    return jnp.moveaxis(h, 1, 2).astype(q.dtype), final
