"""Gated delta rule on the momentum delta rule's Pallas kernels.

Gated DeltaNet (arXiv 2412.06464) is the momentum delta rule (Momentum DeltaNet, arXiv
2605.05838, eqs. (1)-(4) of ``mdn.reference``) with ``mu = 0``, ``eta = 1`` and
``p = alpha * k``: then ``M_t = k_t (alpha_t S_{t-1}^T k_t - v_t)^T`` and
``S_t = alpha_t S_{t-1} + beta_t k_t (v_t - alpha_t S_{t-1}^T k_t)^T``, eqs. (1)-(2) of
``gated_delta.reference``. The momentum entering the sequence is zero; the one leaving it is
dropped. Gradients flow through ``p = alpha * k`` by ordinary autodiff around the kernels' VJP.

``mu = 0`` is passed as ``log_mu = MU_ZERO_LOG`` rather than ``-inf``: ``exp(MU_ZERO_LOG)`` is
exactly 0 in float32 and bfloat16, while ``-inf`` would give ``-inf - (-inf) = nan`` in the
kernels' differences of cumulative log-gates.
"""

from __future__ import annotations

import jax.numpy as jnp

from jaxlib_ext.pallas_kernels.mdn.pallas import momentum_delta_rule_pallas

__all__ = ["gated_delta_rule_pallas"]

MU_ZERO_LOG = -1.0e4  # exp(-1e4) underflows to exactly 0 in float32


def gated_delta_rule_pallas(
    q, k, v, g, beta, *, scale, initial_state=None, output_final_state=False, chunk_size=64,
    config=None,
):  # fmt: skip
    """Gated delta rule, chunkwise, in the Pallas kernels of the momentum delta rule.

    Args:
      q, k: ``[B, T, H, K]``; v: ``[B, T, H, V]``; g (``log alpha``), beta: ``[B, T, H]``.
      scale: query scale (a Python float).
      initial_state: ``[B, H, K, V]`` or ``None`` (zeros).
      output_final_state: also return ``S_T`` ``[B, H, K, V]`` (float32).
      chunk_size, config: as for :func:`~jaxlib_ext.pallas_kernels.mdn.momentum_delta_rule_pallas`.

    Returns:
      ``(o, final_state)``: ``o`` ``[B, T, H, V]`` in ``q.dtype``; ``final_state`` or ``None``.
    """
    g32 = g.astype(jnp.float32)
    p = (jnp.exp(g32)[..., None] * k.astype(jnp.float32)).astype(k.dtype)
    log_mu = jnp.full(g.shape, MU_ZERO_LOG, jnp.float32)
    eta = jnp.ones(g.shape, jnp.float32)
    state = None
    if initial_state is not None:
        s0 = initial_state.astype(jnp.float32)
        state = jnp.stack([s0, jnp.zeros_like(s0)])  # (S_0, M_0 = 0)
    o, final = momentum_delta_rule_pallas(
        q, k, v, p, g32, log_mu, beta, eta,
        scale=scale,
        initial_state=state,
        output_final_state=output_final_state,
        chunk_size=chunk_size,
        config=config,
    )  # fmt: skip
    return o, (final[0] if output_final_state else None)
