"""Gated delta rule (Gated DeltaNet, arXiv 2412.06464) as a pure JAX op: the MDN baseline.

``gated_delta_rule`` validates its arguments and dispatches on ``method``, one of
:data:`METHODS` (the library's vocabulary, every one offered): ``"reference"`` (the ``lax.scan``
recurrence), ``"xla"`` (the chunkwise WY form, the op's one XLA form), ``"pallas"``
(:func:`gated_delta_rule_pallas`, the momentum delta rule's Pallas kernels at ``mu = 0``,
``eta = 1``, ``p = alpha * k``; loaded on first use, interpreted on CPU) and ``"auto"``
(``_common.resolve_auto``: the Pallas kernels on a GPU backend when they import, else
``"xla"``).
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
from jaxlib_ext.pallas_kernels.gated_delta.chunk import gated_delta_rule_chunk
from jaxlib_ext.pallas_kernels.gated_delta.reference import gated_delta_rule_recurrent

__all__ = [
    "METHODS",
    "gated_delta_rule",
    "gated_delta_rule_chunk",
    "gated_delta_rule_pallas",
    "gated_delta_rule_recurrent",
]

# The Pallas entry point, (module, name): what ``"auto"`` picks on a GPU when it imports.
_KERNEL = ("jaxlib_ext.pallas_kernels.gated_delta.pallas", "gated_delta_rule_pallas")

_recurrent_jit = jax.jit(gated_delta_rule_recurrent, static_argnames=("output_final_state",))
_chunk_jit = jax.jit(gated_delta_rule_chunk, static_argnames=("output_final_state", "chunk_size"))


def _validate(q, k, v, g, beta, initial_state):
    gates = {"g": g, "beta": beta}
    _, _, _, K, _ = check_token_layout(
        q, v, {"k": k}, gates, initial_state, ("B", "H", "K", "V")
    )
    check_nonnegative("beta", beta)
    return K


def gated_delta_rule(
    q,
    k,
    v,
    g,
    beta,
    *,
    scale=None,
    initial_state=None,
    output_final_state=False,
    method="auto",
    chunk_size=None,
):
    """Gated delta rule over a sequence (Yang et al., arXiv 2412.06464).

    Per batch, head and step, with memory ``S`` ``[K, V]`` and ``alpha = exp(g)``::

        S_t = alpha_t S_{t-1} + beta_t k_t (v_t - alpha_t S_{t-1}^T k_t)^T
        o_t = S_t^T (scale * q_t)

    (decay first, then the delta-rule write; no normalisation inside the op). Equals
    ``momentum_delta_rule`` at ``log_mu = -inf``, ``eta = 1``, ``p = alpha * k``.

    Args:
      q, k: ``[B, T, H, K]``; v: ``[B, T, H, V]``; g (``log alpha``), beta: ``[B, T, H]``,
        ``beta >= 0`` (checked when concrete).
      scale: query scale, default ``K ** -0.5``.
      initial_state: ``[B, H, K, V]`` or ``None`` (zeros).
      output_final_state: also return ``S_T`` ``[B, H, K, V]``.
      method: ``"auto" | "reference" | "xla" | "pallas"`` (:data:`METHODS`).
      chunk_size: one of 16, 32, 64, 128 (``"xla"`` and ``"pallas"``; compiled Pallas kernels
        with float32 inputs and K > 64 take 16 or 32 and raise otherwise). ``None``: 64, or 32
        where the compiled Pallas kernels need it (``_common.default_chunk_size``).

    Returns:
      ``(o, final_state)``: ``o`` in ``q.dtype``; ``final_state`` float32 (float64 for float64
      inputs) or ``None``.

    Raises:
      ValueError: bad ranks, shapes or dtypes, negative ``beta``, unsupported ``chunk_size``,
        unknown ``method`` (the message names the argument).
    """
    method = check_method(method, METHODS, op="gated_delta_rule")
    chunk_size = check_chunk_size(chunk_size)
    K = _validate(q, k, v, g, beta, initial_state)
    scale = resolve_scale(scale, K)
    output_final_state = bool(output_final_state)
    method = resolve_auto(method, kernel=_KERNEL)
    if chunk_size is None:
        chunk_size = default_chunk_size(method, q.dtype, K)
    kwargs = dict(scale=scale, initial_state=initial_state, output_final_state=output_final_state)

    if method == "reference":
        return _recurrent_jit(q, k, v, g, beta, **kwargs)
    if method == "xla":
        return _chunk_jit(q, k, v, g, beta, chunk_size=chunk_size, **kwargs)
    from jaxlib_ext.pallas_kernels.gated_delta.pallas import gated_delta_rule_pallas
    from jaxlib_ext.pallas_kernels.mdn.config import MDNKernelConfig

    config = MDNKernelConfig(interpret=None)  # interpreted where the backend is not a GPU
    return gated_delta_rule_pallas(q, k, v, g, beta, chunk_size=chunk_size, config=config, **kwargs)


__getattr__ = lazy_attributes(__name__, {_KERNEL[1]: _KERNEL[0]})
