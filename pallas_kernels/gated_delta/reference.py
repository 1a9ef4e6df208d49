"""Gated delta rule, the plain recurrence (a ``lax.scan`` over time).

Gated DeltaNet, Yang, Kautz and Hatamizadeh, arXiv 2412.06464; used as the baseline of Momentum
DeltaNet (arXiv 2605.05838). Per batch, head and step,
with memory ``S_t`` of shape ``[K, V]`` and ``alpha_t = exp(g_t)``::

    S'_t = alpha_t S_{t-1}                              (1)  decay first
    S_t  = S'_t + beta_t k_t (v_t - S'^T_t k_t)^T       (2)  then the delta-rule write
    o_t  = S_t^T (scale * q_t)                          (3)

This equals the momentum delta rule at ``mu = 0, eta = 1, p = alpha * k``. No validation here (the
public op in ``jaxlib_ext.pallas_kernels.gated_delta`` does it).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxlib_ext.pallas_kernels._common import compute_dtype, like_varying, resolve_scale


def gated_delta_rule_recurrent(
    q, k, v, g, beta, *, scale=None, initial_state=None, output_final_state=False
):
    """Step-by-step gated delta rule, eqs. (1)-(3) above.

    Args:
      q, k: ``[B, T, H, K]``; v: ``[B, T, H, V]``; g (``log alpha``), beta: ``[B, T, H]``.
      scale: query scale; ``None`` means ``K ** -0.5``.
      initial_state: ``[B, H, K, V]`` or ``None`` for zeros.
      output_final_state: also return ``S_T`` (``[B, H, K, V]``).

    Returns:
      ``(o, final_state)``: ``o`` ``[B, T, H, V]`` in ``q.dtype``; ``final_state`` float32
      (float64 when any input is float64) or ``None``.
    """
    dt = compute_dtype(q, k, v, g, beta, initial_state)
    B, T, H, K = q.shape
    V = v.shape[-1]
    scale = resolve_scale(scale, K)

    def time_major(x):
        return jnp.moveaxis(jnp.asarray(x).astype(dt), 1, 0)

    qs = time_major(q) * jnp.asarray(scale, dt)
    ks, vs = time_major(k), time_major(v)
    alpha = jnp.exp(time_major(g))[..., None, None]
    bt = time_major(beta)[..., None]
    S0 = jnp.zeros((B, H, K, V), dt) if initial_state is None else initial_state.astype(dt)
    S0 = like_varying(S0, q, k, v, g, beta)  # the scan body's type under shard_map

    def step(S, xs):
        q_t, k_t, v_t, a_t, b_t = xs
        S = a_t * S  # (1)
        u = b_t * (v_t - jnp.einsum("bhkv,bhk->bhv", S, k_t))
        S = S + k_t[..., :, None] * u[..., None, :]  # (2)
        return S, jnp.einsum("bhkv,bhk->bhv", S, q_t)  # (3)

    S, o = jax.lax.scan(step, S0, (qs, ks, vs, alpha, bt))
    o = jnp.moveaxis(o, 0, 1).astype(q.dtype)
    return o, (S if output_final_state else None)
