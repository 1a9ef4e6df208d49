r"""POET-X: orthogonal equivalence training as an Optax chain (arXiv 2506.08001, 2603.05500).

A POET layer (:class:`jaxlib_ext.optim.PoetLinear`) computes ``x @ W_eff`` with
``W_eff = R_in W0 R_out``; ``W0`` is fixed and only the rotation parameters ``theta`` are trained
(POET-BS, arXiv 2506.08001, with the Cayley–Neumann blocks of the POET-X kernel, arXiv
2603.05500; conventions in :mod:`jaxlib_ext.pallas_kernels.poet`). :func:`poet_x` trains a whole
parameter tree in which such layers appear as subtrees holding the five leaves ``poet_base``,
``theta_in``, ``theta_out``, ``perm_in`` and ``perm_out`` (a plain dict or an ``nnx.State``).
:func:`poet_labels` names each leaf's group, and :func:`poet_x` is the chain

.. code-block:: python

   optax.chain(
       optax.partition({
           "rotation": chain(scale_by_poet(b1, b2, eps, merge_every=merge_every),
                             scale_by_learning_rate(learning_rate * poet_lr_scale)),
           "frozen": optax.set_to_zero(),
           "dense": chain(scale_by_hf_adam(b1, b2, eps),
                          scale_by_learning_rate(base_learning_rate)),
           "dense_decay": chain(scale_by_hf_adam(b1, b2, eps),
                                scale_by_learning_rate(base_learning_rate),
                                hf_decoupled_weight_decay(base_learning_rate, weight_decay)),
       }, poet_labels),
       cast_to_params_dtype(),
       bound_rotations(orthogonality_bound, on_orthogonality=on_orthogonality),
       merge_then_reinitialize(merge_every, key),
   )

with ``scale_by_hf_adam``, ``hf_decoupled_weight_decay`` and ``cast_to_params_dtype`` of
:mod:`jaxlib_ext.optim._common` (the HF AdamW that FOAM's unfolded leaves share) and
``bound_rotations`` only when ``orthogonality_bound`` is not ``None``:

* ``"rotation"`` (``theta_*``): HF-style Adam (``eps`` added to :math:`\sqrt v`, bias correction
  folded into the step size: :math:`u = \eta\,\mathrm{scale}\,\frac{\sqrt{1-\beta_2^t}}{1-\beta_1^t}
  \frac{m}{\sqrt v + \epsilon}`), learning rate ``learning_rate * poet_lr_scale`` (the
  authors' ``poet_scale = 0.5`` multiplies the POET learning rate inside the step), no weight
  decay; its moments and counter restart at each merge (3);
* ``"frozen"`` (``poet_base``, ``perm_*``): zero updates and no optimizer state, except at a merge;
* ``"dense"``, ``"dense_decay"`` (every other leaf): the same HF AdamW with
  ``base_learning_rate`` (default ``learning_rate``) and decoupled weight decay
  :math:`p \leftarrow (p - \eta u)(1 - \eta\lambda)` on leaves with ``ndim >= 2`` (the authors'
  parameter groups: vectors and biases without decay).

**Merge-then-reinitialize** (arXiv 2506.08001, POET's training loop; every ``merge_every``
steps, when the step counter :math:`t \ge 1` after the update is a multiple of it): with
:math:`\theta_t` the rotation parameters after this step's update,

.. math::

   W_0 &\leftarrow R_{in}(\theta^{in}_t)\, W_0\, R_{out}(\theta^{out}_t) \qquad (1)\\
   \pi_{in}, \pi_{out} &\leftarrow \text{fresh uniform permutations} \qquad (2)\\
   \theta &\leftarrow 0, \quad (m, v, t)_\theta \leftarrow 0 \qquad (3)

(1) folds the rotations into the base weight, so the layer's function is unchanged (with
:math:`\theta = 0` the rotations are the identity for any permutation); (2) draws the
permutations from ``jax.random.fold_in(key, t)``; (3) zeroes the rotation parameters and
resets their Adam moments and bias-correction counter, every other leaf's state untouched.
:func:`merge_then_reinitialize` carries out (1), (2) and :math:`\theta \leftarrow 0` through the
returned updates (``merged - params`` for the base weight and permutations, ``-theta`` for the
rotations, which makes ``theta`` exactly zero), so any loop that applies
``optax.apply_updates`` runs it; it is a ``lax.cond`` on the step counter, so the step compiles
once. The moment reset of (3) is :func:`scale_by_poet`'s, on the same step count (why there:
:func:`merge_then_reinitialize`). The learning-rate schedule runs on the global step counter,
not the reset one. Gradient-clipping warm-up after each merge (the authors' training driver) is
a separate transform placed before this chain, :func:`clip_by_global_norm_merge_warmup`; the
``poet_x`` recipe (:func:`jaxlib_ext.optim.make_optimizer`) chains the two.

**Orthogonality bound.** The blocks are the truncated Cayley–Neumann series
:math:`G = I + 2Q + 2Q^2 + 2Q^3 + Q^4` of a skew :math:`Q` (eigenvalues :math:`\pm i\lambda_j`),
a polynomial in :math:`Q`, so its singular values are
:math:`|p(i\lambda_j)| = |1 - \lambda_j^2|(1 + \lambda_j^2) = |1 - \lambda_j^4|`: a block
drifts from orthogonal by exactly :math:`\rho^4` with :math:`\rho = \|Q\|_2 < 1` (measured to
float32 rounding against an SVD). Nothing in POET keeps :math:`\rho` small but the merges; with
``merge_every=200`` at learning rate ``1e-2`` the drift reaches 0.18 in 32-blocks of a small
regression (``rho = 0.66``) and 0.03 even at ``1e-3``. Each step therefore bounds
:math:`\rho` from above (:func:`rotation_radius`) and compares the drift with
``orthogonality_bound``, default ``1e-2`` (``rho <= 0.316``, a rotation angle
:math:`2\arctan\rho` of up to 35 degrees per block between merges). The bound is tight because a
merge folds the rotations into :math:`W_0`: the drift of each merge interval multiplies the
base weight's singular values by up to :math:`(1 \pm \epsilon)^2`, and these factors compound
over the merges of a run, so spectrum preservation (arXiv 2506.08001) holds only while each is
small. Past the bound ``on_orthogonality="warn"`` (the default, the authors' algorithm
unchanged) warns once per layer, ``"clip"`` scales the block's ``theta`` back onto
:math:`\rho = \epsilon^{1/4}` (:func:`bound_rotations`).
The merge timing follows the authors' driver (the completed-step count, so the first merge
folds ``merge_every`` updates) and the Adam-state reset happens in the same update, which the
authors' optimizer performs at the start of the next step: the two are the same sequence of
parameters.
"""

from __future__ import annotations

import warnings
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from jaxlib_ext.optim import _common
from jaxlib_ext.pallas_kernels.poet.reference import cayley_neumann, inverse_permutation, skew
from jaxlib_ext.pallas_kernels.poet.xla import block_apply

__all__ = [
    "ClipMergeWarmupState", "MergeThenReinitializeState", "bound_rotations",
    "clip_by_global_norm_merge_warmup", "merge_clip_threshold", "merge_poet_layer",
    "merge_then_reinitialize", "poet_labels", "poet_x", "rotation_radius", "scale_by_poet",
]

# The layer protocol: the leaf names of a POET layer in a parameter tree (PoetLinear's variables).
_BASE = "poet_base"
_THETAS = ("theta_in", "theta_out")
_PERMS = ("perm_in", "perm_out")
_LAYER_KEYS = frozenset((_BASE, *_THETAS, *_PERMS))

ROTATION, FROZEN, DENSE, DENSE_DECAY = "rotation", "frozen", "dense", "dense_decay"


def _layers(tree):
    """``{prefix: {name: flat index}}`` of the POET layers in ``tree``, and the flat paths."""
    flat, _ = jax.tree_util.tree_flatten_with_path(tree)
    groups: dict[tuple, dict[str, int]] = {}
    names = [_common.path_names(p) for p, _ in flat]
    for i, nm in enumerate(names):
        if nm and nm[-1] in _LAYER_KEYS:
            groups.setdefault(nm[:-1], {})[nm[-1]] = i
    return {k: v for k, v in groups.items() if set(v) == _LAYER_KEYS}, flat


def poet_labels(tree) -> Any:
    """Labels each leaf of ``tree`` for ``optax.multi_transform``.

    The labels are ``"rotation"`` (``theta_*`` of a POET layer), ``"frozen"`` (its base weight and
    permutations), ``"dense_decay"`` (other leaves with ``ndim >= 2``) and ``"dense"``. A POET
    layer is a sub-tree holding all of its base weight, ``theta_in``, ``theta_out`` and
    permutation leaves.

    Args:
      tree: parameter pytree (arrays or shape-carrying leaves).

    Returns:
      A pytree of the structure of ``tree`` whose leaves are the label strings.
    """
    layers, flat = _layers(tree)
    labels = []
    members = {i: name for layer in layers.values() for name, i in layer.items()}
    for i, (_, leaf) in enumerate(flat):
        if i in members:
            labels.append(ROTATION if members[i] in _THETAS else FROZEN)
        else:
            labels.append(DENSE_DECAY if jnp.ndim(leaf) >= 2 else DENSE)
    return jax.tree.unflatten(jax.tree.structure(tree), labels)


def _block_size(theta) -> int:
    p = theta.shape[-1]
    b = int(round((1 + (1 + 8 * p) ** 0.5) / 2))
    if b * (b - 1) // 2 != p:
        raise ValueError(f"theta: last axis {p} is not b (b - 1) / 2 for an integer b")
    return b


def merge_poet_layer(w, theta_in, theta_out, perm_in, perm_out, key):
    """Merge-then-reinitialize of one layer, equations (1)-(2) of the module docstring.

    Args:
      w: ``[n, m]`` base weight; ``theta_*`` as in
        :func:`~jaxlib_ext.pallas_kernels.poet.poet_linear`; ``perm_*`` permutations (integer or
        float holding integers).
      key: PRNG key for the new permutations.

    Returns:
      ``(w_merged, perm_in_new, perm_out_new)``, ``w_merged = R_in w R_out`` computed without
      forming the rotations (``O(n m b)``), permutations in ``perm_*``'s dtypes.
    """
    b = _block_size(theta_in)
    ct = jnp.promote_types(w.dtype, jnp.float32)
    p_in, p_out = perm_in.astype(jnp.int32), perm_out.astype(jnp.int32)
    g_in = cayley_neumann(theta_in.astype(ct), b)
    g_out = cayley_neumann(theta_out.astype(ct), b)
    w32 = w.astype(ct)
    # R_in @ w = (w^T @ R_in^T)^T, and R^T = S B^T S^T: rotate w's columns by the transposed blocks
    a = block_apply(w32.T[:, p_in], jnp.swapaxes(g_in, -1, -2))[:, inverse_permutation(p_in)].T
    merged = block_apply(a[:, p_out], g_out)[:, inverse_permutation(p_out)]
    k_in, k_out = jax.random.split(key)
    n, m = w.shape
    new_in = jax.random.permutation(k_in, n).astype(perm_in.dtype)
    new_out = jax.random.permutation(k_out, m).astype(perm_out.dtype)
    return merged.astype(w.dtype), new_in, new_out


def rotation_radius(theta, block_size: int, squarings: int = 5) -> jax.Array:
    r"""An upper bound on :math:`\rho = \|Q\|_2` of every block, ``theta.shape[:-1]``.

    With :math:`M = Q^\top Q`, :math:`\rho^2 = \|M\|_2 \le \|M^{2^s}\|_F^{2^{-s}}`, which
    overestimates by at most :math:`b^{2^{-s-1}}` (1.09 for ``b = 256``, ``s = 5``); ``s + 1``
    block matmuls, normalised at each squaring so nothing overflows.

    Args:
      theta: ``[..., b(b-1)/2]`` rotation parameters.
      block_size: ``b``.
      squarings: ``s``.
    """
    ct = jnp.promote_types(theta.dtype, jnp.float32)
    q = skew(theta.astype(ct), block_size)
    hp = jax.lax.Precision.HIGHEST
    m = jnp.matmul(jnp.swapaxes(q, -1, -2), q, precision=hp)
    log_scale = jnp.zeros(theta.shape[:-1], ct)
    tiny = jnp.finfo(ct).tiny
    for _ in range(squarings):
        f = jnp.maximum(jnp.linalg.norm(m, axis=(-2, -1)), tiny)
        m = m / f[..., None, None]
        m = jnp.matmul(m, m, precision=hp)
        log_scale = 2.0 * (log_scale + jnp.log(f))
    log_norm = jnp.log(jnp.maximum(jnp.linalg.norm(m, axis=(-2, -1)), tiny))
    return jnp.exp((log_scale + log_norm) / 2 ** (squarings + 1))


def _warn_orthogonality(bound, names, radii):
    for name, r in zip(names, radii, strict=True):
        if r**4 > bound:
            warnings.warn(
                f"poet_x: the rotations of {name} passed orthogonality_bound={bound:g} (their "
                f"truncated Cayley-Neumann blocks are no longer orthogonal: singular values "
                f"off 1 by up to rho^4); lower learning_rate or merge_every, or pass "
                f'on_orthogonality="clip"', RuntimeWarning, stacklevel=2,
            )


def _bound_rotations(updates, params, bound, mode):
    """``updates`` with each rotation block's ``rho`` at most ``bound ** (1/4)`` (``"clip"``),
    or unchanged after a warning naming the layers past it (``"warn"``)."""
    layers, flat_p = _layers(params)
    p_leaves = [leaf for _, leaf in flat_p]
    treedef = jax.tree.structure(updates)
    u_leaves = list(treedef.flatten_up_to(updates))
    bound = jnp.asarray(bound, jnp.float32)  # a tracer under optax.inject_hyperparams
    radius = bound ** 0.25
    names, worst = [], []
    for prefix, idx in sorted(layers.items()):
        for name in _THETAS:
            p, u = p_leaves[idx[name]], u_leaves[idx[name]]
            theta = p.astype(jnp.float32) + u.astype(jnp.float32)
            rho = rotation_radius(theta, _block_size(theta))
            if mode == "clip":
                shrink = jnp.minimum(1.0, radius / jnp.maximum(rho, 1e-30))[..., None]
                u_leaves[idx[name]] = (theta * shrink - p).astype(u.dtype)
            names.append(f"{'/'.join(prefix)}/{name}")
            worst.append(jnp.max(rho))
    if mode == "warn" and worst:
        worst = jnp.stack(worst)
        jax.lax.cond(
            jnp.any(worst > radius),
            lambda e, w: jax.debug.callback(
                lambda e, r: _warn_orthogonality(float(e), names, list(r)), e, w),
            lambda e, w: None,
            bound, worst,
        )
    return treedef.unflatten(u_leaves)


def _merged_updates(updates, params, key):
    """Updates that carry out the merge of every POET layer from ``params + updates``."""
    layers, flat_p = _layers(params)
    p_leaves = [leaf for _, leaf in flat_p]
    treedef = jax.tree.structure(updates)
    u_leaves = list(treedef.flatten_up_to(updates))
    for j, (_, idx) in enumerate(sorted(layers.items())):
        th_in = p_leaves[idx["theta_in"]] + u_leaves[idx["theta_in"]]
        th_out = p_leaves[idx["theta_out"]] + u_leaves[idx["theta_out"]]
        w, pin, pout = (p_leaves[idx[k]] for k in (_BASE, *_PERMS))
        merged, new_in, new_out = merge_poet_layer(
            w, th_in, th_out, pin, pout, jax.random.fold_in(key, j)
        )
        u_leaves[idx[_BASE]] = (merged - w).astype(w.dtype)
        u_leaves[idx["perm_in"]] = (new_in - pin).astype(pin.dtype)
        u_leaves[idx["perm_out"]] = (new_out - pout).astype(pout.dtype)
        for name in _THETAS:
            p = p_leaves[idx[name]]
            u_leaves[idx[name]] = (-p).astype(p.dtype)  # p + (-p) == 0 exactly
    return treedef.unflatten(u_leaves)


def _check_orthogonality(orthogonality_bound, on_orthogonality):
    _common.check_scalar("orthogonality_bound", orthogonality_bound, lo=0.0, hi=1.0,
                         lo_open=True, hi_open=True)
    if on_orthogonality not in ("warn", "clip"):
        raise ValueError(f'on_orthogonality: expected "warn" or "clip", got {on_orthogonality!r}')


def bound_rotations(
    orthogonality_bound: float = 1e-2, *, on_orthogonality: str = "warn"
) -> optax.GradientTransformation:
    r"""The orthogonality bound of the module docstring, over the POET layers of the tree.

    With :math:`\theta = p + u` each rotation block's parameters after this step (``u`` the
    incoming update, already scaled by the learning rate and in the params' dtype), the block's
    radius :math:`\rho` is bounded from above by :func:`rotation_radius` and its drift
    :math:`\rho^4` compared with ``orthogonality_bound``. Placed after the learning rate and
    before :func:`merge_then_reinitialize`, so that a merge folds the bounded rotations.

    Args:
      orthogonality_bound: largest singular-value drift :math:`|\sigma - 1|` of a rotation
        block that passes silently, in ``(0, 1)``.
      on_orthogonality: past the bound, ``"warn"`` (a ``RuntimeWarning`` naming each layer,
        the updates unchanged) or ``"clip"`` (each block's ``theta`` scaled back onto
        :math:`\rho = \epsilon^{1/4}`).

    Returns:
      A stateless ``optax.GradientTransformation`` whose ``update`` needs ``params``; the
      identity on the leaves of other layers and on trees without POET layers.

    Raises:
      ValueError: naming the argument, for a bound outside ``(0, 1)`` or another mode.

    References:
      Qiu et al., POET-X: Memory-efficient LLM Training by Scaling Orthogonal
      Transformation, arXiv 2603.05500 (the truncated Cayley–Neumann blocks).
    """
    _check_orthogonality(orthogonality_bound, on_orthogonality)

    def update_fn(updates, state, params=None):
        if params is None:
            raise ValueError("params: bound_rotations needs update(updates, state, params)")
        return _bound_rotations(updates, params, orthogonality_bound, on_orthogonality), state

    return optax.GradientTransformation(optax.init_empty_state, update_fn)


class MergeThenReinitializeState(NamedTuple):
    """State of :func:`merge_then_reinitialize`.

    Attributes:
      count: steps done (int32); a merge follows each update after which it is a multiple of
        ``merge_every``, and it seeds that merge's permutations.
    """

    count: jax.Array


def merge_then_reinitialize(
    merge_every: int, key: jax.Array | int
) -> optax.GradientTransformation:
    r"""Equations (1), (2) and :math:`\theta \leftarrow 0` of the module docstring, as updates.

    Every ``merge_every`` updates (when the step count :math:`t` after the update is a multiple
    of it), the updates of every POET layer of the tree are replaced by those that fold
    :math:`\theta_t = p + u` into the base weight (1), draw fresh permutations from
    ``jax.random.fold_in(key, t)`` (2) and set the rotations to exactly zero; between merges,
    and on trees without POET layers, the updates pass unchanged. A ``lax.cond`` on the step
    count: the step compiles once. Placed last in a chain whose updates are in the params'
    dtypes (the merged ones are), after the learning rate.

    The moments of the rotations restart in :func:`scale_by_poet`, on the same step count: an
    optax transform reads and writes only its own state, and the moments are the state of the
    rotations' transform inside ``optax.partition``, so the restart belongs to that transform.
    Both count the updates they have seen; with the same ``merge_every`` (as :func:`poet_x`
    passes to both) the restart falls on the merge's step, whatever wraps the chain.

    Args:
      merge_every: the merge interval :math:`T_m` in steps (static).
      key: PRNG key of the permutations (a ``jax.random.key``, a raw ``uint32[2]`` key or an
        int seed).

    Returns:
      An ``optax.GradientTransformation`` with state :class:`MergeThenReinitializeState`,
      whose ``update`` needs ``params``.

    Raises:
      ValueError: naming the argument, for ``merge_every < 1`` or a ``key`` that is not a key.

    References:
      Qiu et al., Reparameterized LLM Training via Orthogonal Equivalence Transformation
      (POET), arXiv 2506.08001 (merge-then-reinitialize).

      Qiu et al., POET-X: Memory-efficient LLM Training by Scaling Orthogonal
      Transformation, arXiv 2603.05500.
    """
    merge_every = _common.check_int("merge_every", merge_every, lo=1)
    key = _common.prng_key(key)

    def init_fn(params):
        del params
        return MergeThenReinitializeState(count=jnp.zeros([], jnp.int32))

    def update_fn(updates, state, params=None):
        if params is None:
            raise ValueError("params: merge_then_reinitialize needs update(updates, state, params)")
        count = optax.safe_increment(state.count)
        if _layers(params)[0]:
            step_key = jax.random.fold_in(key, count)
            updates = jax.lax.cond(count % merge_every == 0,
                                   lambda u: _merged_updates(u, params, step_key),
                                   lambda u: u, updates)
        return updates, MergeThenReinitializeState(count=count)

    return optax.GradientTransformation(init_fn, update_fn)


def scale_by_poet(
    b1: float = 0.9, b2: float = 0.999, eps: float = 1e-6, *, merge_every: int = 200
) -> optax.GradientTransformation:
    r"""POET-X's preconditioner of the rotation parameters: HF-style Adam restarted at each merge.

    :func:`jaxlib_ext.optim._common.hf_adam_leaf` on every leaf it is given (the ``theta_*``
    leaves under :func:`poet_labels`'s ``"rotation"``), with the moments and the bias-correction
    counter set to zero after every ``merge_every``-th update: (3) of the module docstring, the
    restart that :func:`merge_then_reinitialize` with the same ``merge_every`` relies on. The
    updates are positive directions in at least float32 (follow with the learning rate).

    Args:
      b1, b2, eps: HF AdamW hyperparameters (defaults of the authors' ``POETAdamW``).
      merge_every: the merge interval :math:`T_m` in steps (static).

    Returns:
      An ``optax.GradientTransformation`` with state
      :class:`~jaxlib_ext.optim._common.ScaleByHFAdamState` (``count``: steps since the last
      merge).

    Raises:
      ValueError: naming the argument, for ``b1``, ``b2`` outside ``[0, 1)``, ``eps < 0`` or
        ``merge_every < 1``.

    References:
      Qiu et al., Reparameterized LLM Training via Orthogonal Equivalence Transformation
      (POET), arXiv 2506.08001.

      Qiu et al., POET-X: Memory-efficient LLM Training by Scaling Orthogonal
      Transformation, arXiv 2603.05500.
    """
    merge_every = _common.check_int("merge_every", merge_every, lo=1)
    return _common.scale_by_hf_adam(b1, b2, eps, restart_every=merge_every)


def _scale_by_learning_rate(learning_rate, factor=None) -> optax.GradientTransformation:
    """``-learning_rate(count) * factor`` times the updates, the product formed in the learning
    rate's dtype (at least float32) before it meets the updates."""

    def step_size(count):
        lr = jnp.asarray(_common.lr_at(learning_rate, count))
        return lr if factor is None else lr * factor

    return optax.scale_by_learning_rate(step_size)


def poet_x(
    learning_rate: optax.ScalarOrSchedule,
    *,
    merge_every: int = 200,
    poet_lr_scale: float = 0.5,
    b1: float = 0.9,
    b2: float = 0.999,
    eps: float = 1e-6,
    weight_decay: float = 0.0,
    base_learning_rate: optax.ScalarOrSchedule | None = None,
    key: jax.Array | int = 0,
    orthogonality_bound: float | None = 1e-2,
    on_orthogonality: str = "warn",
) -> optax.GradientTransformation:
    r"""POET-X's optimizer with merge-then-reinitialize: the chain of the module docstring.

    Args:
      learning_rate: POET learning rate (float or schedule); the rotations move with
        ``learning_rate * poet_lr_scale``.
      merge_every: merge interval :math:`T_m` in steps (static).
      poet_lr_scale: the authors' ``poet_scale``.
      b1, b2, eps: HF AdamW hyperparameters (defaults of the authors' ``POETAdamW``).
      weight_decay: decoupled decay of the non-POET matrices.
      base_learning_rate: learning rate of the non-POET leaves; ``None``: ``learning_rate``.
      key: PRNG key of the permutations drawn at merges: a ``jax.random.key``, a raw
        ``uint32[2]`` key or an int seed (``jax.random.key(seed)``).
      orthogonality_bound: largest singular-value drift :math:`|\sigma - 1|` of a rotation
        block that passes silently (module docstring); ``None``: no check, no cost.
      on_orthogonality: past the bound, ``"warn"`` (once per layer) or ``"clip"`` (scale the
        block's ``theta`` back onto the bound).

    Returns:
      An ``optax.GradientTransformationExtraArgs``, ``optax.chain`` of ``optax.partition`` over
      :func:`poet_labels`, :func:`~jaxlib_ext.optim._common.cast_to_params_dtype`,
      :func:`bound_rotations` (unless ``orthogonality_bound`` is ``None``) and
      :func:`merge_then_reinitialize`. ``update`` needs ``params``; the updates are in the
      params' dtypes whatever the gradients' dtype (mixed precision, ``optax.MultiSteps``'
      accumulator). With ``optax.inject_hyperparams`` pass ``static_args=("merge_every",)``;
      ``optax.tree.map_params`` over the state needs
      ``is_leaf=lambda v: isinstance(v, optax.MaskedNode)``, as for any ``optax.partition``.

    Raises:
      ValueError: naming the argument, for a learning rate, scale, decay, bound or key out of
        range, or ``merge_every < 1``.

    References:
      Qiu et al., Reparameterized LLM Training via Orthogonal Equivalence Transformation
      (POET), arXiv 2506.08001.

      Qiu et al., POET-X: Memory-efficient LLM Training by Scaling Orthogonal
      Transformation, arXiv 2603.05500.

    Example:
      >>> import jax.numpy as jnp
      >>> from jaxlib_ext.optim import poet_x
      >>> opt = poet_x(1e-3, merge_every=2)
      >>> params = {"w": jnp.ones((2, 2))}
      >>> int(opt.init(params)[-1].count)
      0
    """
    _common.check_learning_rate(learning_rate)
    if base_learning_rate is not None:
        _common.check_learning_rate(base_learning_rate)
    _common.check_scalar("poet_lr_scale", poet_lr_scale, lo=0.0)
    _common.check_scalar("weight_decay", weight_decay, lo=0.0)
    if orthogonality_bound is not None:
        _check_orthogonality(orthogonality_bound, on_orthogonality)
    elif on_orthogonality not in ("warn", "clip"):
        raise ValueError(f'on_orthogonality: expected "warn" or "clip", got {on_orthogonality!r}')
    base_lr = learning_rate if base_learning_rate is None else base_learning_rate

    def dense(*decay):
        return optax.chain(_common.scale_by_hf_adam(b1, b2, eps),
                           _scale_by_learning_rate(base_lr), *decay)

    by_label = optax.partition({
        ROTATION: optax.chain(scale_by_poet(b1, b2, eps, merge_every=merge_every),
                              _scale_by_learning_rate(learning_rate, poet_lr_scale)),
        FROZEN: optax.set_to_zero(),
        DENSE: dense(),
        DENSE_DECAY: dense(_common.hf_decoupled_weight_decay(base_lr, weight_decay)),
    }, poet_labels)
    bound = [] if orthogonality_bound is None else [
        bound_rotations(orthogonality_bound, on_orthogonality=on_orthogonality)]
    return optax.chain(by_label, _common.cast_to_params_dtype(), *bound,
                       merge_then_reinitialize(merge_every, key))


class ClipMergeWarmupState(NamedTuple):
    """State of :func:`clip_by_global_norm_merge_warmup`.

    Attributes:
      count: steps done (int32), the authors' ``optimizer_step_count``; the steps since the last
        merge are ``count % merge_every`` once ``count >= merge_every``.
    """

    count: jax.Array


def _check_clip_warmup(max_norm, merge_every, start_fraction, warmup_steps, until):
    _common.check_scalar("max_norm", max_norm, lo=0.0, lo_open=True)
    merge_every = _common.check_int("merge_every", merge_every, lo=1)
    _common.check_scalar("start_fraction", start_fraction, lo=0.0, hi=1.0, lo_open=True)
    warmup_steps = _common.check_int("warmup_steps", warmup_steps, lo=0)
    if until is not None:
        until = _common.check_int("until", until, lo=0)
    return merge_every, warmup_steps, until


def merge_clip_threshold(
    count,
    max_norm: float,
    *,
    merge_every: int,
    start_fraction: float = 0.1,
    warmup_steps: int = 10,
    until: int | None = 2000,
) -> jax.Array:
    r"""Clipping threshold of the update that follows ``count`` completed steps (float32).

    With :math:`c` = ``max_norm``, :math:`T_m` = ``merge_every``, :math:`f` =
    ``start_fraction``, :math:`W` = ``warmup_steps`` and :math:`k = t \bmod T_m` the steps
    since the last merge,

    .. math::

       c_t = \begin{cases}
         c\,\bigl(f + (1 - f)\,k / W\bigr) & T_m \le t \le \text{until},\ k < W \\
         c & \text{otherwise,}
       \end{cases}

    the authors' ``calc_poet_grad_clipping_value`` (POET-X, arXiv 2603.05500, reference code,
    ``poet_torch/utils/model_utils.py``) evaluated on the completed-step count, as their
    driver does: the first update after a merge (``k = 0``) clips at :math:`f c`, the ramp is
    linear and reaches :math:`c` at :math:`k = W`; no warm-up before the first merge nor after
    step ``until`` (their ``gd_warmup_steps``; ``None``: after every merge).

    Args:
      count: :math:`t`, the number of completed steps; an integer scalar, may be traced.
      max_norm: :math:`c > 0`, the threshold outside the warm-up (static).
      merge_every: :math:`T_m >= 1`, steps between two merges (static).
      start_fraction: :math:`f \in (0, 1]`, fraction of :math:`c` right after a merge (static).
      warmup_steps: :math:`W >= 0`, length of the linear ramp (static).
      until: last step with a warm-up, ``>= 0``; ``None``: after every merge (static).

    Returns:
      The float32 scalar threshold :math:`c_t`.

    Raises:
      ValueError: naming the argument, if ``max_norm <= 0``, ``merge_every < 1``,
        ``start_fraction`` is outside ``(0, 1]``, ``warmup_steps < 0`` or ``until < 0``.

    References:
      POET-X, arXiv 2603.05500.
    """
    merge_every, warmup_steps, until = _check_clip_warmup(
        max_norm, merge_every, start_fraction, warmup_steps, until)
    t = jnp.asarray(count, jnp.int32)
    k = t % merge_every
    active = (t >= merge_every) & (k < warmup_steps)
    if until is not None:
        active = active & (t <= until)
    ramp = start_fraction + (1.0 - start_fraction) * k.astype(jnp.float32) / max(1, warmup_steps)
    return jnp.float32(max_norm) * jnp.where(active, ramp, jnp.float32(1.0))


def clip_by_global_norm_merge_warmup(
    max_norm: float,
    *,
    merge_every: int,
    start_fraction: float = 0.1,
    warmup_steps: int = 10,
    until: int | None = 2000,
) -> optax.GradientTransformation:
    r"""Global-norm clipping whose threshold restarts low after each POET merge.

    :math:`g \leftarrow g \min(1, c_t / \|g\|_2)` over every leaf of the tree, with
    :math:`c_t` of :func:`merge_clip_threshold` at the state's step count (the same
    arithmetic as :func:`optax.clip_by_global_norm`, to which it reduces with
    ``warmup_steps=0``). Placed before :func:`poet_x` with the same ``merge_every``, the
    threshold ramps from ``start_fraction * max_norm`` to ``max_norm`` over the
    ``warmup_steps`` updates that follow each merge-then-reinitialize, the authors' training
    driver (POET-X, arXiv 2603.05500, reference code: ``min_ratio=0.1``, ``warmup_steps=10``,
    ``gd_warmup_steps`` 2000 by default), which lets the fresh Adam moments of the rotations
    start from small steps. The authors clip every trained parameter (POET rotations and the
    other leaves) together; so does this transform, over whatever tree it is given (the frozen
    POET leaves have zero gradients).

    Args:
      max_norm: the threshold :math:`c` outside the warm-up.
      merge_every: the merge interval :math:`T_m` of the :func:`poet_x` that follows (static).
      start_fraction: threshold of the first update after a merge, as a fraction of
        ``max_norm``, in ``(0, 1]``.
      warmup_steps: length :math:`W` of the linear ramp, ``>= 0`` (0: constant clipping).
      until: last step count with a warm-up (the authors' ``gd_warmup_steps``); ``None``: no
        limit.

    Example:
      >>> import jax.numpy as jnp
      >>> from jaxlib_ext.optim import clip_by_global_norm_merge_warmup
      >>> tx = clip_by_global_norm_merge_warmup(1.0, merge_every=2)
      >>> g = {"w": jnp.full((4,), 10.0)}
      >>> s = tx.init(g)
      >>> for _ in range(3):
      ...     u, s = tx.update(g, s)
      >>> round(float(jnp.linalg.norm(u["w"])), 4)  # the first update after the merge at 2
      0.1
    """
    merge_every, warmup_steps, until = _check_clip_warmup(
        max_norm, merge_every, start_fraction, warmup_steps, until)

    def init_fn(params):
        del params
        return ClipMergeWarmupState(count=jnp.zeros([], jnp.int32))

    def update_fn(updates, state, params=None):
        del params
        c = merge_clip_threshold(state.count, max_norm, merge_every=merge_every,
                                 start_fraction=start_fraction, warmup_steps=warmup_steps,
                                 until=until)
        g_norm = optax.tree.norm(updates)
        trigger = jnp.squeeze(g_norm < c)

        def clip(t):
            return jax.lax.select(trigger, t, (t / g_norm.astype(t.dtype)) * c.astype(t.dtype))

        updates = jax.tree.map(clip, updates)
        return updates, ClipMergeWarmupState(count=optax.safe_increment(state.count))

    return optax.GradientTransformation(init_fn, update_fn)
