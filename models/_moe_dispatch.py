"""Routing and dropless dispatch of a mixture-of-experts layer, as pure functions.

Router (DeepSeek-V3 style sigmoid router with an aux-loss-free correction bias, arXiv
2412.19437 Section 2.1.2, as used by LatentMoE, arXiv 2601.18089)::

    s   = sigmoid(x W_r)                     (float32 or wider, full-width x)
    sel = top_k(s + b)                       (b: correction bias, selection only)
    w   = s[sel] / (sum s[sel] + 1e-20)      (when normalised)
    w   = routed_scaling * w

Experts: non-gated squared ReLU ``E_e(z) = relu(z W1_e)^2 W2_e`` with ``W1 [E, l, m]``,
``W2 [E, m, l]``; the routed output is ``y = sum_{e in sel} w_e E_e(z)``.

Dispatch (dropless; no capacity, no token is dropped), by ``method``, one of
:data:`jaxlib_ext.pallas_kernels.METHODS`:

* ``"xla"`` / ``"pallas"`` / ``"auto"``: the ``T * k`` (token, expert) pairs are sorted by
  expert (a stable ``argsort``), giving the expert group sizes; the token rows are gathered in
  that order, both expert matmuls are grouped matmuls
  (:func:`jaxlib_ext.pallas_kernels.moe.gmm` with the same ``method``: ``"xla"`` its XLA path,
  ``jax.lax.ragged_dot`` on GPU/TPU and a tiled form on CPU; ``"pallas"`` the Pallas kernel;
  ``"auto"`` the op's rule), the rows are scaled by their weight, put back in (token, slot)
  order by the inverse permutation and summed over the ``k`` slots.
* ``"reference"``: every expert on every token, combined with the ``[T, E]`` matrix holding
  the weights of the selected experts and zeros elsewhere (the dense masked dispatch, the
  reference of the tests; ``E / k`` times the routed FLOPs).

Ties in the scores are broken by ``jax.lax.top_k`` (the lower expert index first), so the
selection is a deterministic function of the scores and every dispatch sees the same one.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

__all__ = [
    "Routing",
    "dispatch",
    "dispatch_dense",
    "dispatch_sorted",
    "expert_counts",
    "route",
    "router_bias_update",
    "sort_by_expert",
]

class Routing(NamedTuple):
    """The router's decision for ``T`` tokens.

    Attributes:
      experts: ``int32[T, k]`` selected experts (by decreasing biased score).
      weights: ``[T, k]`` their combination weights (router dtype, float32 or wider).
      scores: ``[T, E]`` the unbiased sigmoid scores.
    """

    experts: jax.Array
    weights: jax.Array
    scores: jax.Array


def route(x, router_kernel, bias, *, top_k: int, normalize: bool = True, scaling: float = 1.0):
    """Sigmoid top-k routing with a selection-only correction bias (module docstring).

    The router runs in ``float32`` (``float64`` for float64 inputs).

    Args:
      x: ``[T, d]`` tokens (full model width).
      router_kernel: ``[d, E]``.
      bias: ``[E]`` correction bias, added to the scores for the selection only.
      top_k: experts per token.
      normalize: divide the selected scores by their sum.
      scaling: the routed scaling factor multiplying the weights.

    Returns:
      The :class:`Routing` of the tokens.

    References:
      DeepSeek-AI, DeepSeek-V3 Technical Report, arXiv 2412.19437 (Section 2.1.2).
    """
    dtype = jnp.promote_types(x.dtype, jnp.float32)
    logits = jnp.dot(x.astype(dtype), router_kernel.astype(dtype), precision=lax.Precision.HIGHEST)
    scores = jax.nn.sigmoid(logits)
    _, experts = lax.top_k(scores + bias.astype(dtype), top_k)
    weights = jnp.take_along_axis(scores, experts, axis=-1)
    if normalize:
        weights = weights / (jnp.sum(weights, axis=-1, keepdims=True) + 1e-20)
    return Routing(experts.astype(jnp.int32), weights * scaling, scores)


def expert_counts(experts, num_experts: int):
    """How many (token, slot) pairs each expert received.

    Args:
      experts: ``int[T, k]`` selected experts (any shape; it is flattened).
      num_experts: the number of experts ``E``; indices outside ``[0, E)`` are dropped.

    Returns:
      ``float32[E]`` counts.
    """
    flat = experts.reshape(-1)
    return jnp.zeros((num_experts,), jnp.float32).at[flat].add(1.0, mode="drop")


def router_bias_update(bias, counts, rate):
    """Aux-loss-free balancing step (arXiv 2412.19437 Section 2.1.2).

    Every expert's bias moves by ``rate`` towards balance, ``b_e + rate * sign(mean(c) - c_e)``
    (up when the expert got fewer than the average number of tokens, down when more). A pure
    function of the loads.

    Args:
      bias: ``[E]`` correction bias.
      counts: ``[E]`` per-expert counts (:func:`expert_counts`).
      rate: the step size.

    Returns:
      The updated bias, ``[E]`` in ``bias``'s dtype.

    References:
      DeepSeek-AI, DeepSeek-V3 Technical Report, arXiv 2412.19437 (Section 2.1.2).
    """
    counts = counts.astype(jnp.float32)
    return bias + rate * jnp.sign(jnp.mean(counts) - counts).astype(bias.dtype)


def _experts_dense(z, w1, w2):
    h = jnp.einsum("tl,elm->tem", z, w1, precision=lax.Precision.HIGHEST)
    h = jnp.square(jax.nn.relu(h))
    return jnp.einsum("tem,eml->tel", h, w2, precision=lax.Precision.HIGHEST)


def dispatch_dense(z, routing: Routing, w1, w2):
    """Every expert on every token, masked by the selection (the reference).

    Args:
      z: ``[T, l]`` expert inputs.
      routing: the tokens' :class:`Routing`.
      w1: ``[E, l, m]`` first expert weights.
      w2: ``[E, m, l]`` second expert weights.

    Returns:
      ``[T, l]`` routed output.
    """
    num_experts = w1.shape[0]
    combine = jnp.zeros((z.shape[0], num_experts), routing.weights.dtype)
    combine = combine.at[jnp.arange(z.shape[0])[:, None], routing.experts].add(routing.weights)
    y = _experts_dense(z, w1, w2)
    return jnp.einsum("te,tel->tl", combine.astype(y.dtype), y, precision=lax.Precision.HIGHEST)


def sort_by_expert(experts, num_experts: int):
    """Sort the flattened ``(token, slot)`` pairs by expert.

    Args:
      experts: ``int[T, k]`` selected experts.
      num_experts: the number of experts ``E``.

    Returns:
      ``(order, inverse, group_sizes)``: ``order [T k]`` (pair indices in expert order,
      stable), its inverse permutation and ``int32[E]`` pairs per expert.
    """
    flat = experts.reshape(-1)
    order = jnp.argsort(flat, stable=True)
    inverse = jnp.zeros_like(order).at[order].set(jnp.arange(order.shape[0], dtype=order.dtype))
    sizes = jnp.zeros((num_experts,), jnp.int32).at[flat].add(1, mode="drop")
    return order, inverse, sizes


def grouped_experts(rows, group_sizes, w1, w2, *, method: str, config=None):
    """``relu(rows W1_g)^2 W2_g`` for rows grouped by expert; rows past the sum give zeros.

    Args:
      rows: ``[N, l]`` rows sorted by expert.
      group_sizes: ``int32[E]`` rows per expert.
      w1: ``[E, l, m]`` first expert weights.
      w2: ``[E, m, l]`` second expert weights.
      method: the grouped matmul's method, one of
        :data:`jaxlib_ext.pallas_kernels.moe.METHODS` (``"xla"``, ``"pallas"``, ``"auto"``;
        ``"reference"`` its loop over groups).
      config: the Pallas grouped matmul's ``GMMKernelConfig``, or ``None``.

    Returns:
      ``[N, l]``.
    """
    from jaxlib_ext.pallas_kernels.moe import gmm

    h = gmm(rows, w1, group_sizes, method=method, config=config)
    h = jnp.square(jax.nn.relu(h))
    return gmm(h, w2, group_sizes, method=method, config=config)


def dispatch_sorted(z, routing: Routing, w1, w2, *, method: str = "xla", config=None):
    """Dropless sorted dispatch with grouped matmuls (module docstring).

    Args:
      z: ``[T, l]`` expert inputs.
      routing: the tokens' :class:`Routing`.
      w1: ``[E, l, m]`` first expert weights.
      w2: ``[E, m, l]`` second expert weights.
      method: the grouped matmuls' method, ``"xla"`` (default), ``"pallas"`` or ``"auto"``
        (:func:`grouped_experts`).
      config: the Pallas grouped matmul's ``GMMKernelConfig``, or ``None``.

    Returns:
      ``[T, l]`` routed output.
    """
    t, k = routing.experts.shape
    order, inverse, sizes = sort_by_expert(routing.experts, w1.shape[0])
    rows = jnp.take(z, order // k, axis=0)
    y = grouped_experts(rows, sizes, w1, w2, method=method, config=config)
    y = y * routing.weights.reshape(-1)[order][:, None].astype(y.dtype)
    return jnp.sum(jnp.take(y, inverse, axis=0).reshape(t, k, -1), axis=1)


def dispatch(z, routing: Routing, w1, w2, *, method: str, config=None):
    """The routed expert output by a method of :data:`jaxlib_ext.pallas_kernels.METHODS`.

    Args:
      z: ``[T, l]`` expert inputs.
      routing: the tokens' :class:`Routing`.
      w1: ``[E, l, m]`` first expert weights.
      w2: ``[E, m, l]`` second expert weights.
      method: ``"reference"`` (:func:`dispatch_dense`), ``"xla"``, ``"pallas"`` or ``"auto"``
        (:func:`dispatch_sorted`).
      config: the Pallas grouped matmul's ``GMMKernelConfig``, or ``None``.

    Returns:
      ``[T, l]`` routed output.
    """
    if method == "reference":
        return dispatch_dense(z, routing, w1, w2)
    return dispatch_sorted(z, routing, w1, w2, method=method, config=config)
