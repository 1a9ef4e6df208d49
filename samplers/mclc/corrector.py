"""MCLC: the measurement-consistent Langevin corrector (Lee, Lim, Cha, Oh, arXiv 2601.04791).

A plug-in for latent-diffusion inverse solvers: after the solver's step has produced a latent
``z`` at noise level ``t``, ``K`` Langevin steps on the diffusion prior ``p_t`` pull ``z`` back
toward the stable reverse diffusion, while a constraint keeps the measurement residual
``r(z, t) = ||y - A D(zhat_0(z, t))||`` of (P.5) from increasing.

**The published update.** The paper's text could not be read here; the update follows the
published descriptions of it (the method's equations of sec. 3 as summarised in secondary
notes: a Langevin step at the solver's current level whose drift and noise are both projected
onto the orthogonal complement of the normalised residual gradient, first-order consistency
only). Each corrector step, with ``xi ~ N(0, I)``, the score ``s = -eps_model(z, t) /
sqrt(1 - abar_t)`` of (P.4) and ``g = grad_z r / ||grad_z r||``::

    Delta = eta_t s + sqrt(2 eta_t) xi                                                   (C.2)
    z    <- z + (I - g g^T) Delta                 (constraint="projection", the default) (C.3)

To first order the residual does not move; its increase per step is second order in the step
(the paper's consistency theorem bounds it when the expected squared step ``E||Delta||^2`` is
below 1, a dimension-dependent bound on ``eta_t``). Nothing brings it back, so over many steps
the rises add up: on the linear-Gaussian oracle (:mod:`.gaussian`) the projection alone lets
the residual grow and does not keep the posterior, where the ``"tangent"`` option below does.

**Step size.** ``eta_t`` is a tuned hyper-parameter in the paper, under that bound. Here:

* ``step_rule="variance"`` (default): ``eta_t = c (1 - abar_t)``, proportional to the level's
  noise variance, with ``c = step_scale``. With the Gaussian-score estimate ``||s||^2 ~ d /
  (1 - abar_t)`` (``d`` the latent dimension) the expected squared step is::

      E||Delta||^2 ~ eta_t^2 d / (1 - abar_t) + 2 eta_t d = d (1 - abar_t) (c^2 + 2 c)    (C.4)

  ``step_scale=None`` takes ``c = 1 / (4 d)``, our choice: (C.4) at about 1/2 at the noisiest
  level. Tune ``c`` on a grid as the solver's guidance weight is tuned.
* ``step_rule="snr"`` (ours, the earlier reconstruction): the signal-to-noise rule of Song et
  al. (arXiv 2011.13456, Alg. 5), ``eta = 2 (snr ||xi|| / ||s||)^2`` (C.1), about ``2 snr^2 (1
  - abar_t)``: at ``snr = 0.16`` and ``d = 196`` (C.4) is near 20, far past the bound. With
  per-chain norms the step depends on the state, and an unadjusted chain with a
  state-dependent ``eta(z)`` samples ``p(z) / eta(z)``; ``axis_name=`` averages both norms
  over a named ``vmap`` axis of chains, as Song et al. average them over the batch.
* ``step_size=``: a fixed ``eta``, or a ``(T,)`` schedule ``eta_t`` indexed by ``t``.

When the step is known at trace time (every rule but ``"snr"``), (C.4) is checked over the
schedule and :class:`StepBoundWarning` raised where it exceeds 1.

**Our options** (``constraint=`` takes a name or a function, see :data:`CONSTRAINTS`):

* ``"tangent"``: the projection of (C.3), then a return to the level set ``{r = r(z)}`` along
  ``v = J^T (rho + J Delta_tan)``, ``J`` the residual's Jacobian: ``z + Delta_tan - zeta v``
  with ``zeta`` the smallest root of ``||rho + J (Delta_tan - zeta v)|| = r``; steps whose
  level set is unreachable under the Gauss-Newton model are rejected (``z`` unchanged,
  ``CorrectorInfo.rejected``). Neither the retraction nor the rejection is in the paper. It
  is a constrained overdamped Langevin scheme in the manner of Lelievre, Rousset and Stoltz
  (Math. Comp. 81, 2012): it preserves ``p_t`` restricted to ``{r = c}`` up to ``O(eta)``, and
  the residual is non-increasing step by step where ``D``, ``A`` and ``zhat_0`` are affine.
  Where the likelihood is a function of ``r`` only (the DPS surrogate) the posterior
  restricted to a level set equals the prior restricted to it, up to the co-area factor
  ``|grad r|`` (constant on level sets when the linearised residual map has orthogonal rows of
  equal norm).
* ``"compensate"``: keep the isotropic increment and add ``-zeta v``, ``v = J^T (rho + J
  Delta)``, with the smallest ``zeta >= 0`` for which the predicted residual does not exceed
  ``r``; it drifts toward lower residuals and does not leave the posterior invariant.
* ``"none"``: plain Langevin on ``p_t`` (an ablation; not measurement-consistent).

The constrained forms predict the residual with the Gauss-Newton model ``rho(z + u) ~ rho + J
u``, exact when ``D``, ``A`` and ``zhat_0`` are affine.

Cost per corrector step: one ``eps_model`` evaluation, linearised (the residual's gradient
``J^T rho`` and the prediction ``J u``; the retraction adds one more of each).

**Layout** (BlackJAX's, :mod:`jaxlib_ext.samplers.base`): :func:`init` makes a
:class:`CorrectorState`, :func:`build_kernel` returns ``kernel(rng_key, state, problem, t) ->
(state, info)``, one step (C.2)-(C.3) with a :class:`CorrectorInfo`; :func:`mclc_sampler` binds
a problem and a level and returns a :class:`~jaxlib_ext.samplers.base.SamplingAlgorithm`;
:func:`mclc_correct` runs ``K`` steps, and :func:`mclc` binds its settings into the
``corrector=`` hook of the solvers.
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxlib_ext.samplers.base import SamplingAlgorithm
from jaxlib_ext.samplers.mclc.problem import (
    LatentInverseProblem,
    ResidualLinearization,
    residual_linearization,
)

__all__ = [
    "CONSTRAINTS",
    "MCLC",
    "STEP_RULES",
    "CorrectorInfo",
    "CorrectorState",
    "StepBoundWarning",
    "build_kernel",
    "compensation_constraint",
    "expected_squared_step",
    "init",
    "mclc",
    "mclc_correct",
    "mclc_sampler",
    "no_constraint",
    "projection_constraint",
    "tangent_constraint",
]

#: ``"variance"``: ``eta_t = c (1 - abar_t)`` (default); ``"snr"``: (C.1), ours.
STEP_RULES = ("variance", "snr")


class StepBoundWarning(UserWarning):
    """The expected squared corrector step (C.4) exceeds 1, the paper's consistency bound."""


class CorrectorState(NamedTuple):
    """One chain of the corrector.

    Attributes:
      z: the latent, of ``problem.latent_shape``.
    """

    z: jax.Array


class CorrectorInfo(NamedTuple):
    """Diagnostics of corrector steps: scalars from the kernel of :func:`build_kernel`, each of
    shape ``(K,)`` from :func:`mclc_correct`.

    Attributes:
      residual: ``r(z, t)`` before each step.
      predicted_residual: the Gauss-Newton prediction of ``r`` after it.
      step_size: ``eta_t``.
      rejected: whether the step was rejected (only the ``"tangent"`` and ``"compensate"``
        options reject).
      squared_step: ``||z' - z||^2``, the squared norm of the applied step.
    """

    residual: jax.Array
    predicted_residual: jax.Array
    step_size: jax.Array
    rejected: jax.Array
    squared_step: jax.Array


def expected_squared_step(eta, one_minus_abar, latent_dim):
    """(C.4): ``eta^2 d / (1 - abar) + 2 eta d``, the expected squared step under the
    Gaussian-score estimate ``||s||^2 ~ d / (1 - abar)``.

    Args:
      eta: the step ``eta_t`` (scalar or array).
      one_minus_abar: ``1 - abar_t`` (broadcasting with ``eta``).
      latent_dim: ``d``.

    Returns:
      ``E||Delta||^2`` of (C.2), of the broadcast shape.
    """
    return eta ** 2 * latent_dim / one_minus_abar + 2.0 * eta * latent_dim


def _dot(a, b):
    return jnp.sum(a * b)


def _retract(p_shift, lin: ResidualLinearization):
    """Return to the level set ``{||rho|| = r}`` under the Gauss-Newton model.

    The predicted residual is ``p = rho + a`` with ``a = p_shift``; move along ``v = J^T p``
    (the Gauss-Newton gradient of ``||p||^2 / 2``), so ``p -> p - zeta J v``. With
    ``qa = ||J v||^2``, ``qb = <p, J v> = ||v||^2`` and ``dq = ||p||^2 - r^2 = ||a||^2 +
    2 <rho, a>`` the level is reached at the smaller root of
    ``qa zeta^2 - 2 qb zeta + dq = 0``, in its stable form. Returns ``(v, zeta, reachable,
    dq)``.
    """
    p = lin.residual + p_shift
    v = lin.vjp(p)
    jv = lin.jvp(v)
    qa, qb = _dot(jv, jv), _dot(v, v)
    dq = _dot(p_shift, p_shift) + 2.0 * _dot(lin.residual, p_shift)
    disc = qb ** 2 - qa * dq
    denom = qb + jnp.sqrt(jnp.maximum(disc, 0.0))
    zeta = dq / jnp.where(denom > 0, denom, 1.0)
    reachable = (disc >= 0) & (denom > 0)
    return v, zeta, reachable, dq


def _project(delta, lin: ResidualLinearization):
    """``((I - g g^T) delta, active)`` of (C.3), ``active`` where the residual's gradient is
    nonzero (elsewhere ``delta`` is returned as it is)."""
    gg = _dot(lin.grad, lin.grad)
    active = gg > 0
    return delta - (_dot(delta, lin.grad) / jnp.where(active, gg, 1.0)) * lin.grad, active


def projection_constraint(delta, lin: ResidualLinearization):
    """The published form (C.3): ``(I - g g^T) delta``, no retraction, no rejection.

    Args:
      delta: the increment (C.2), of the latent's shape.
      lin: the :class:`~jaxlib_ext.samplers.mclc.ResidualLinearization` at the current latent.

    Returns:
      ``(increment, predicted residual, rejected=False)``.

    References:
      Lee, Lim, Cha, Oh, arXiv 2601.04791, sec. 3.
    """
    return no_constraint(_project(delta, lin)[0], lin)


def tangent_constraint(delta, lin: ResidualLinearization):
    """Tangent projection with return to the level set (module docstring; ours).

    Args:
      delta: the increment (C.2), of the latent's shape.
      lin: the :class:`~jaxlib_ext.samplers.mclc.ResidualLinearization` at the current latent.

    Returns:
      ``(increment, predicted residual, rejected)``.

    References:
      Lelievre, Rousset, Stoltz, Langevin dynamics with constraints and computation of free
      energy differences, Math. Comp. 81, 2012.
    """
    tangent, active = _project(delta, lin)
    v, zeta, reachable, dq = _retract(lin.jvp(tangent), lin)
    reject = active & ~reachable
    out = jnp.where(active, tangent - zeta * v, delta)
    out = jnp.where(reject, jnp.zeros_like(delta), out)
    # on the level set when active; otherwise (g = 0) the unconstrained prediction
    pred = jnp.where(active, lin.norm, jnp.sqrt(jnp.maximum(lin.norm ** 2 + dq, 0.0)))
    return out, pred, reject


def compensation_constraint(delta, lin: ResidualLinearization):
    """First-order compensation, one-sided (module docstring; ours).

    Args:
      delta: the increment (C.2), of the latent's shape.
      lin: the :class:`~jaxlib_ext.samplers.mclc.ResidualLinearization` at the current latent.

    Returns:
      ``(increment, predicted residual, rejected)``.
    """
    v, zeta, reachable, dq = _retract(lin.jvp(delta), lin)
    increases = dq > 0
    reject = increases & ~reachable
    out = jnp.where(increases, delta - zeta * v, delta)
    out = jnp.where(reject, jnp.zeros_like(delta), out)
    pred = jnp.where(increases, lin.norm, jnp.sqrt(jnp.maximum(lin.norm ** 2 + dq, 0.0)))
    return out, pred, reject


def no_constraint(delta, lin: ResidualLinearization):
    """Plain Langevin (an ablation; not measurement-consistent).

    Args:
      delta: the increment (C.2), of the latent's shape.
      lin: the :class:`~jaxlib_ext.samplers.mclc.ResidualLinearization` at the current latent.

    Returns:
      ``(delta, predicted residual, False)``.
    """
    p = lin.residual + lin.jvp(delta)
    return delta, jnp.sqrt(_dot(p, p)), jnp.zeros((), bool)


CONSTRAINTS: dict[str, Callable] = {
    "projection": projection_constraint,
    "tangent": tangent_constraint,
    "compensate": compensation_constraint,
    "none": no_constraint,
}


def _resolve_constraint(constraint):
    if callable(constraint):
        return constraint
    if constraint in CONSTRAINTS:
        return CONSTRAINTS[constraint]
    raise ValueError(f"constraint: expected one of {sorted(CONSTRAINTS)} or a callable "
                     f"(delta, linearization) -> (delta, predicted_residual, rejected), got "
                     f"{constraint!r}")


def _is_positive(v):
    return math.isfinite(float(v)) and float(v) > 0


def _check_num_steps(num_steps):
    if isinstance(num_steps, bool) or not isinstance(num_steps, int) or num_steps < 1:
        raise ValueError(f"num_steps: expected an int >= 1, got {num_steps!r}")


def _check_corrector_args(snr, step_size, constraint, step_rule, step_scale):
    if step_rule not in STEP_RULES:
        raise ValueError(f"step_rule: expected one of {STEP_RULES}, got {step_rule!r}")
    if not isinstance(snr, jax.core.Tracer) and not _is_positive(snr):
        raise ValueError(f"snr: expected a positive finite number, got {snr!r}")
    if step_scale is not None and not isinstance(step_scale, jax.core.Tracer) and not (
            _is_positive(step_scale)):
        raise ValueError(f"step_scale: expected a positive finite number or None (1 / (4 d)), "
                         f"got {step_scale!r}")
    if step_size is not None and not isinstance(step_size, jax.core.Tracer):
        arr = np.asarray(step_size)
        if arr.ndim > 1:
            raise ValueError(f"step_size: expected a number or a (T,) schedule, got shape "
                             f"{arr.shape}")
        if np.any(~(np.isfinite(arr) & (arr > 0))):
            raise ValueError(f"step_size: expected positive finite value(s) or None, got "
                             f"{step_size!r}")
    return _resolve_constraint(constraint)


def _step_schedule(problem, step_size, step_rule, step_scale):
    """``eta_t`` for every ``t`` as a ``(T,)`` array, or ``None`` for the SNR rule."""
    one_minus = 1.0 - problem.alpha_bars
    if step_size is not None:
        eta = jnp.asarray(step_size, one_minus.dtype)
        if eta.ndim == 1 and eta.shape != one_minus.shape:
            raise ValueError(f"step_size: a schedule needs one value per level, "
                             f"{one_minus.shape[0]} (len(alpha_bars)), got {eta.shape[0]}")
        return jnp.broadcast_to(eta, one_minus.shape)
    if step_rule == "snr":
        return None
    d = math.prod(problem.latent_shape)
    c = 1.0 / (4.0 * d) if step_scale is None else step_scale
    return c * one_minus


def _warn_if_past_bound(problem, etas, stacklevel):
    """(C.4) over the schedule, when it is concrete; warns where it exceeds 1."""
    try:
        e = jax.device_get(etas)
        one_minus = jax.device_get(1.0 - problem.alpha_bars)
    except jax.errors.ConcretizationTypeError:
        return
    if isinstance(e, jax.core.Tracer) or isinstance(one_minus, jax.core.Tracer):
        return
    d = math.prod(problem.latent_shape)
    noisy = one_minus > 0
    if not noisy.any():
        return
    bound = expected_squared_step(e[noisy], one_minus[noisy], d)
    if bound.max() > 1.0:
        warnings.warn(f"mclc: the expected squared corrector step (C.4) reaches "
                      f"{float(bound.max()):.3g} > 1 at latent dimension {d}, past the paper's "
                      f"consistency bound; lower step_scale or step_size", StepBoundWarning,
                      stacklevel=stacklevel)


def _check_latent(z, problem):
    if tuple(jnp.shape(z)) != tuple(problem.latent_shape):
        raise ValueError(f"z: expected shape {tuple(problem.latent_shape)} (latent_shape), got "
                         f"{tuple(jnp.shape(z))}")


def init(position) -> CorrectorState:
    """The corrector's state at a latent.

    Args:
      position: one latent ``z`` of ``problem.latent_shape``.

    Returns:
      A :class:`CorrectorState`.
    """
    return CorrectorState(jnp.asarray(position))


def build_kernel(*, step_rule: str = "variance", step_scale: float | None = None,
                 snr: float = 0.16, step_size=None, constraint: str | Callable = "projection",
                 axis_name=None) -> Callable:
    """One corrector step (C.2)-(C.3) as a kernel.

    The kernel ``kernel(rng_key, state, problem, t) -> (state, info)`` moves the
    :class:`CorrectorState` by one constrained Langevin step on ``p_t`` at noise level ``t``
    (an int index into ``problem.alpha_bars`` with ``abar_t < 1``); one ``eps_model``
    evaluation, linearised.

    Args:
      step_rule: ``"variance"`` (``eta_t = step_scale (1 - abar_t)``, the default) or ``"snr"``
        ((C.1) with ``snr``, ours).
      step_scale: ``c > 0`` of the variance rule, or ``None`` for ``1 / (4 d)`` (our choice:
        (C.4) at about 1/2 at the noisiest level).
      snr: the signal-to-noise ratio of (C.1), ``> 0``.
      step_size: a fixed ``eta`` or a ``(T,)`` schedule ``eta_t``, replacing the rule.
      constraint: ``"projection"`` (the published form (C.3)), ``"tangent"``,
        ``"compensate"``, ``"none"`` or a function ``(delta, ResidualLinearization) -> (delta,
        predicted_residual, rejected)``.
      axis_name: average the norms of (C.1) over this named ``vmap`` axis of chains.

    Returns:
      ``kernel(rng_key, state, problem, t) -> (CorrectorState, CorrectorInfo)``, the info of
      the one step (scalars).

    Raises:
      ValueError: naming the argument (``step_rule``, ``step_scale``, ``snr``, ``step_size``,
        ``constraint``); a schedule of the wrong length when the kernel runs.

    References:
      Lee, Lim, Cha, Oh, arXiv 2601.04791, sec. 3; Song et al., arXiv 2011.13456, Alg. 5
      (the SNR rule).
    """
    level, move = _level_and_move(step_rule, step_scale, snr, step_size, constraint, axis_name)

    def kernel(rng_key, state: CorrectorState, problem: LatentInverseProblem, t):
        return move(rng_key, state, problem, t, *level(problem, t))

    return kernel


def _level_and_move(step_rule, step_scale, snr, step_size, constraint, axis_name):
    """The two halves of the kernel: ``level(problem, t) -> (sigma_t, eta_t)`` (``eta_t`` None
    for the SNR rule), fixed at one level, and ``move(rng_key, state, problem, t, sigma_t,
    eta_t) -> (state, info)``, one step (C.2)-(C.3)."""
    cfn = _check_corrector_args(snr, step_size, constraint, step_rule, step_scale)

    def level(problem, t):
        sigma = jnp.sqrt(1.0 - problem.alpha_bars[t])
        etas = _step_schedule(problem, step_size, step_rule, step_scale)
        return sigma, None if etas is None else etas[t]

    def move(rng_key, state, problem, t, sigma, eta_t):
        z = state.z
        lin = residual_linearization(problem, z, t)
        xi = jax.random.normal(rng_key, z.shape, z.dtype)
        score = -lin.eps / sigma  # (P.4)
        if eta_t is None:  # (C.1)
            xi_norm, s_norm = jnp.sqrt(_dot(xi, xi)), jnp.sqrt(_dot(score, score))
            if axis_name is not None:
                xi_norm = jax.lax.pmean(xi_norm, axis_name)
                s_norm = jax.lax.pmean(s_norm, axis_name)
            ratio = xi_norm / jnp.maximum(s_norm, 1e-12)
            eta = 2.0 * (snr * ratio) ** 2
        else:
            eta = eta_t.astype(z.dtype)
        delta = eta * score + jnp.sqrt(2.0 * eta) * xi  # (C.2)
        inc, pred, rej = cfn(delta, lin)
        info = CorrectorInfo(lin.norm, pred, eta, rej, _dot(inc, inc))
        return CorrectorState(z + inc), info  # (C.3)

    return level, move


def mclc_sampler(problem: LatentInverseProblem, t, *, step_rule: str = "variance",
                 step_scale: float | None = None, snr: float = 0.16, step_size=None,
                 constraint: str | Callable = "projection", axis_name=None) -> SamplingAlgorithm:
    """The corrector at one noise level as a sampling algorithm: ``init(position)`` and
    ``step(rng_key, state)``, one step (C.2)-(C.3) on ``p_t`` under the constraint.

    Args:
      problem: the :class:`~jaxlib_ext.samplers.mclc.LatentInverseProblem`.
      t: the noise level, an int index into ``problem.alpha_bars`` with ``abar_t < 1``.
      step_rule, step_scale, snr, step_size, constraint, axis_name: as :func:`build_kernel`.

    Returns:
      A :class:`~jaxlib_ext.samplers.base.SamplingAlgorithm` over :class:`CorrectorState` with
      :class:`CorrectorInfo`.

    Raises:
      TypeError: ``problem`` is not a ``LatentInverseProblem``.
      ValueError: naming the argument, as :func:`build_kernel`, or ``t`` out of range.

    Warns:
      StepBoundWarning: (C.4) exceeds 1 somewhere on the schedule (known steps only).

    References:
      Lee, Lim, Cha, Oh, arXiv 2601.04791, sec. 3.
    """
    if not isinstance(problem, LatentInverseProblem):
        raise TypeError(f"problem: expected a LatentInverseProblem (see "
                        f"latent_inverse_problem), got {type(problem).__name__}")
    num_levels = problem.alpha_bars.shape[0]
    if not isinstance(t, jax.core.Tracer) and (
            isinstance(t, bool) or np.ndim(t) != 0
            or not np.issubdtype(np.asarray(t).dtype, np.integer) or not 0 <= int(t) < num_levels):
        raise ValueError(f"t: expected an int in [0, {num_levels - 1}], got {t!r}")
    kernel = build_kernel(step_rule=step_rule, step_scale=step_scale, snr=snr,
                          step_size=step_size, constraint=constraint, axis_name=axis_name)
    etas = _step_schedule(problem, step_size, step_rule, step_scale)
    if etas is not None:
        _warn_if_past_bound(problem, etas, stacklevel=3)

    def init_fn(position):
        _check_latent(position, problem)
        return init(position)

    def step_fn(rng_key, state):
        return kernel(rng_key, state, problem, t)

    return SamplingAlgorithm(init_fn, step_fn)


def mclc_correct(rng_key, z, t, problem: LatentInverseProblem, *, num_steps: int = 1,
                 step_rule: str = "variance", step_scale: float | None = None,
                 snr: float = 0.16, step_size=None, constraint: str | Callable = "projection",
                 axis_name=None):
    """``num_steps`` corrector steps (C.2)-(C.3) at noise level ``t``: the kernel of
    :func:`build_kernel` scanned over ``num_steps`` keys split from ``rng_key``.

    Args:
      rng_key: PRNG key.
      z: one latent of ``problem.latent_shape``.
      t: int index into ``problem.alpha_bars`` (``abar_t < 1``).
      problem: the :class:`~jaxlib_ext.samplers.mclc.LatentInverseProblem`.
      num_steps: corrector steps ``K >= 1`` (network evaluations).
      step_rule: ``"variance"`` (``eta_t = step_scale (1 - abar_t)``) or ``"snr"`` ((C.1) with
        ``snr``).
      step_scale: ``c > 0``, or ``None`` for ``1 / (4 d)``.
      snr: the signal-to-noise ratio of (C.1).
      step_size: a fixed ``eta`` or a ``(T,)`` schedule, replacing the rule.
      constraint: ``"projection"`` (the published form), ``"tangent"``, ``"compensate"``,
        ``"none"`` or a function ``(delta, ResidualLinearization) -> (delta,
        predicted_residual, rejected)``.
      axis_name: average the norms of (C.1) over this named ``vmap`` axis.

    Returns:
      ``(z, CorrectorInfo)``: the corrected latent and the per-step diagnostics, each of shape
      ``(K,)``.

    Raises:
      ValueError: naming the argument (``num_steps``, ``step_rule``, ``step_scale``, ``snr``,
        ``step_size`` including a schedule of the wrong length, ``constraint``, ``z``).

    Warns:
      StepBoundWarning: (C.4) exceeds 1 somewhere on the schedule (known steps only).

    References:
      Lee, Lim, Cha, Oh, arXiv 2601.04791, sec. 3.
    """
    _check_num_steps(num_steps)
    level, move = _level_and_move(step_rule, step_scale, snr, step_size, constraint, axis_name)
    _check_latent(z, problem)
    etas = _step_schedule(problem, step_size, step_rule, step_scale)
    if etas is not None:
        _warn_if_past_bound(problem, etas, stacklevel=3)
    sigma, eta_t = level(problem, t)  # fixed over the K steps at this level

    def body(state, key):
        return move(key, state, problem, t, sigma, eta_t)

    state, info = jax.lax.scan(body, init(z), jax.random.split(rng_key, num_steps))
    return state.z, info


@dataclasses.dataclass(frozen=True)
class MCLC:
    """:func:`mclc_correct` with its settings bound: the ``corrector=`` of the solvers.

    ``corrector(rng_key, z, t, problem) -> (z, CorrectorInfo)``; ``num_steps`` is the number of
    extra network evaluations per solver step. Fields as the arguments of
    :func:`mclc_correct`."""

    num_steps: int = 1
    step_rule: str = "variance"
    step_scale: float | None = None
    snr: float = 0.16
    step_size: Any = None
    constraint: str | Callable = "projection"
    axis_name: Any = None

    def __post_init__(self):
        _check_num_steps(self.num_steps)
        _check_corrector_args(self.snr, self.step_size, self.constraint, self.step_rule,
                              self.step_scale)

    def __call__(self, rng_key, z, t, problem):
        return mclc_correct(rng_key, z, t, problem, num_steps=self.num_steps,
                            step_rule=self.step_rule, step_scale=self.step_scale, snr=self.snr,
                            step_size=self.step_size, constraint=self.constraint,
                            axis_name=self.axis_name)


def mclc(num_steps: int = 1, step_scale: float | None = None, *, step_rule: str = "variance",
         snr: float = 0.16, step_size=None, constraint: str | Callable = "projection",
         axis_name=None) -> MCLC:
    """The corrector to pass as ``corrector=`` to
    :func:`~jaxlib_ext.samplers.mclc.latent_dps` or :func:`~jaxlib_ext.samplers.mclc.psld`.

    Args:
      num_steps: corrector steps ``K >= 1`` after each solver step but the last.
      step_scale: ``c > 0`` of the variance rule, or ``None`` for ``1 / (4 d)``.
      step_rule: ``"variance"`` (default) or ``"snr"``.
      snr: the signal-to-noise ratio of (C.1).
      step_size: a fixed ``eta`` or a ``(T,)`` schedule, replacing the rule.
      constraint: ``"projection"`` (the published form), ``"tangent"``, ``"compensate"``,
        ``"none"`` or a constraint function.
      axis_name: average the norms of (C.1) over this named ``vmap`` axis.

    Returns:
      An :class:`MCLC`, ``corrector(rng_key, z, t, problem) -> (z, CorrectorInfo)``.

    Raises:
      ValueError: naming the argument, as :func:`mclc_correct`.

    References:
      Lee, Lim, Cha, Oh, arXiv 2601.04791.
    """
    return MCLC(num_steps, step_rule, step_scale, snr, step_size, constraint, axis_name)
