"""mLSTM cell, the chunkwise-parallel form (pure JAX), stabilised.

The sequence is cut into chunks of ``L`` steps. Inside chunk ``c`` with chunk-local forget
log-sums ``b_j = sum_{r<=j} lf_r``, ``g = b_L`` and ``a_j = g - b_j + i~_j`` (the log-weight of
step ``j`` at the chunk's end), the state entering the next chunk is (the recurrence (S1)-(S3)
of ``mlstm.reference`` over ``L`` steps at once)::

    A_c   = max_j a_j                                                   (K1)
    m_c   = max(g + m_{c-1}, A_c)                                       (K2)
    C_c   = exp(g + m_{c-1} - m_c) C_{c-1} + exp(A_c - m_c) sum_j exp(a_j - A_c) k_j v_j^T   (K3)
    n_c   = exp(g + m_{c-1} - m_c) n_{c-1} + exp(A_c - m_c) sum_j exp(a_j - A_c) k_j        (K4)

and the outputs of chunk ``c`` are the parallel form (P1)-(P4) of ``mlstm.parallel`` on the
chunk's ``L`` steps from the state entering it. The chunk sums of (K3)/(K4) do not depend on the
entering state and are computed for all chunks at once; the sequential part is a ``lax.scan`` of
elementwise updates over chunks (it keeps one state per chunk, ``T / L`` states, for the
outputs and the backward pass); the outputs are then computed for all chunks at once.
``m_c`` is the recurrent stabiliser (S1) at the chunk's end (a max over the same log-weights),
so all three forms share one ``m``. A sequence whose length is not a multiple of ``L`` is
padded with steps that change nothing (``lf = 0``, ``i~ = -inf``, zero vectors).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxlib_ext.pallas_kernels._common import (
    chunk_inputs,
    compute_dtype,
    from_chunks,
    like_varying,
    pad_time,
    resolve_scale,
    segsum,
    to_chunks,
)
from jaxlib_ext.pallas_kernels.mlstm.parallel import mlstm_block
from jaxlib_ext.pallas_kernels.mlstm.reference import MLSTMState, cast_state, zero_state


def _chunk_sums(k, v, ig, lf):
    """(K1) and the state-free sums of (K3)/(K4) for every chunk: ``(g, A, KV, Ksum)``."""
    a = segsum(lf)[..., -1, :] + ig  # a_j = sum_{r>j} lf_r + i~_j
    A = jnp.max(a, axis=-1)  # (K1)
    e = jnp.exp(a - A[..., None])
    KV = jnp.einsum("...j,...jk,...jv->...kv", e, k, v)
    Ksum = jnp.einsum("...j,...jk->...k", e, k)
    return jnp.sum(lf, axis=-1), A, KV, Ksum


def _state_step(state: MLSTMState, x):
    """One chunk of (K2)-(K4); emits the state *entering* the chunk."""
    C, n, m = state
    g, A, KV, Ksum = x
    m_new = jnp.maximum(g + m, A)  # (K2)
    decay = jnp.exp(g + m - m_new)
    gain = jnp.exp(A - m_new)
    C_new = decay[..., None, None] * C + gain[..., None, None] * KV  # (K3)
    n_new = decay[..., None] * n + gain[..., None] * Ksum  # (K4)
    return MLSTMState(C_new, n_new, m_new), state


def mlstm_chunk(
    q,
    k,
    v,
    i_gate,
    f_gate,
    *,
    scale=None,
    initial_state=None,
    output_final_state=False,
    chunk_size=64,
):
    """Chunkwise-parallel mLSTM (module docstring, (K1)-(K4) and (P1)-(P4) per chunk).

    Same arguments and results as
    :func:`jaxlib_ext.pallas_kernels.mlstm.reference.mlstm_recurrent`, plus ``chunk_size``. No
    validation (the public op does it).

    Args:
      q, k: ``[B, T, H, K]`` queries and keys.
      v: ``[B, T, H, V]`` values.
      i_gate, f_gate: ``[B, T, H]`` input- and forget-gate pre-activations.
      scale: query scale; ``None`` means ``K ** -0.5``.
      initial_state: an :class:`MLSTMState` (or ``(C, n, m)``), or ``None`` for zeros.
      output_final_state: also return the state after step ``T``.
      chunk_size: chunk length; any positive int works here (the public op allows 16, 32, 64,
        128).

    Returns:
      ``(h, final_state)``: ``h`` ``[B, T, H, V]`` in ``q.dtype``; ``final_state`` an
      :class:`MLSTMState` in the compute dtype (float32, or float64 when any input is float64),
      or ``None``.
    """
    state_arrays = () if initial_state is None else tuple(initial_state)
    dt = compute_dtype(q, k, v, i_gate, f_gate, *state_arrays)
    B, T, H, K = q.shape
    V = v.shape[-1]
    L = int(chunk_size)
    scale = resolve_scale(scale, K)
    qc, kc, vc = chunk_inputs(dt, L, q, k, v)  # [N, B, H, L, ...]
    qc = qc * jnp.asarray(scale, dt)
    ig = jnp.asarray(i_gate).astype(dt)
    ig = jnp.pad(ig, ((0, 0), (0, (-T) % L), (0, 0)), constant_values=-jnp.inf)
    igc = to_chunks(ig, L)
    lfc = to_chunks(pad_time(jax.nn.log_sigmoid(jnp.asarray(f_gate).astype(dt)), L), L)

    state0 = zero_state(B, H, K, V, dt) if initial_state is None else cast_state(initial_state, dt)
    sums = _chunk_sums(kc, vc, igc, lfc)
    state0 = like_varying(state0, sums)  # the scan body's type under shard_map
    final, entering = jax.lax.scan(_state_step, state0, sums)
    h, _ = mlstm_block(qc, kc, vc, igc, lfc, entering, final_state=False)
    return from_chunks(h, T).astype(q.dtype), (final if output_final_state else None)
