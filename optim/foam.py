r"""FOAM: Adam with block-folded first and second moments (arXiv 2512.07112).

Wen, Wang, Luo, Li, Sun, "FOAM: Blocked State Folding for Memory-Efficient LLM Training",
ICML 2026. Semantics follow the authors' released optimizer (github.com/zqOuO/FOAM,
``foam_torch/foam_adam.py``), which produced the published numbers; the paper-text variant is an
option.

For a folded tensor with gradient :math:`g`, fold axis of size :math:`n`, level :math:`l` and
block size :math:`B = 2^l`, let :math:`F` zero-pad the fold axis to :math:`\lceil n/B\rceil B`
and average each block of :math:`B` entries (the divisor is always :math:`B`, also for a partial
last block), and :math:`U` repeat each folded entry :math:`B` times and crop to :math:`n`
(so :math:`F(U(x)) = x`). At step :math:`t \ge 1`:

.. math::

   \bar g &= F(g), \qquad \overline{g^2} = F(g \odot g)
      \;\; (\text{or } \bar g^2 \text{ for } \texttt{second\_moment="square\_of\_mean"})
                                                                       && \text{(1) fold} \\
   R &= g - U(\bar g)                                                   && \text{(2) residual} \\
   \tilde m_t &= \beta_1 \tilde m_{t-1} + (1-\beta_1)\bar g,\quad
   \tilde v_t = \beta_2 \tilde v_{t-1} + (1-\beta_2)\overline{g^2}       && \text{(3) EMAs} \\
   m &= U(\tilde m_t) + \alpha R, \qquad v = U(\tilde v_t) + \alpha^2 R^2 && \text{(4) unfold} \\
   u &= s \,\frac{\sqrt{1-\beta_2^t}}{1-\beta_1^t}\,\frac{m}{\sqrt v + \epsilon}
                                                                       && \text{(5) update}

with :math:`\alpha` = ``res_scale`` and :math:`s` = ``scale`` (folded leaves only). Only
:math:`\tilde m, \tilde v` are stored, of the folded shape, so the state of a folded tensor is
:math:`B` times smaller than Adam's. Leaves that are not folded get HF-style AdamW with the same
hyperparameters and no ``scale``. ``foam`` then multiplies by :math:`-\eta_t` and applies the
reference code's decoupled weight decay to the already-updated parameters,

.. math:: p \leftarrow (p - \eta_t u)(1 - \eta_t\lambda).   \qquad \text{(6) weight decay}

Equations (1)-(5) are numbered in this docstring; the paper writes the same step with fold and
unfold matrices, :math:`\tilde G = G A^{(l)}` and :math:`M = \tilde M E^{(l)} + R`. Where the
paper's text and the released code differ, the code is the default and the text an option: the
second-moment input of (1) is the code's block mean of :math:`g^2` (the text's square of the block
mean with ``second_moment="square_of_mean"``; the two agree for block-constant gradients); ``eps``
is added to :math:`\sqrt v` before the bias-correction factor in (5) (HF AdamW, not optax's
placement); the default ``fold_axis=-2`` is the input-feature axis of a Flax ``(in, out)`` kernel,
the axis the authors fold on a PyTorch ``(out, in)`` weight. The partial last block of (1) is
zero-padded and still divided by :math:`B`, as in the code.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from jaxlib_ext.optim import _common

_SECOND_MOMENTS = ("mean_of_squares", "square_of_mean")


class ScaleByFoamState(NamedTuple):
    """State of :func:`scale_by_foam`.

    Attributes:
      count: number of updates done so far (int32 scalar).
      mu: first moments; folded leaves have the fold axis shrunk to ``ceil(n / 2**level)``.
      nu: second moments, same shapes as ``mu``.
    """

    count: jax.Array
    mu: Any
    nu: Any


def _axis(fold_axis: int, ndim: int, path=None) -> int:
    if not -ndim <= fold_axis < ndim:
        where = f" for leaf {jax.tree_util.keystr(path)}" if path is not None else ""
        raise ValueError(
            f"fold_axis: expected an axis in [{-ndim}, {ndim}) for a {ndim}-d leaf{where}, "
            f"got {fold_axis}"
        )
    return fold_axis % ndim


def fold(x: jax.Array, level: int, axis: int = -2) -> jax.Array:
    """Fold operator ``F``: zero-pad ``axis`` to a multiple of ``2**level``, average each block.

    The divisor is always ``2**level``, also for a partial last block (as the reference code).

    Args:
      x: array to fold.
      level: fold level :math:`l >= 0`; blocks of :math:`2^l` entries (``0`` returns ``x``).
      axis: axis of ``x`` that is folded (negative values count from the end).

    Returns:
      ``x`` with ``axis`` of size ``ceil(x.shape[axis] / 2**level)`` (see :func:`folded_shape`).
    """
    axis = _axis(axis, x.ndim)
    b = 2**level
    if b == 1:
        return x
    n = x.shape[axis]
    nb = -(-n // b)
    if nb * b != n:
        pad = [(0, 0)] * x.ndim
        pad[axis] = (0, nb * b - n)
        x = jnp.pad(x, pad)
    x = x.reshape(x.shape[:axis] + (nb, b) + x.shape[axis + 1 :])
    return jnp.sum(x, axis=axis + 1) / b


def unfold(x: jax.Array, level: int, size: int, axis: int = -2) -> jax.Array:
    """Unfold operator ``U``: repeat entries ``2**level`` times along ``axis``, crop to ``size``.

    Args:
      x: folded array.
      level: fold level :math:`l >= 0` used by :func:`fold` (``0`` returns ``x``).
      size: length of ``axis`` before folding; the repeated axis is cropped to it.
      axis: axis of ``x`` that is unfolded (negative values count from the end).

    Returns:
      ``x`` with ``axis`` of length ``size``.
    """
    axis = _axis(axis, x.ndim)
    b = 2**level
    if b == 1:
        return x
    nb = x.shape[axis]
    # broadcast + reshape instead of jnp.repeat: it keeps an explicit sharding of `axis`.
    x = jnp.expand_dims(x, axis + 1)
    x = jnp.broadcast_to(x, x.shape[: axis + 1] + (b,) + x.shape[axis + 2 :])
    x = x.reshape(x.shape[:axis] + (nb * b,) + x.shape[axis + 2 :])
    if nb * b == size:
        return x
    return jax.lax.slice_in_dim(x, 0, size, axis=axis)


def folded_shape(shape: tuple[int, ...], level: int, axis: int = -2) -> tuple[int, ...]:
    """Shape of ``fold(x, level, axis)`` for ``x`` of ``shape``.

    Args:
      shape: shape of the unfolded array.
      level: fold level :math:`l >= 0`.
      axis: folded axis (negative values count from the end).

    Returns:
      ``shape`` with ``shape[axis]`` replaced by ``ceil(shape[axis] / 2**level)``.
    """
    axis = _axis(axis, len(shape))
    shape = list(shape)
    shape[axis] = -(-shape[axis] // 2**level)
    return tuple(shape)


def _validate(b1, b2, eps, level, scale, res_scale, fold_axis, second_moment):
    _common.check_scalar("b1", b1, lo=0.0, hi=1.0, hi_open=True)
    _common.check_scalar("b2", b2, lo=0.0, hi=1.0, hi_open=True)
    _common.check_scalar("eps", eps, lo=0.0)
    _common.check_scalar("scale", scale)
    _common.check_scalar("res_scale", res_scale)
    level = _common.check_int("level", level, lo=0)
    fold_axis = _common.check_int("fold_axis", fold_axis)
    if second_moment not in _SECOND_MOMENTS:
        raise ValueError(f"second_moment: expected one of {_SECOND_MOMENTS}, got {second_moment!r}")
    return level, fold_axis


def scale_by_foam(
    b1: float = 0.9,
    b2: float = 0.999,
    eps: float = 1e-8,
    *,
    level: int = 2,
    scale: float = 1.0,
    res_scale: float = 1.0,
    fold_axis: int = -2,
    second_moment: str = "mean_of_squares",
    fold_mask: Any = None,
) -> optax.GradientTransformation:
    r"""FOAM's preconditioner without the learning rate (for ``optax.chain``).

    Returns :math:`u` of the module docstring (positive direction; follow it with
    ``optax.scale_by_learning_rate``). See :mod:`jaxlib_ext.optim.foam` for the math.

    Args:
      b1, b2: EMA decay rates of the first and second moments.
      eps: added to :math:`\sqrt v` before the bias-correction factor (HF AdamW placement).
      level: fold level :math:`l >= 0`; block size :math:`2^l` (``level=0`` is HF AdamW).
      scale: multiplies the update of folded leaves only (the reference scripts use 0.25).
      res_scale: :math:`\alpha`, weight of the current residual added to the unfolded moments.
      fold_axis: axis folded; ``-2`` is the input-feature axis of a Flax ``(in, out)`` kernel.
      second_moment: ``"mean_of_squares"`` (code: :math:`F(g^2)`) or ``"square_of_mean"``
        (paper text: :math:`F(g)^2`).
      fold_mask: tree of bools / callable ``params -> tree`` choosing the folded leaves; default:
        ``ndim >= 2`` and the key path does not name an embedding or the LM head.

    Raises:
      ValueError: on out-of-range hyperparameters, a ``fold_axis`` out of range for a folded leaf,
        or a ``fold_mask`` tree that does not match the params.
    """
    level, fold_axis = _validate(b1, b2, eps, level, scale, res_scale, fold_axis, second_moment)

    def _mask(tree):
        return _common.resolve_mask(fold_mask, tree, _common.default_matrix_mask, name="fold_mask")

    def init_fn(params):
        mask = _mask(params)

        def zeros(path, p, folded):
            z = jnp.zeros_like(p)
            if folded:
                return fold(z, level, _axis(fold_axis, p.ndim, path))
            return z

        mu = jax.tree_util.tree_map_with_path(zeros, params, mask)
        nu = jax.tree_util.tree_map_with_path(zeros, params, mask)
        return ScaleByFoamState(count=jnp.zeros([], jnp.int32), mu=mu, nu=nu)

    def update_fn(updates, state, params=None):
        del params
        mask = _mask(updates)
        count = optax.safe_increment(state.count)

        def leaf(path, g, m, v, folded):
            dtype = m.dtype
            if not folded:  # HF AdamW: (3)-(5) with F = U = identity, R = 0, s = 1
                u, m, v = _common.hf_adam_leaf(g, m, v, count, b1, b2, eps)
                return u.astype(g.dtype), m, v
            # the reference code's bias correction, lr * sqrt(1 - b2^t) / (1 - b1^t)
            step_factor = _common.hf_step_factor(count, b1, b2, g.dtype)
            ax = _axis(fold_axis, g.ndim, path)
            n = g.shape[ax]
            gbar = fold(g, level, ax)  # (1)
            g2bar = fold(g * g, level, ax) if second_moment == "mean_of_squares" else gbar * gbar
            resid = g - unfold(gbar, level, n, ax)  # (2)
            m = b1 * m + (1.0 - b1) * gbar  # (3)
            v = b2 * v + (1.0 - b2) * g2bar
            m_full = unfold(m, level, n, ax) + res_scale * resid  # (4)
            v_full = unfold(v, level, n, ax) + (res_scale * res_scale) * (resid * resid)
            u = (scale * step_factor) * (m_full / (jnp.sqrt(v_full) + eps))  # (5)
            return u.astype(g.dtype), m.astype(dtype), v.astype(dtype)

        out = jax.tree_util.tree_map_with_path(leaf, updates, state.mu, state.nu, mask)
        treedef = jax.tree.structure(updates)
        triples = treedef.flatten_up_to(out)
        new_updates = treedef.unflatten([x[0] for x in triples])
        mu = treedef.unflatten([x[1] for x in triples])
        nu = treedef.unflatten([x[2] for x in triples])
        return new_updates, ScaleByFoamState(count=count, mu=mu, nu=nu)

    return optax.GradientTransformation(init_fn, update_fn)


def foam(
    learning_rate: optax.ScalarOrSchedule,
    b1: float = 0.9,
    b2: float = 0.999,
    eps: float = 1e-8,
    weight_decay: float = 0.0,
    *,
    level: int = 2,
    scale: float = 1.0,
    res_scale: float = 1.0,
    fold_axis: int = -2,
    second_moment: str = "mean_of_squares",
    fold_mask: Any = None,
) -> optax.GradientTransformation:
    r"""FOAM optimizer (arXiv 2512.07112): Adam with block-folded moments.

    ``chain(scale_by_foam(...), scale_by_learning_rate(learning_rate), <HF weight decay>)``: the
    parameters move by :math:`-\eta_t u` and then, when ``weight_decay`` :math:`\lambda > 0`,
    are multiplied by :math:`1 - \eta_t\lambda` (the reference code's post-update decay, applied to
    every leaf, folded or not). The paper's LLaMA runs use ``level=2, scale=0.25, b2=0.95`` with a
    peak lr of 1e-2.

    With ``optax.inject_hyperparams`` always pass ``static_args=("level", "fold_axis")``:
    ``inject_hyperparams`` turns every numeric argument into an array, defaults included, and these
    two fix the state's shapes. The state has the same structure with or without the wrapper.

    Args:
      learning_rate: :math:`\eta_t`, a non-negative scalar or an optax schedule.
      b1, b2: EMA decay rates of the first and second moments.
      eps: added to :math:`\sqrt v` before the bias-correction factor (HF AdamW placement).
      weight_decay: :math:`\lambda >= 0`, decoupled decay applied after the update.
      level: fold level :math:`l >= 0`; block size :math:`2^l` (``level=0`` is HF AdamW).
      scale: multiplies the update of folded leaves only (the reference scripts use 0.25).
      res_scale: :math:`\alpha`, weight of the current residual added to the unfolded moments.
      fold_axis: axis folded; ``-2`` is the input-feature axis of a Flax ``(in, out)`` kernel.
      second_moment: ``"mean_of_squares"`` (code: :math:`F(g^2)`) or ``"square_of_mean"``
        (paper text: :math:`F(g)^2`).
      fold_mask: tree of bools / callable ``params -> tree`` choosing the folded leaves; default:
        ``ndim >= 2`` and the key path does not name an embedding or the LM head.

    Returns:
      An ``optax.GradientTransformation``.

    Raises:
      ValueError: on a bad ``learning_rate``, a negative ``weight_decay``, or any error of
        :func:`scale_by_foam`.

    References:
      FOAM, arXiv 2512.07112.

    Example:
      >>> import jax.numpy as jnp, optax
      >>> from jaxlib_ext.optim import foam
      >>> params = {"w": jnp.ones((8, 3)), "b": jnp.zeros(3)}
      >>> opt = foam(1e-3, level=2)
      >>> state = opt.init(params)
      >>> state[0].mu["w"].shape  # folded along the input axis: 8 / 2**2
      (2, 3)
    """
    _common.check_learning_rate(learning_rate)
    _common.check_scalar("weight_decay", weight_decay, lo=0.0)
    return optax.chain(
        scale_by_foam(
            b1,
            b2,
            eps,
            level=level,
            scale=scale,
            res_scale=res_scale,
            fold_axis=fold_axis,
            second_moment=second_moment,
            fold_mask=fold_mask,
        ),
        optax.scale_by_learning_rate(learning_rate),
        _common.hf_decoupled_weight_decay(learning_rate, weight_decay),
    )
