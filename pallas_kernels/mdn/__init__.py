"""Momentum delta rule (Momentum DeltaNet, arXiv 2605.05838) as a pure JAX op.

``momentum_delta_rule`` validates its arguments and dispatches on ``method``, one of
:data:`METHODS` (the library's vocabulary, every one offered), behind the same signature:

- ``"reference"``: :func:`jaxlib_ext.pallas_kernels.mdn.reference.momentum_delta_rule_recurrent`,
  the step-by-step ``lax.scan`` (the ground truth).
- ``"xla"``: :func:`jaxlib_ext.pallas_kernels.mdn.chunk.momentum_delta_rule_chunk`, the
  chunkwise-parallel form (eqs. (5)-(11)), rematerialised per chunk (the op's one XLA form).
- ``"pallas"``: :func:`momentum_delta_rule_pallas` (``mdn/pallas.py``, loaded on first use;
  interpreted on CPU), tuned by an ``MDNKernelConfig``.
- ``"auto"``: ``_common.resolve_auto``: the Pallas kernels on a GPU backend when they import,
  otherwise ``"xla"``.

``momentum_delta_rule_pallas`` and ``MDNKernelConfig`` are importable from here without loading
the Pallas modules until first use.
"""

from __future__ import annotations

import jax

from jaxlib_ext.pallas_kernels._common import (
    METHODS,
    check_chunk_size,
    check_method,
    check_nonnegative,
    check_token_layout,
    default_chunk_size,
    lazy_attributes,
    resolve_auto,
    resolve_scale,
)
from jaxlib_ext.pallas_kernels.mdn.chunk import momentum_delta_rule_chunk
from jaxlib_ext.pallas_kernels.mdn.reference import momentum_delta_rule_recurrent

__all__ = [
    "METHODS",
    "MDNKernelConfig",
    "momentum_delta_rule",
    "momentum_delta_rule_chunk",
    "momentum_delta_rule_pallas",
    "momentum_delta_rule_recurrent",
]

# The Pallas entry point, (module, name): what ``"auto"`` picks on a GPU when it imports.
_KERNEL = ("jaxlib_ext.pallas_kernels.mdn.pallas", "momentum_delta_rule_pallas")
__getattr__ = lazy_attributes(__name__, {
    "momentum_delta_rule_pallas": _KERNEL[0],
    "MDNKernelConfig": "jaxlib_ext.pallas_kernels.mdn.config",
})

_recurrent_jit = jax.jit(momentum_delta_rule_recurrent, static_argnames=("output_final_state",))
_chunk_jit = jax.jit(
    momentum_delta_rule_chunk, static_argnames=("output_final_state", "chunk_size")
)


def _validate(q, k, v, p, log_alpha, log_mu, beta, eta, initial_state):
    gates = {"log_alpha": log_alpha, "log_mu": log_mu, "beta": beta, "eta": eta}
    _, _, _, K, _ = check_token_layout(
        q, v, {"k": k, "p": p}, gates, initial_state, ("2", "B", "H", "K", "V")
    )
    check_nonnegative("beta", beta)
    return K


def momentum_delta_rule(
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
    method="auto",
    chunk_size=None,
):
    """Momentum delta rule over a sequence (Huang et al., arXiv 2605.05838).

    Per batch, head and step, with memory ``S`` and momentum ``M`` of shape ``[K, V]``::

        w_t = S_{t-1}^T p_t - v_t
        M_t = mu_t M_{t-1} + eta_t k_t w_t^T
        S_t = alpha_t S_{t-1} - beta_t M_t
        o_t = S_t^T (scale * q_t)

    with ``alpha = exp(log_alpha)``, ``mu = exp(log_mu)``. No normalisation happens inside the op
    (a layer L2-normalises ``q, k, p`` and folds ``eta``/``alpha`` in as it sees fit).

    Args:
      q, k, p: ``[B, T, H, K]`` queries, keys and probe keys.
      v: ``[B, T, H, V]`` values.
      log_alpha, log_mu: ``[B, T, H]`` log decays of ``S`` and ``M`` (``-inf`` is allowed and
        means a gate of exactly 0).
      beta: ``[B, T, H]`` step sizes, ``>= 0`` (checked when the array is concrete).
      eta: ``[B, T, H]`` momentum input gains (any sign).
      scale: query scale, default ``K ** -0.5``.
      initial_state: ``[2, B, H, K, V]`` holding ``(S_0, M_0)``; ``None`` means zeros.
      output_final_state: return ``(S_T, M_T)`` as ``[2, B, H, K, V]``.
      method: ``"auto" | "reference" | "xla" | "pallas"`` (:data:`METHODS`).
      chunk_size: one of 16, 32, 64, 128 (``"xla"`` and ``"pallas"``; compiled Pallas
        kernels with float32 inputs and K > 64 take 16 or 32 and raise otherwise). ``None``:
        64, or 32 where the compiled Pallas kernels need it (``_common.default_chunk_size``).

    Returns:
      ``(o, final_state)``: ``o`` ``[B, T, H, V]`` in ``q.dtype``; ``final_state`` float32
      (float64 when inputs are float64) or ``None``.

    Raises:
      ValueError: wrong ranks or shapes, non-floating dtypes, negative ``beta``, unsupported
        ``chunk_size`` or unknown ``method`` (the message names the argument).
    """
    method = check_method(method, METHODS, op="momentum_delta_rule")
    chunk_size = check_chunk_size(chunk_size)
    K = _validate(q, k, v, p, log_alpha, log_mu, beta, eta, initial_state)
    scale = resolve_scale(scale, K)
    output_final_state = bool(output_final_state)
    args = (q, k, v, p, log_alpha, log_mu, beta, eta)

    method = resolve_auto(method, kernel=_KERNEL)
    if chunk_size is None:
        chunk_size = default_chunk_size(method, q.dtype, K)

    if method == "reference":
        return _recurrent_jit(
            *args, scale=scale, initial_state=initial_state, output_final_state=output_final_state
        )
    if method == "xla":
        return _chunk_jit(
            *args,
            scale=scale,
            initial_state=initial_state,
            output_final_state=output_final_state,
            chunk_size=chunk_size,
        )
    from jaxlib_ext.pallas_kernels.mdn.pallas import momentum_delta_rule_pallas

    return momentum_delta_rule_pallas(
        *args,
        scale=scale,
        initial_state=initial_state,
        output_final_state=output_final_state,
        chunk_size=chunk_size,
        config=_pallas_config(),
    )


def _pallas_config():
    """The kernels' defaults, interpreted where the backend is not a GPU."""
    from jaxlib_ext.pallas_kernels.mdn.config import MDNKernelConfig

    return MDNKernelConfig(interpret=None)
