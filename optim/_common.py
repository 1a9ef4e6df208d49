"""Shared helpers for the optimizers in :mod:`jaxlib_ext.optim`.

* argument validation that runs before tracing and tolerates values injected by
  :func:`optax.inject_hyperparams` (concrete or traced scalars);
* mask resolution in the optax convention (``None`` -> a default chosen from the key path,
  a callable ``params -> tree of bools``, or a tree of bools with the structure of the params);
* the default "weight matrix" predicate used by FOAM's ``fold_mask`` and SMET's ``sparse_mask``:
  every leaf with ``ndim >= 2`` whose key path does not name an embedding or the LM head
  (the grouping of the FOAM and SMET reference code, arXiv 2512.07112 and 2606.00888);
* the HF-style post-update decoupled weight decay that FOAM's reference code applies.
"""

from __future__ import annotations

import numbers
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

#: Key-path name that marks the compact value leaf of a
#: :class:`jaxlib_ext.models.sparse_linear.SparseLinear` layer (shape ``(K, block_size)``).
#: The layer uses the same literal; ``tests/models/test_sparse_linear.py`` checks they agree.
SPARSE_VALUES_KEY = "sparse_values"

_EXCLUDED_NAME_PARTS = ("embed", "lm_head", "unembed", "wte", "wpe")
_EXCLUDED_NAMES = ("head", "output_head", "logits")


def path_names(path) -> tuple[str, ...]:
    """Key-path entries as strings, without NNX's trailing ``.value`` attribute."""
    names = []
    for entry in path:
        if isinstance(entry, jax.tree_util.DictKey):
            names.append(str(entry.key))
        elif isinstance(entry, jax.tree_util.GetAttrKey):
            names.append(str(entry.name))
        elif isinstance(entry, jax.tree_util.SequenceKey):
            names.append(str(entry.idx))
        elif isinstance(entry, jax.tree_util.FlattenedIndexKey):
            names.append(str(entry.key))
        else:  # pragma: no cover - future key types
            names.append(str(entry))
    if names and names[-1] == "value":
        names = names[:-1]
    return tuple(names)


def is_embedding_or_head(path) -> bool:
    """True when a key path names an embedding table or the LM head."""
    for name in path_names(path):
        low = name.lower()
        if any(part in low for part in _EXCLUDED_NAME_PARTS) or low in _EXCLUDED_NAMES:
            return True
    return False


def default_matrix_mask(path, leaf) -> bool:
    """Default fold / sparsity predicate: ``ndim >= 2`` and not an embedding or LM head."""
    return bool(getattr(leaf, "ndim", 0) >= 2 and not is_embedding_or_head(path))


def is_compact_sparse(path) -> bool:
    """True for the compact value leaf of a ``SparseLinear`` layer (see ``SPARSE_VALUES_KEY``)."""
    names = path_names(path)
    return bool(names) and names[-1] == SPARSE_VALUES_KEY


def resolve_mask(
    mask: Any,
    tree: Any,
    default: Callable[[Any, Any], bool],
    *,
    name: str,
) -> Any:
    """Return a tree of Python bools with ``tree``'s structure.

    Args:
      mask: ``None`` (use ``default(path, leaf)``), a callable ``tree -> mask tree``, or a tree of
        bools with the structure of ``tree``.
      tree: the params (or updates) tree.
      default: predicate on ``(key path, leaf)``.
      name: argument name used in error messages.

    Raises:
      ValueError: if the mask tree does not match the params' structure or holds non-bools.
    """
    if mask is None:
        return jax.tree_util.tree_map_with_path(default, tree)
    if callable(mask):
        mask = mask(tree)
    tree_def = jax.tree_util.tree_structure(tree)
    mask_leaves, mask_def = jax.tree_util.tree_flatten(mask)
    if mask_def != tree_def:
        raise ValueError(
            f"{name}: expected a tree of bools with the same structure as the params "
            f"({tree_def.num_leaves} leaves: {tree_def}), "
            f"got {mask_def.num_leaves} leaves: {mask_def}"
        )
    out = []
    for leaf in mask_leaves:
        if isinstance(leaf, (bool, np.bool_)):
            out.append(bool(leaf))
        elif isinstance(leaf, (np.ndarray, jax.Array)) and leaf.shape == () and leaf.dtype == bool:
            out.append(bool(leaf))
        else:
            raise ValueError(f"{name}: mask leaves must be Python bools, got {leaf!r}")
    return jax.tree_util.tree_unflatten(tree_def, out)


def _concrete_float(value) -> float | None:
    """``float(value)`` when it is concrete, ``None`` for a tracer (inject_hyperparams)."""
    if isinstance(value, jax.core.Tracer):
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def check_scalar(
    name: str,
    value,
    *,
    lo: float | None = None,
    hi: float | None = None,
    lo_open: bool = False,
    hi_open: bool = False,
) -> None:
    """Check a float hyperparameter is a scalar inside ``[lo, hi]`` (open ends optional).

    Traced values (from ``optax.inject_hyperparams`` under ``jit``) pass unchecked.
    """
    if isinstance(value, jax.core.Tracer):
        return
    if isinstance(value, (bool, np.bool_)) or not (
        isinstance(value, numbers.Real) or (hasattr(value, "shape") and np.shape(value) == ())
    ):
        raise ValueError(f"{name}: expected a real scalar, got {value!r}")
    v = _concrete_float(value)
    if v is None or not np.isfinite(v):
        raise ValueError(f"{name}: expected a finite real scalar, got {value!r}")
    if lo is not None and (v < lo or (lo_open and v == lo)):
        bracket = "(" if lo_open else "["
        rb = ")" if hi_open else "]"
        raise ValueError(f"{name}: expected a value in {bracket}{lo}, {hi}{rb}, got {v}")
    if hi is not None and (v > hi or (hi_open and v == hi)):
        bracket = "(" if lo_open else "["
        rb = ")" if hi_open else "]"
        raise ValueError(f"{name}: expected a value in {bracket}{lo}, {hi}{rb}, got {v}")


def check_int(name: str, value, *, lo: int | None = None) -> int:
    """Check a static integer argument (shapes depend on it) and return it as ``int``."""
    if isinstance(value, jax.core.Tracer):
        raise ValueError(
            f"{name}: must be a static Python int (it fixes state shapes); pass it in "
            f"`static_args` of optax.inject_hyperparams, got a traced value"
        )
    if isinstance(value, (bool, np.bool_)):
        raise ValueError(f"{name}: expected an int, got {value!r}")
    if isinstance(value, (np.ndarray, jax.Array)) and value.shape == ():
        if not jnp.issubdtype(value.dtype, jnp.integer):
            raise ValueError(f"{name}: expected an int, got {value!r}")
        value = int(value)
    if not isinstance(value, numbers.Integral):
        raise ValueError(f"{name}: expected an int, got {value!r}")
    value = int(value)
    if lo is not None and value < lo:
        raise ValueError(f"{name}: expected an int >= {lo}, got {value}")
    return value


def check_learning_rate(learning_rate) -> None:
    """A learning rate is a non-negative scalar or an optax schedule ``count -> scalar``."""
    if callable(learning_rate):
        return
    if isinstance(learning_rate, (str, bytes)) or not (
        isinstance(learning_rate, numbers.Real)
        or (hasattr(learning_rate, "shape") and np.shape(learning_rate) == ())
    ):
        raise ValueError(
            "learning_rate: expected a float or an optax schedule (a callable step -> float), "
            f"got {type(learning_rate).__name__}: {learning_rate!r}"
        )
    check_scalar("learning_rate", learning_rate, lo=0.0)


def lr_at(learning_rate, count):
    """Evaluate a constant or scheduled learning rate at ``count``."""
    return learning_rate(count) if callable(learning_rate) else learning_rate


def is_static_zero(value) -> bool:
    """True for a concrete Python (or NumPy) real number equal to 0; False for any array."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and value == 0


class HFWeightDecayState(NamedTuple):
    """Step counter for :func:`hf_decoupled_weight_decay` (to evaluate a schedule)."""

    count: jax.Array


def hf_decoupled_weight_decay(learning_rate, weight_decay) -> optax.GradientTransformation:
    r"""Decoupled weight decay applied to the already-updated parameters (HF ``AdamW`` style).

    FOAM's weight decay, equation (6) of :mod:`jaxlib_ext.optim.foam`.

    Placed after ``scale_by_learning_rate`` in a chain. With ``u`` the incoming (lr-scaled) update
    and ``p`` the params, the reference code does ``p <- p + u`` then ``p <- p - lr * wd * p``, so

    .. math:: u' = u - \eta_t \lambda (p + u).

    Different from ``optax.add_decayed_weights`` by the ``\eta_t^2 \lambda u`` term. The state is
    the same whatever ``weight_decay`` is (a Python number or an injected array), so wrapping the
    optimizer in ``optax.inject_hyperparams`` does not change its structure; a Python ``0`` skips
    the arithmetic and needs no ``params``.
    """
    skip = is_static_zero(weight_decay)

    def init_fn(params):
        del params
        return HFWeightDecayState(count=jnp.zeros([], jnp.int32))

    def update_fn(updates, state, params=None):
        count = optax.safe_increment(state.count)
        if skip:
            return updates, HFWeightDecayState(count=count)
        if params is None:
            raise ValueError(
                "weight_decay: a nonzero decay needs `params` in update(updates, state, params)"
            )
        lr = lr_at(learning_rate, state.count)
        factor = -jnp.asarray(lr) * weight_decay
        updates = jax.tree.map(
            lambda u, p: (u + factor * (p + u)).astype(u.dtype), updates, params
        )
        return updates, HFWeightDecayState(count=count)

    return optax.GradientTransformation(init_fn, update_fn)
