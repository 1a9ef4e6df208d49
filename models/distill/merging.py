"""Stage III of arXiv 2603.15590: merging students distilled per domain in weight space.

Students distilled independently from the same initial student ``theta_0`` (one per domain,
``theta_d``) are merged parameter by parameter. The paper's merging equation (its eq. 14) is
described as a weight merge of the experts; its coefficients are not public, so both standard
forms are implemented:

* weighted average: ``theta = sum_d w_d theta_d`` with ``sum_d w_d = 1`` (weights normalised);
* task arithmetic (Ilharco et al. 2023, arXiv 2212.04089): ``theta = theta_0 + lambda *
  sum_d w_d (theta_d - theta_0)``; with ``lambda = 1`` and normalised weights this is the
  weighted average, larger ``lambda`` extrapolates along the task vectors.

Both act on any pytrees of arrays with one structure (``nnx.State``, dicts); :func:`merge_models`
applies them to Flax NNX modules of one architecture.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

__all__ = ["MERGE_METHODS", "weighted_average", "task_arithmetic", "merge_models"]

MERGE_METHODS = ("average", "task_arithmetic")


def _weights(weights, n: int) -> np.ndarray:
    w = np.full(n, 1.0 / n) if weights is None else np.asarray(weights, np.float64)
    if w.shape != (n,):
        raise ValueError(f"weights: expected {n} values (one per model), got shape {w.shape}")
    if not np.all(np.isfinite(w)) or np.any(w < 0) or w.sum() <= 0:
        raise ValueError(f"weights must be finite, non-negative, not all zero; got {w.tolist()}")
    return w / w.sum()


def _check_trees(trees):
    if len(trees) == 0:
        raise ValueError("need at least one model to merge")
    structure = jax.tree.structure(trees[0])
    for i, t in enumerate(trees[1:], 1):
        if jax.tree.structure(t) != structure:
            raise ValueError(f"model {i} has another parameter structure than model 0")
        for a, b in zip(jax.tree.leaves(trees[0]), jax.tree.leaves(t), strict=True):
            if a.shape != b.shape:
                raise ValueError(f"model {i}: parameter shapes differ ({a.shape} vs {b.shape})")


def weighted_average(trees: Sequence, weights: Sequence[float] | None = None):
    """``sum_d w_d theta_d`` over pytrees, each leaf in its own dtype.

    Computed as ``theta_1 + sum_d w_d (theta_d - theta_1)``, so merging identical trees returns
    them bit for bit.

    Args:
      trees: the pytrees ``theta_d``, one structure and shape.
      weights: one finite non-negative weight per tree, not all zero, normalised to sum 1;
        ``None`` means uniform.

    Returns:
      The merged pytree.

    Raises:
      ValueError: if ``trees`` is empty or of mixed structure or shapes, or ``weights`` is
        invalid.
    """
    trees = list(trees)
    _check_trees(trees)
    return _offset_sum(trees[0], trees, _weights(weights, len(trees)), 1.0)


def _offset_sum(base, trees, w, scale):
    def leaf(b, *xs):
        b32 = b.astype(jnp.float32)
        delta = sum(float(wi) * (x.astype(jnp.float32) - b32) for wi, x in zip(w, xs, strict=True))
        return (b32 + scale * delta).astype(b.dtype)

    return jax.tree.map(leaf, base, *trees)


def task_arithmetic(base, trees: Sequence, weights: Sequence[float] | None = None,
                    scale: float = 1.0):
    """``theta_0 + scale * sum_d w_d (theta_d - theta_0)`` (Ilharco et al., arXiv 2212.04089).

    Args:
      base: the shared initial pytree ``theta_0``.
      trees: the pytrees ``theta_d``, of ``base``'s structure and shapes.
      weights: one finite non-negative weight per tree, not all zero, normalised to sum 1;
        ``None`` means uniform.
      scale: ``lambda``; 1 with normalised weights is the weighted average.

    Returns:
      The merged pytree.

    Raises:
      ValueError: if the trees differ in structure or shapes, or ``weights`` is invalid.

    References:
      Ilharco et al., Editing Models with Task Arithmetic, arXiv 2212.04089.
    """
    trees = list(trees)
    _check_trees([base, *trees])
    return _offset_sum(base, trees, _weights(weights, len(trees)), scale)


def merge_models(models: Sequence[nnx.Module], *, method: str = "average",
                 weights: Sequence[float] | None = None, base: nnx.Module | None = None,
                 scale: float = 1.0) -> nnx.Module:
    """A new module with the merged ``nnx.Param`` values of ``models``.

    Its other state is the first model's.

    Args:
      models: the modules to merge, of one architecture.
      method: ``"average"`` or ``"task_arithmetic"``.
      weights: one weight per model (see :func:`weighted_average`); ``None`` means uniform.
      base: the shared initial model, required by ``"task_arithmetic"``.
      scale: ``lambda`` of task arithmetic.

    Returns:
      The merged module.

    Raises:
      ValueError: if ``method`` is unknown, ``models`` is empty, ``base`` is missing for task
        arithmetic, or as :func:`weighted_average`.
    """
    if method not in MERGE_METHODS:
        raise ValueError(f"method must be one of {MERGE_METHODS}, got {method!r}")
    models = list(models)
    if not models:
        raise ValueError("models: need at least one model to merge")
    states = [nnx.state(m, nnx.Param) for m in models]
    if method == "average":
        merged = weighted_average(states, weights)
    else:
        if base is None:
            raise ValueError("base: task_arithmetic needs the shared initial model")
        merged = task_arithmetic(nnx.state(base, nnx.Param), states, weights, scale)
    out = nnx.clone(models[0])
    nnx.update(out, merged)
    return out
