"""Grouped matmuls by plain XLA: the loop over groups (the ground truth) and ``ragged_dot``.

Conventions shared by every path of the op: ``lhs [M, K]`` rows are split into consecutive
groups of ``group_sizes [G]`` rows (group ``g`` takes rows ``[s_g, s_g + n_g)`` with
``s_g = n_0 + ... + n_{g-1}``), ``sum(group_sizes) <= M`` and rows past the sum belong to no
group::

    gmm(lhs, rhs, sizes)[r]   = lhs[r] @ rhs[g(r)]                 ([M, N]; 0 for rows past the sum)
    tgmm(lhs, grad, sizes)[g] = sum_{r in group g} lhs[r]^T grad[r]   ([G, K, N])

``tgmm`` is the gradient of ``gmm`` with respect to ``rhs``; the gradient with respect to
``lhs`` is ``gmm(grad, rhs^T)``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

__all__ = ["gmm_loop", "gmm_ragged_dot", "row_groups", "tgmm_loop", "tgmm_ragged_dot"]


def _acc_dtype(*arrays):
    """float64 when an operand is float64, else float32 (the accumulation dtype)."""
    f64 = any(jnp.dtype(a.dtype) == jnp.float64 for a in arrays)
    return jnp.float64 if f64 else jnp.float32


def row_groups(group_sizes, m: int) -> jax.Array:
    """``[M]`` int32: the group of each row, ``G`` for rows past ``sum(group_sizes)``.

    Args:
      group_sizes: ``int[G]`` rows per group, in row order.
      m: number of rows ``M``.

    Returns:
      The ``int32[M]`` group index of each row.
    """
    ends = jnp.cumsum(group_sizes.astype(jnp.int32))
    return jnp.searchsorted(ends, jnp.arange(m, dtype=jnp.int32), side="right").astype(jnp.int32)


def gmm_loop(lhs, rhs, group_sizes, *, precision=lax.Precision.HIGHEST):
    """``gmm`` as a Python loop over groups: one masked dense matmul per group.

    Args:
      lhs: ``[M, K]`` rows sorted by group.
      rhs: ``[G, K, N]`` per-group weights.
      group_sizes: ``int[G]`` rows per group; rows past their sum give zeros.
      precision: ``lax.Precision`` of the matmuls.

    Returns:
      The ``[M, N]`` products, of ``lhs``'s dtype (accumulated in float32, float64 for float64
      operands).
    """
    acc = _acc_dtype(lhs, rhs)
    groups = row_groups(group_sizes, lhs.shape[0])
    out = jnp.zeros((lhs.shape[0], rhs.shape[2]), acc)
    for g in range(rhs.shape[0]):
        full = jnp.dot(lhs, rhs[g], precision=precision, preferred_element_type=acc)
        out = jnp.where((groups == g)[:, None], full, out)
    return out.astype(lhs.dtype)


def tgmm_loop(lhs, grad, group_sizes, *, precision=lax.Precision.HIGHEST):
    """``tgmm`` as a Python loop over groups: one masked ``lhs^T grad`` per group.

    Args:
      lhs: ``[M, K]`` rows sorted by group.
      grad: ``[M, N]`` output cotangents.
      group_sizes: ``int[G]`` rows per group; rows past their sum contribute to no group.
      precision: ``lax.Precision`` of the matmuls.

    Returns:
      The ``[G, K, N]`` per-group products, of ``lhs``'s dtype.
    """
    acc = _acc_dtype(lhs, grad)
    groups = row_groups(group_sizes, lhs.shape[0])
    outs = []
    for g in range(group_sizes.shape[0]):
        masked = jnp.where((groups == g)[:, None], lhs, jnp.zeros((), lhs.dtype))
        outs.append(jnp.dot(masked.T, grad, precision=precision, preferred_element_type=acc))
    return jnp.stack(outs).astype(lhs.dtype)


def gmm_ragged_dot(lhs, rhs, group_sizes, *, precision=None):
    """``gmm`` by ``jax.lax.ragged_dot`` (XLA's grouped matmul; differentiable).

    Args:
      lhs: ``[M, K]`` rows sorted by group.
      rhs: ``[G, K, N]`` per-group weights.
      group_sizes: ``int[G]`` rows per group.
      precision: ``lax.Precision`` of the product, ``None`` for the default.

    Returns:
      The ``[M, N]`` products, of ``lhs``'s dtype.
    """
    acc = _acc_dtype(lhs, rhs)
    out = lax.ragged_dot(
        lhs, rhs, group_sizes.astype(jnp.int32), precision=precision, preferred_element_type=acc
    )
    return out.astype(lhs.dtype)


def tgmm_ragged_dot(lhs, grad, group_sizes, *, precision=None):
    """``tgmm`` by ``jax.lax.ragged_dot_general`` with the ragged axis contracted.

    Rows past the sum are zeroed first, so they contribute to no group.

    Args:
      lhs: ``[M, K]`` rows sorted by group.
      grad: ``[M, N]`` output cotangents.
      group_sizes: ``int[G]`` rows per group.
      precision: ``lax.Precision`` of the product, ``None`` for the default.

    Returns:
      The ``[G, K, N]`` per-group products, of ``lhs``'s dtype.
    """
    acc = _acc_dtype(lhs, grad)
    sizes = group_sizes.astype(jnp.int32)
    valid = jnp.arange(lhs.shape[0]) < jnp.sum(sizes)
    lhs = jnp.where(valid[:, None], lhs, jnp.zeros((), lhs.dtype))
    dims = lax.RaggedDotDimensionNumbers(
        dot_dimension_numbers=(([0], [0]), ([], [])),
        lhs_ragged_dimensions=[0],
        rhs_group_dimensions=[],
    )
    out = lax.ragged_dot_general(
        lhs, grad, sizes, dims, precision=precision, preferred_element_type=acc
    )
    return out.astype(lhs.dtype)
