"""Momentum delta rule, the plain recurrence (a ``lax.scan`` over time).

Momentum DeltaNet, Huang et al., arXiv 2605.05838.
Per batch, head and step ``t`` with states ``S_t, M_t`` of shape ``[K, V]``::

    w_t = S_{t-1}^T p_t - v_t                 (1)  residual at the old memory
    M_t = mu_t M_{t-1} + eta_t k_t w_t^T      (2)  momentum of the delta-rule gradient
    S_t = alpha_t S_{t-1} - beta_t M_t        (3)  decay, then step along the new momentum
    o_t = S_t^T (scale * q_t)                 (4)  read the new memory

with ``alpha = exp(log_alpha)`` and ``mu = exp(log_mu)``. This module is the ground truth the
chunkwise and Pallas paths are tested against; it does no argument validation (the public op in
``jaxlib_ext.pallas_kernels.mdn`` does).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxlib_ext.pallas_kernels._common import compute_dtype, like_varying, resolve_scale


def momentum_delta_rule_recurrent(
    q,
    k,
    v,
    p,
    log_alpha,
    log_mu,
    beta,
    eta,
    *,
    scale=None,
    initial_state=None,
    output_final_state=False,
):
    """Step-by-step momentum delta rule, eqs. (1)-(4) above.

    Args:
      q, k, p: ``[B, T, H, K]``. v: ``[B, T, H, V]``.
      log_alpha, log_mu, beta, eta: ``[B, T, H]``.
      scale: query scale; ``None`` means ``K ** -0.5``.
      initial_state: ``[2, B, H, K, V]`` holding ``(S_0, M_0)``, or ``None`` for zeros.
      output_final_state: also return ``(S_T, M_T)`` stacked as ``[2, B, H, K, V]``.

    Returns:
      ``(o, final_state)``: ``o`` ``[B, T, H, V]`` in ``q.dtype``; ``final_state`` in the compute
      dtype (float32, or float64 when any input is float64), or ``None``.
    """
    dt = compute_dtype(q, k, v, p, log_alpha, log_mu, beta, eta, initial_state)
    B, T, H, K = q.shape
    V = v.shape[-1]
    scale = resolve_scale(scale, K)

    def time_major(x):
        return jnp.moveaxis(jnp.asarray(x).astype(dt), 1, 0)  # [T, B, H, ...]

    qs = time_major(q) * jnp.asarray(scale, dt)
    ks, vs, ps = time_major(k), time_major(v), time_major(p)
    alpha = jnp.exp(time_major(log_alpha))[..., None, None]
    mu = jnp.exp(time_major(log_mu))[..., None, None]
    bt = time_major(beta)[..., None, None]
    et = time_major(eta)[..., None]

    if initial_state is None:
        S0 = jnp.zeros((B, H, K, V), dt)
        M0 = jnp.zeros((B, H, K, V), dt)
    else:
        S0 = initial_state[0].astype(dt)
        M0 = initial_state[1].astype(dt)
    # under shard_map the carry takes the inputs' varying axes, as the body's outputs do
    S0, M0 = like_varying((S0, M0), q, k, v, p, log_alpha, log_mu, beta, eta)

    def step(carry, xs):
        S, M = carry
        q_t, k_t, v_t, p_t, a_t, m_t, b_t, e_t = xs
        w = jnp.einsum("bhkv,bhk->bhv", S, p_t) - v_t  # (1)
        M = m_t * M + (e_t * k_t)[..., :, None] * w[..., None, :]  # (2)
        S = a_t * S - b_t * M  # (3)
        o = jnp.einsum("bhkv,bhk->bhv", S, q_t)  # (4)
        return (S, M), o

    (S, M), o = jax.lax.scan(step, (S0, M0), (qs, ks, vs, ps, alpha, mu, bt, et))
    o = jnp.moveaxis(o, 0, 1).astype(q.dtype)
    final = jnp.stack([S, M]) if output_final_state else None
    return o, final
