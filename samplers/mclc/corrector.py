"""MCLC: the measurement-consistent Langevin corrector (Lee, Lim, Cha, Oh, arXiv 2601.04791).

A plug-in for latent-diffusion inverse solvers: after the solver's step has produced a latent
``z`` at noise level ``t``, ``K`` Langevin steps on the diffusion prior ``p_t`` pull ``z`` back
toward the stable reverse diffusion, while a constraint keeps the measurement residual
``r(z, t) = ||y - A D(zhat_0(z, t))||`` of (P.5) from increasing.

**Reconstructed update.** The paper's update equation could not be read; what follows is
reconstructed from its abstract (Langevin updates that stay measurement-consistent without the
linear-manifold assumption of earlier corrections) and the predictor-corrector samplers of
Song et al. (arXiv 2011.13456, Algorithm 5). Each corrector step, with ``xi ~ N(0, I)`` and the
score ``s = -eps_model(z, t) / sqrt(1 - abar_t)`` of (P.4)::

    eta   = 2 (snr ||xi|| / ||s||)^2           (the SNR rule of arXiv 2011.13456, Alg. 5)  (C.1)
    Delta = eta s + sqrt(2 eta) xi                                                       (C.2)
    z    <- z + constraint(Delta)                                                        (C.3)

(``step_size=`` replaces (C.1) by a fixed ``eta``.) With per-chain norms the step size depends
on the state, and an unadjusted Langevin chain with a state-dependent ``eta(z)`` samples
``p(z) / eta(z)`` rather than ``p(z)``: in a few dimensions that bias is large, in a latent of
hundreds of dimensions ``||xi||`` and ``||s||`` concentrate and it fades. Song et al. average
both norms over the batch; ``axis_name=`` does the same over a named ``vmap`` axis of chains,
which makes ``eta`` the same for every chain. The constraint is chosen so that ``r`` does
not increase; the form is swappable (``constraint=`` takes a name or a function, see
:data:`CONSTRAINTS`):

* ``"tangent"`` (default): project ``Delta`` onto the tangent space of the level set
  ``{r = r(z)}`` (remove its component along ``g = grad_z r``), then return to the level set
  along ``v = J^T (rho + J Delta_tan)``, ``J`` the residual's Jacobian:
  ``z + Delta_tan - zeta v`` with ``zeta`` the smallest root of
  ``||rho + J (Delta_tan - zeta v)|| = r``. ``v`` is the Gauss-Newton gradient at the
  predicted residual (``r g`` plus a term of the step's size); along ``g`` itself the line
  misses the level set whenever the step is long against ``r``, along ``v`` the predicted
  residual moves toward the origin. This is a constrained overdamped Langevin scheme in the
  manner of Lelievre, Rousset and Stoltz (Math. Comp. 81, 2012): it preserves ``p_t``
  restricted to ``{r = c}`` up to ``O(eta)``. Where the likelihood is a function of ``r`` only
  (the DPS surrogate ``N(y; A D(zhat_0), sigma_y^2 I)``) the posterior restricted to a level
  set equals the prior restricted to it, so the corrector leaves the posterior invariant up to
  the discretisation and the co-area factor ``|grad r|`` (constant on level sets when the
  linearised residual map has orthogonal rows of equal norm). It cannot change the residual's
  distribution over chains: that is the solver's guidance's job.
* ``"compensate"``: first-order compensation: keep the isotropic increment and add
  ``-zeta v``, ``v = J^T (rho + J Delta)``, with the smallest ``zeta >= 0`` for which the
  predicted residual does not exceed ``r`` (``zeta = 0`` when ``Delta`` already lowers it).
  Steps that lower the residual are kept, so this form drifts toward lower residuals (by
  ``O(sqrt(eta))`` per step) and does not leave the posterior invariant; it trades exactness
  for measurement consistency.
* ``"none"``: plain Langevin on ``p_t`` (an ablation; not measurement-consistent).

Both constrained forms predict the residual with the Gauss-Newton model
``rho(z + u) ~ rho + J u`` (two Jacobian-vector products of the one linearised network pass),
which is exact when ``D``, ``A`` and ``zhat_0`` are affine (a linear decoder and a Gaussian
latent prior); there the residual is non-increasing step by step up to round-off. If the
model says no ``zeta`` reaches the level set, the step is rejected (``z`` unchanged,
``CorrectorInfo.rejected``).

Cost per corrector step: one ``eps_model`` evaluation, linearised: two Jacobian-vector
products and two transposed ones (``J^T rho`` and ``J^T p``) of the map ``z -> rho``.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from jaxlib_ext.samplers.mclc.problem import (
    LatentInverseProblem,
    ResidualLinearization,
    residual_linearization,
)

__all__ = [
    "CONSTRAINTS",
    "MCLC",
    "CorrectorInfo",
    "compensation_constraint",
    "mclc",
    "mclc_correct",
    "no_constraint",
    "tangent_constraint",
]


class CorrectorInfo(NamedTuple):
    """Per-step diagnostics of :func:`mclc_correct`, each of shape ``(K,)``.

    residual: ``r(z, t)`` before each step. predicted_residual: the Gauss-Newton prediction of
    ``r`` after it. step_size: ``eta`` of (C.1). rejected: whether the step was rejected.
    """

    residual: jax.Array
    predicted_residual: jax.Array
    step_size: jax.Array
    rejected: jax.Array


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


def tangent_constraint(delta, lin: ResidualLinearization):
    """Tangent projection with return to the level set (module docstring):
    ``(increment, predicted residual, rejected)``."""
    gg = _dot(lin.grad, lin.grad)
    active = gg > 0
    tangent = delta - (_dot(delta, lin.grad) / jnp.where(active, gg, 1.0)) * lin.grad
    v, zeta, reachable, dq = _retract(lin.jvp(tangent), lin)
    reject = active & ~reachable
    out = jnp.where(active, tangent - zeta * v, delta)
    out = jnp.where(reject, jnp.zeros_like(delta), out)
    # on the level set when active; otherwise (g = 0) the unconstrained prediction
    pred = jnp.where(active, lin.norm, jnp.sqrt(jnp.maximum(lin.norm ** 2 + dq, 0.0)))
    return out, pred, reject


def compensation_constraint(delta, lin: ResidualLinearization):
    """First-order compensation, one-sided (module docstring):
    ``(increment, predicted residual, rejected)``."""
    v, zeta, reachable, dq = _retract(lin.jvp(delta), lin)
    increases = dq > 0
    reject = increases & ~reachable
    out = jnp.where(increases, delta - zeta * v, delta)
    out = jnp.where(reject, jnp.zeros_like(delta), out)
    pred = jnp.where(increases, lin.norm, jnp.sqrt(jnp.maximum(lin.norm ** 2 + dq, 0.0)))
    return out, pred, reject


def no_constraint(delta, lin: ResidualLinearization):
    """Plain Langevin: ``(delta, predicted residual, False)``."""
    p = lin.residual + lin.jvp(delta)
    return delta, jnp.sqrt(_dot(p, p)), jnp.zeros((), bool)


CONSTRAINTS: dict[str, Callable] = {
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


def _check_corrector_args(num_steps, snr, step_size, constraint):
    if isinstance(num_steps, bool) or not isinstance(num_steps, int) or num_steps < 1:
        raise ValueError(f"num_steps: expected an int >= 1, got {num_steps!r}")
    if not isinstance(snr, jax.core.Tracer) and not (math.isfinite(float(snr))
                                                     and float(snr) > 0):
        raise ValueError(f"snr: expected a positive finite number, got {snr!r}")
    if step_size is not None and not isinstance(step_size, jax.core.Tracer) and not (
            math.isfinite(float(step_size)) and float(step_size) > 0):
        raise ValueError(f"step_size: expected a positive finite number or None (the SNR "
                         f"rule), got {step_size!r}")
    return _resolve_constraint(constraint)


def mclc_correct(key, z, t, problem: LatentInverseProblem, *, num_steps: int = 1,
                 snr: float = 0.16, step_size: float | None = None,
                 constraint: str | Callable = "tangent", axis_name=None):
    """``num_steps`` corrector steps (C.1)-(C.3) at noise level ``t``: ``(z, CorrectorInfo)``.

    key: PRNG key. z: one latent of ``problem.latent_shape``. t: int index into
    ``problem.alpha_bars`` (``abar_t < 1``). snr: the signal-to-noise ratio of (C.1).
    step_size: a fixed ``eta`` instead of (C.1). constraint: ``"tangent"``, ``"compensate"``,
    ``"none"`` or a function ``(delta, ResidualLinearization) -> (delta, predicted_residual,
    rejected)``. axis_name: average the norms of (C.1) over this named ``vmap`` axis.
    """
    cfn = _check_corrector_args(num_steps, snr, step_size, constraint)
    if tuple(jnp.shape(z)) != tuple(problem.latent_shape):
        raise ValueError(f"z: expected shape {tuple(problem.latent_shape)} (latent_shape), got "
                         f"{tuple(jnp.shape(z))}")
    sigma = jnp.sqrt(1.0 - problem.alpha_bars[t])

    def one(z, k):
        lin = residual_linearization(problem, z, t)
        xi = jax.random.normal(k, z.shape, z.dtype)
        score = -lin.eps / sigma  # (P.4)
        if step_size is None:  # (C.1)
            xi_norm, s_norm = jnp.sqrt(_dot(xi, xi)), jnp.sqrt(_dot(score, score))
            if axis_name is not None:
                xi_norm = jax.lax.pmean(xi_norm, axis_name)
                s_norm = jax.lax.pmean(s_norm, axis_name)
            ratio = xi_norm / jnp.maximum(s_norm, 1e-12)
            eta = 2.0 * (snr * ratio) ** 2
        else:
            eta = jnp.asarray(step_size, z.dtype)
        delta = eta * score + jnp.sqrt(2.0 * eta) * xi  # (C.2)
        inc, pred, rej = cfn(delta, lin)
        return z + inc, (lin.norm, pred, eta, rej)  # (C.3)

    z, (r, pred, eta, rej) = jax.lax.scan(one, z, jax.random.split(key, num_steps))
    return z, CorrectorInfo(r, pred, eta, rej)


@dataclasses.dataclass(frozen=True)
class MCLC:
    """:func:`mclc_correct` with its settings bound: the ``corrector=`` of the solvers.

    ``corrector(key, z, t, problem) -> (z, CorrectorInfo)``; ``num_steps`` is the number of
    extra network evaluations per solver step."""

    num_steps: int = 1
    snr: float = 0.16
    step_size: float | None = None
    constraint: str | Callable = "tangent"
    axis_name: Any = None

    def __post_init__(self):
        _check_corrector_args(self.num_steps, self.snr, self.step_size, self.constraint)

    def __call__(self, key, z, t, problem):
        return mclc_correct(key, z, t, problem, num_steps=self.num_steps, snr=self.snr,
                            step_size=self.step_size, constraint=self.constraint,
                            axis_name=self.axis_name)


def mclc(num_steps: int = 1, snr: float = 0.16, *, step_size: float | None = None,
         constraint: str | Callable = "tangent", axis_name=None) -> MCLC:
    """The corrector to pass as ``corrector=`` to :func:`latent_dps` or :func:`psld`
    (arguments as :func:`mclc_correct`)."""
    return MCLC(num_steps, snr, step_size, constraint, axis_name)
