"""mLSTM cell (xLSTM, arXiv 2405.04517) as a pure JAX op.

``mlstm`` validates its arguments and dispatches on ``method``, one of :data:`METHODS` (the
library's vocabulary less ``"pallas"``: the op has no Pallas kernels), behind the same
signature:

- ``"reference"``: :func:`jaxlib_ext.pallas_kernels.mlstm.reference.mlstm_recurrent`, the
  stabilised step-by-step ``lax.scan`` (the ground truth);
- ``"xla"``: the XLA fast path in the form ``xla_form``, one of :data:`XLA_FORMS`:

  - ``"chunk"`` (the default): :func:`jaxlib_ext.pallas_kernels.mlstm.chunk.mlstm_chunk`, the
    chunkwise form (inter-chunk state scan, parallel form inside each chunk);
  - ``"parallel"``: :func:`jaxlib_ext.pallas_kernels.mlstm.parallel.mlstm_parallel`, the
    quadratic stabilised form (``T x T`` per head);

- ``"auto"``: ``"xla"`` (``_common.resolve_auto`` for an op without Pallas kernels).
"""

from __future__ import annotations

import jax

from jaxlib_ext.pallas_kernels._common import METHODS as _ALL_METHODS
from jaxlib_ext.pallas_kernels._common import (
    check_array,
    check_chunk_size,
    check_form,
    check_method,
    check_shape,
    check_token_layout,
    resolve_auto,
    resolve_scale,
)
from jaxlib_ext.pallas_kernels.mlstm.chunk import mlstm_chunk
from jaxlib_ext.pallas_kernels.mlstm.parallel import mlstm_block, mlstm_parallel
from jaxlib_ext.pallas_kernels.mlstm.reference import MLSTMState, mlstm_recurrent, zero_state

__all__ = [
    "METHODS",
    "XLA_FORMS",
    "MLSTMState",
    "mlstm",
    "mlstm_block",
    "mlstm_chunk",
    "mlstm_parallel",
    "mlstm_recurrent",
    "zero_state",
]

#: The methods :func:`mlstm` offers: :data:`jaxlib_ext.pallas_kernels.METHODS` without
#: ``"pallas"`` (``"auto"`` is ``"xla"``).
METHODS: tuple[str, ...] = tuple(m for m in _ALL_METHODS if m != "pallas")

#: The forms of :func:`mlstm`'s ``"xla"`` method (``xla_form``); the first is the default.
XLA_FORMS: tuple[str, ...] = ("chunk", "parallel")

_recurrent_jit = jax.jit(mlstm_recurrent, static_argnames=("output_final_state",))
_parallel_jit = jax.jit(mlstm_parallel, static_argnames=("output_final_state",))
_chunk_jit = jax.jit(mlstm_chunk, static_argnames=("output_final_state", "chunk_size"))


def _validate(q, k, v, i_gate, f_gate, initial_state):
    B, _, H, K, V = check_token_layout(q, v, {"k": k}, {"i_gate": i_gate, "f_gate": f_gate})
    if initial_state is None:
        return K
    if not isinstance(initial_state, (tuple, list)) or len(initial_state) != 3:
        raise ValueError(
            "initial_state must be an MLSTMState or a 3-tuple (C [B, H, K, V], n [B, H, K], "
            f"m [B, H]), got {type(initial_state).__name__}"
        )
    layouts = (("C", (B, H, K, V), "[B, H, K, V]"), ("n", (B, H, K), "[B, H, K]"),
               ("m", (B, H), "[B, H]"))
    for x, (name, shape, layout) in zip(initial_state, layouts):
        check_array(f"initial_state.{name}", x, len(shape), layout)
        check_shape(f"initial_state.{name}", x, shape, layout)
    return K


def mlstm(
    q,
    k,
    v,
    i_gate,
    f_gate,
    *,
    scale=None,
    initial_state=None,
    output_final_state=False,
    method="auto",
    xla_form="chunk",
    chunk_size=64,
):
    """mLSTM over a sequence (Beck et al., arXiv 2405.04517), stabilised.

    Per batch and head, with ``i_t = exp(i_gate_t)``, ``f_t = sigmoid(f_gate_t)`` (taken in log
    space) and ``q^_t = scale q_t``, the un-stabilised recurrence is::

        C_t = f_t C_{t-1} + i_t k_t v_t^T
        n_t = f_t n_{t-1} + i_t k_t
        h_t = C_t^T q^_t / max(|n_t^T q^_t|, 1)

    computed in the stabilised form with a running max state ``m`` (``C`` and ``n`` kept in
    units of ``exp(m)``, denominator ``max(|n_t^T q^_t|, exp(-m_t))``;
    :mod:`~jaxlib_ext.pallas_kernels.mlstm.reference`), so input-gate pre-activations far above
    float32's ``exp`` range do not overflow.

    Args:
      q, k: ``[B, T, H, K]`` queries and keys.
      v: ``[B, T, H, V]`` values.
      i_gate, f_gate: ``[B, T, H]`` input- and forget-gate pre-activations.
      scale: query scale, default ``K ** -0.5``.
      initial_state: an :class:`MLSTMState` ``(C [B, H, K, V], n [B, H, K], m [B, H])`` in
        stabilised units (as returned by ``output_final_state=True``); ``None`` means zeros.
      output_final_state: also return the state after step ``T``.
      method: ``"auto" | "reference" | "xla"`` (:data:`METHODS`; no ``"pallas"``).
      xla_form: the form of ``"xla"``, ``"chunk" | "parallel"`` (:data:`XLA_FORMS`; default
        ``"chunk"``); the other methods ignore it.
      chunk_size: one of 16, 32, 64, 128 (``xla_form="chunk"`` only); ``None`` means 64.

    Returns:
      ``(h, final_state)``: ``h`` ``[B, T, H, V]`` in ``q.dtype``; ``final_state`` an
      :class:`MLSTMState` in float32 (float64 when inputs are float64), or ``None``.

    Raises:
      ValueError: wrong ranks or shapes, non-floating dtypes, a malformed ``initial_state``,
        non-finite ``scale``, unsupported ``chunk_size``, unknown ``method`` (``"pallas"``
        included) or ``xla_form`` (the message names the argument).
    """
    method = check_method(method, METHODS, op="mlstm")
    xla_form = check_form("xla_form", xla_form, XLA_FORMS)
    chunk_size = check_chunk_size(chunk_size) or 64
    K = _validate(q, k, v, i_gate, f_gate, initial_state)
    scale = resolve_scale(scale, K)
    if initial_state is not None:
        initial_state = MLSTMState(*initial_state)
    kw = dict(scale=scale, initial_state=initial_state, output_final_state=bool(output_final_state))
    method = resolve_auto(method)
    if method == "reference":
        return _recurrent_jit(q, k, v, i_gate, f_gate, **kw)
    if xla_form == "parallel":
        return _parallel_jit(q, k, v, i_gate, f_gate, **kw)
    return _chunk_jit(q, k, v, i_gate, f_gate, chunk_size=chunk_size, **kw)
