r"""Shared helpers for the optimizers in :mod:`jaxlib_ext.optim`.

* argument validation that runs before tracing and tolerates values injected by
  :func:`optax.inject_hyperparams` (concrete or traced scalars);
* mask resolution in the optax convention (``None`` -> a default chosen from the key path,
  a callable ``params -> tree of bools``, or a tree of bools with the structure of the params);
* the default "weight matrix" predicate used by FOAM's ``fold_mask`` and SMET's ``sparse_mask``:
  every leaf with ``ndim >= 2`` whose key path does not name an embedding or the LM head
  (the grouping of the FOAM and SMET reference code, arXiv 2512.07112 and 2606.00888);
* the randomness argument ``key`` of the optimizers: a ``jax.random.key``, a raw ``uint32[2]``
  key or an int seed;
* HF-style AdamW (bias correction folded into the step size, ``eps`` added to :math:`\sqrt v`):
  the leaf update :func:`hf_adam_leaf` that FOAM's unfolded leaves and POET-X share, the transform
  :func:`scale_by_hf_adam` over it, and the post-update decoupled weight decay
  :func:`hf_decoupled_weight_decay` of FOAM's and POET-X's reference code;
* :func:`cast_to_params_dtype`, which ends a chain whose updates must be in the params' dtypes.
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
#: :class:`jaxlib_ext.optim.smet_layer.SparseLinear` layer (shape ``(K, block_size)``).
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


def prng_key(key, name: str = "key") -> jax.Array:
    """``key`` as a typed PRNG key: a ``jax.random.key`` as is, a raw ``uint32[2]`` key wrapped,
    an int seed through ``jax.random.key(seed)``; traced values (``optax.inject_hyperparams``)
    are converted the same way.

    Raises:
      ValueError: naming ``name``, for anything else (a key array of several keys, a float, ...).
    """
    if isinstance(key, (bool, np.bool_)):
        raise ValueError(f"{name}: expected a jax.random.key or an int seed, got {key!r}")
    if isinstance(key, numbers.Integral):
        return jax.random.key(int(key))
    if not isinstance(key, (jax.Array, np.ndarray)):
        raise ValueError(
            f"{name}: expected a jax.random.key or an int seed, got {type(key).__name__}"
        )
    if jnp.issubdtype(key.dtype, jax.dtypes.prng_key):
        if key.shape != ():
            raise ValueError(f"{name}: expected a single PRNG key, got shape {key.shape}")
        return key
    if key.dtype == jnp.uint32 and key.shape == (2,):
        return jax.random.wrap_key_data(key)
    if jnp.issubdtype(key.dtype, jnp.integer) and key.shape == ():
        return jax.random.key(key)
    raise ValueError(
        f"{name}: expected a jax.random.key, a uint32[2] PRNGKey or an int seed, got "
        f"{key.dtype}{list(key.shape)}"
    )


def hf_step_factor(count, b1, b2, dtype) -> jax.Array:
    r"""The bias correction of HF AdamW folded into the step size,
    :math:`\sqrt{1 - \beta_2^t} / (1 - \beta_1^t)`, in ``dtype`` promoted to at least float32
    (in bfloat16, ``b2 = 0.999`` rounds to 1)."""
    ct = jnp.promote_types(dtype, jnp.float32)
    t = jnp.asarray(count).astype(ct)
    return jnp.sqrt(1.0 - jnp.asarray(b2, ct) ** t) / (1.0 - jnp.asarray(b1, ct) ** t)


def hf_adam_leaf(g, m, v, count, b1, b2, eps):
    r"""One leaf of HF-style Adam at step ``count`` (the first update is ``count = 1``).

    .. math::

       m \leftarrow \beta_1 m + (1 - \beta_1) g, \quad
       v \leftarrow \beta_2 v + (1 - \beta_2) g^2, \quad
       u = \frac{\sqrt{1 - \beta_2^t}}{1 - \beta_1^t}\,\frac{m}{\sqrt v + \epsilon},

    the bias correction folded into the step size and ``eps`` outside the square root, as the
    ``AdamW`` of HF transformers that FOAM's (arXiv 2512.07112) and POET-X's (arXiv 2603.05500)
    reference code train with.

    Args:
      g: the gradient.
      m, v: the moments, in the state's dtype.
      count: the step count :math:`t \ge 1` (an int32 scalar).
      b1, b2, eps: the hyperparameters (Python floats or injected arrays).

    Returns:
      ``(u, m, v)``: ``u`` in ``g``'s dtype promoted to at least float32 (the caller casts it),
      ``m`` and ``v`` in their input dtypes.
    """
    factor = hf_step_factor(count, b1, b2, g.dtype)
    m_new = b1 * m + (1.0 - b1) * g
    v_new = b2 * v + (1.0 - b2) * (g * g)
    u = factor * (m_new / (jnp.sqrt(v_new) + eps))
    return u, m_new.astype(m.dtype), v_new.astype(v.dtype)


class ScaleByHFAdamState(NamedTuple):
    """State of :func:`scale_by_hf_adam`.

    Attributes:
      count: steps since the start or the last restart (int32), the bias-correction counter.
      mu, nu: the moments, the shape and dtype of each parameter.
    """

    count: jax.Array
    mu: Any
    nu: Any


def scale_by_hf_adam(b1, b2, eps, *, restart_every: int | None = None
                     ) -> optax.GradientTransformation:
    r"""HF-style Adam's preconditioner, :func:`hf_adam_leaf` on every leaf (for ``optax.chain``).

    The updates are in the gradients' dtypes promoted to at least float32, so that the learning
    rate and weight decay that follow act on them before one final cast
    (:func:`cast_to_params_dtype`).

    Args:
      b1, b2, eps: the hyperparameters of :func:`hf_adam_leaf`.
      restart_every: ``None``, or every this many updates the moments and the counter return to
        zero after the update (POET-X's reset at each merge, arXiv 2506.08001); static.

    Returns:
      An ``optax.GradientTransformation`` with state :class:`ScaleByHFAdamState`.

    Raises:
      ValueError: naming the argument, for ``b1``, ``b2`` outside ``[0, 1)``, ``eps < 0`` or
        ``restart_every < 1``.
    """
    check_scalar("b1", b1, lo=0.0, hi=1.0, hi_open=True)
    check_scalar("b2", b2, lo=0.0, hi=1.0, hi_open=True)
    check_scalar("eps", eps, lo=0.0)
    if restart_every is not None:
        restart_every = check_int("restart_every", restart_every, lo=1)

    def init_fn(params):
        zero = jnp.zeros([], jnp.int32)
        return ScaleByHFAdamState(zero, optax.tree.zeros_like(params),
                                  optax.tree.zeros_like(params))

    def update_fn(updates, state, params=None):
        del params
        count = optax.safe_increment(state.count)
        treedef = jax.tree.structure(updates)
        leaves = [hf_adam_leaf(g, m, v, count, b1, b2, eps) for g, m, v in zip(
            treedef.flatten_up_to(updates), treedef.flatten_up_to(state.mu),
            treedef.flatten_up_to(state.nu), strict=True)]
        u, mu, nu = (treedef.unflatten([x[i] for x in leaves]) for i in range(3))
        if restart_every is not None:
            restart = count % restart_every == 0
            mu, nu = (jax.tree.map(lambda x: jnp.where(restart, jnp.zeros_like(x), x), tree)
                      for tree in (mu, nu))
            count = jnp.where(restart, jnp.zeros_like(count), count)
        return u, ScaleByHFAdamState(count, mu, nu)

    return optax.GradientTransformation(init_fn, update_fn)


def cast_to_params_dtype() -> optax.GradientTransformation:
    """Cast each update to its parameter's dtype (a chain's last step under mixed precision,
    where the gradients' dtype is not the params')."""

    def update_fn(updates, state, params=None):
        if params is None:
            raise ValueError("params: cast_to_params_dtype needs update(updates, state, params)")
        return optax.tree.cast_like(updates, params), state

    return optax.GradientTransformation(optax.init_empty_state, update_fn)
