"""Grouped matrix multiplication for mixture-of-experts dispatch, as pure JAX ops.

``gmm(lhs, rhs, group_sizes)`` multiplies consecutive row groups of ``lhs [M, K]`` by their own
matrix of ``rhs [G, K, N]`` (the contract of ``jax.lax.ragged_dot``); ``tgmm(lhs, grad,
group_sizes)`` is its per-group weight gradient ``[G, K, N]``. ``group_sizes [G]`` is integer,
sums to at most ``M``; rows past the sum belong to no group (``gmm`` gives them zeros, ``tgmm``
ignores them). Both take ``method``, one of :data:`METHODS` (the library's vocabulary, every
one offered):

- ``"reference"``: the Python loops over groups :func:`gmm_loop` / :func:`tgmm_loop`
  (``reference.py``), one masked dense matmul per group at ``Precision.HIGHEST``: the ground
  truth of the tests, ``G`` times the work.
- ``"xla"``: :func:`gmm_xla` / :func:`tgmm_xla`, plain XLA differentiable by JAX's own rules:
  ``jax.lax.ragged_dot`` / ``ragged_dot_general`` (``reference.gmm_ragged_dot``,
  ``reference.tgmm_ragged_dot``) on GPU and TPU, whose compilers have grouped-matmul kernels
  for them; on CPU, whose ``ragged_dot`` lowering computes every group on every row (``G``
  times the work), the tiled work-item form ``tiled.gmm_tiled`` / ``tiled.tgmm_tiled``.
- ``"pallas"``: :func:`gmm_pallas` / :func:`tgmm_pallas` (``moe/pallas.py``, loaded on first
  use; interpreted on CPU), tiled over group boundaries, tuned by a :class:`GMMKernelConfig`,
  each differentiable through a ``custom_vjp`` built from the two kernels.
- ``"auto"``: ``_common.resolve_auto``: the Pallas kernels on a GPU backend for 16-bit and
  float32 operands (Triton has no float64 dot), otherwise ``"xla"``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from jaxlib_ext.pallas_kernels._common import (
    METHODS,
    check_method,
    is_concrete,
    lazy_attributes,
    resolve_auto,
)
from jaxlib_ext.pallas_kernels.moe.reference import (
    gmm_loop,
    gmm_ragged_dot,
    tgmm_loop,
    tgmm_ragged_dot,
)
from jaxlib_ext.pallas_kernels.moe.tiled import gmm_tiled, tgmm_tiled

__all__ = [
    "METHODS",
    "GMMKernelConfig",
    "gmm",
    "gmm_loop",
    "gmm_pallas",
    "gmm_ragged_dot",
    "gmm_tiled",
    "gmm_xla",
    "tgmm",
    "tgmm_loop",
    "tgmm_pallas",
    "tgmm_ragged_dot",
    "tgmm_tiled",
    "tgmm_xla",
]

# The Pallas entry point, (module, name): what ``"auto"`` picks on a GPU when it imports.
_KERNEL = ("jaxlib_ext.pallas_kernels.moe.pallas", "gmm_pallas")
__getattr__ = lazy_attributes(__name__, {
    "gmm_pallas": _KERNEL[0],
    "tgmm_pallas": _KERNEL[0],
    "GMMKernelConfig": "jaxlib_ext.pallas_kernels.moe.config",
})


def _check_matrix(name, x, ndim, layout):
    if not hasattr(x, "shape") or not hasattr(x, "dtype"):
        raise ValueError(f"{name} must be an array of shape {layout}, got {type(x).__name__}")
    if x.ndim != ndim:
        raise ValueError(f"{name} must have shape {layout}, got shape {tuple(x.shape)}")
    if not jnp.issubdtype(x.dtype, jnp.floating):
        raise ValueError(f"{name} must have a floating dtype, got {x.dtype}")


def _check_group_sizes(group_sizes, num_groups: int, m: int):
    if not hasattr(group_sizes, "shape") or not hasattr(group_sizes, "dtype"):
        raise ValueError(f"group_sizes must be an integer array [G], got {type(group_sizes)}")
    if not jnp.issubdtype(group_sizes.dtype, jnp.integer):
        raise ValueError(f"group_sizes must have an integer dtype, got {group_sizes.dtype}")
    if tuple(group_sizes.shape) != (num_groups,):
        raise ValueError(
            f"group_sizes must have shape [G] = ({num_groups},), got {tuple(group_sizes.shape)}"
        )
    if is_concrete(group_sizes):
        sizes = np.asarray(group_sizes)
        if sizes.size and sizes.min() < 0:
            raise ValueError(f"group_sizes must be >= 0, got minimum {int(sizes.min())}")
        if int(sizes.sum()) > m:
            raise ValueError(f"group_sizes must sum to at most M = {m}, got {int(sizes.sum())}")


def gmm_xla(lhs, rhs, group_sizes):
    """``gmm`` in plain XLA: ``ragged_dot`` on GPU/TPU, the tiled form on CPU (module docstring).

    No argument checks (:func:`gmm` does them).

    Args:
      lhs: ``[M, K]`` rows sorted by group.
      rhs: ``[G, K, N]`` per-group weights (cast to ``lhs``'s dtype).
      group_sizes: ``int[G]`` rows per group.

    Returns:
      The ``[M, N]`` products, of ``lhs``'s dtype.
    """
    if jax.default_backend() == "cpu":
        return gmm_tiled(lhs, rhs.astype(lhs.dtype), group_sizes)
    return gmm_ragged_dot(lhs, rhs.astype(lhs.dtype), group_sizes)


def tgmm_xla(lhs, grad, group_sizes):
    """``tgmm`` in plain XLA: ``ragged_dot_general`` on GPU/TPU, the tiled form on CPU.

    No argument checks (:func:`tgmm` does them).

    Args:
      lhs: ``[M, K]`` rows sorted by group.
      grad: ``[M, N]`` output cotangents (cast to ``lhs``'s dtype).
      group_sizes: ``int[G]`` rows per group.

    Returns:
      The ``[G, K, N]`` per-group products, of ``lhs``'s dtype.
    """
    if jax.default_backend() == "cpu":
        return tgmm_tiled(lhs, grad.astype(lhs.dtype), group_sizes)
    return tgmm_ragged_dot(lhs, grad.astype(lhs.dtype), group_sizes)


def _resolve(method, op, *arrays) -> str:
    method = check_method(method, METHODS, op=op)
    f64 = any(jnp.dtype(a.dtype) == jnp.float64 for a in arrays)
    return resolve_auto(method, kernel=_KERNEL, supported=not f64)


def gmm(lhs, rhs, group_sizes, *, method="auto", config=None):
    """Grouped matmul: ``out[r] = lhs[r] @ rhs[g(r)]`` for the group ``g(r)`` of row ``r``.

    Args:
      lhs: ``[M, K]`` floating rows, grouped consecutively.
      rhs: ``[G, K, N]`` one matrix per group (cast to ``lhs.dtype``).
      group_sizes: ``[G]`` integer rows per group, ``>= 0``, summing to at most ``M`` (checked
        when concrete).
      method: ``"auto" | "reference" | "xla" | "pallas"`` (:data:`METHODS`; module
        docstring).
      config: a ``GMMKernelConfig`` for ``"pallas"`` (default: its defaults, interpreted where
        the backend is not a GPU).

    Returns:
      ``[M, N]`` in ``lhs.dtype``; rows past ``sum(group_sizes)`` are zero. Accumulation is
      float32 (float64 for float64 operands).

    Raises:
      ValueError: wrong ranks, mismatched ``K`` or ``G``, non-floating operands, non-integer or
        negative ``group_sizes``, a sum above ``M``, an unknown ``method``.
    """
    _check_matrix("lhs", lhs, 2, "[M, K]")
    _check_matrix("rhs", rhs, 3, "[G, K, N]")
    if rhs.shape[1] != lhs.shape[1]:
        raise ValueError(
            f"rhs must have shape [G, K, N] with K = {lhs.shape[1]} from lhs, got "
            f"{tuple(rhs.shape)}"
        )
    _check_group_sizes(group_sizes, rhs.shape[0], lhs.shape[0])
    method = _resolve(method, "gmm", lhs, rhs)
    if method == "reference":
        return gmm_loop(lhs, rhs.astype(lhs.dtype), group_sizes)
    if method == "xla":
        return gmm_xla(lhs, rhs.astype(lhs.dtype), group_sizes)
    from jaxlib_ext.pallas_kernels.moe.pallas import gmm_pallas

    return gmm_pallas(lhs, rhs, group_sizes, config=config)


def tgmm(lhs, grad, group_sizes, *, method="auto", config=None):
    """Per-group transposed product ``out[g] = sum_{r in group g} lhs[r]^T grad[r]``.

    Args:
      lhs: ``[M, K]``; grad: ``[M, N]`` (cast to ``lhs.dtype``); group_sizes: ``[G]`` as in
        :func:`gmm`; method, config: as in :func:`gmm`.

    Returns:
      ``[G, K, N]`` in ``lhs.dtype``, zero for an empty group; rows past the sum are ignored.

    Raises:
      ValueError: as :func:`gmm`, and a ``grad`` whose row count differs from ``lhs``.
    """
    _check_matrix("lhs", lhs, 2, "[M, K]")
    _check_matrix("grad", grad, 2, "[M, N]")
    if grad.shape[0] != lhs.shape[0]:
        raise ValueError(
            f"grad must have shape [M, N] with M = {lhs.shape[0]} from lhs, got {tuple(grad.shape)}"
        )
    if group_sizes is None or not hasattr(group_sizes, "shape") or group_sizes.ndim != 1:
        raise ValueError("group_sizes must be an integer array of shape [G]")
    _check_group_sizes(group_sizes, group_sizes.shape[0], lhs.shape[0])
    method = _resolve(method, "tgmm", lhs, grad)
    if method == "reference":
        return tgmm_loop(lhs, grad.astype(lhs.dtype), group_sizes)
    if method == "xla":
        return tgmm_xla(lhs, grad.astype(lhs.dtype), group_sizes)
    from jaxlib_ext.pallas_kernels.moe.pallas import tgmm_pallas

    return tgmm_pallas(lhs, grad.astype(lhs.dtype), group_sizes, config=config)
