"""A latent-diffusion linear inverse problem: the pieces every latent solver shares.

Data ``x = D(z_0)`` is decoded from a latent ``z_0`` that a variance-preserving (VP) diffusion
models; the measurement is linear with Gaussian noise::

    z_t = sqrt(abar_t) z_0 + sqrt(1 - abar_t) eps,   eps ~ N(0, I)                     (P.1)
    y   = A D(z_0) + sigma_y n,                      n ~ N(0, I)                       (P.2)

``eps_model(z, t)`` predicts ``eps`` from ``z_t`` (``t`` an integer index into the training
schedule ``alpha_bars``, decreasing from ``abar_0`` close to 1). Tweedie's formula gives the
denoised latent and the score of ``p_t``::

    zhat_0(z, t) = (z - sqrt(1 - abar_t) eps_model(z, t)) / sqrt(abar_t)               (P.3)
    s(z, t)      = -eps_model(z, t) / sqrt(1 - abar_t)                                 (P.4)

and the measurement residual that latent DPS (Chung et al., arXiv 2209.14687, applied in the
latent as in Rout et al., arXiv 2307.00619) and the corrector of arXiv 2601.04791 work with is::

    rho(z, t) = y - A D(zhat_0(z, t)),   r(z, t) = ||rho(z, t)||_2                     (P.5)

:class:`LatentInverseProblem` holds the callables and arrays; :func:`latent_inverse_problem`
builds one and checks it (shapes by ``jax.eval_shape``, the schedule's range, and the operator's
adjoint by the dot-product test ``<A x, u> = <x, A^T u>`` on random vectors,
:func:`~jaxlib_ext.samplers.inverse.check_adjoint`). The operator is a
:class:`~jaxlib_ext.samplers.inverse.LinearOperator` (a degradation of
:mod:`jaxlib_ext.samplers.inverse`, or :func:`~jaxlib_ext.samplers.inverse.linear_operator` of
two maps); the schedule, Tweedie's formula and the DDIM steps are those of
:mod:`jaxlib_ext.models.diffusion`. The problem is a
plain container: solvers close over it, so ``jax.jit`` and ``jax.vmap`` over keys (or over
``problem._replace(measurement=y)``) work as usual. One chain is one latent of
``latent_shape``; batch chains with ``vmap``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxlib_ext.models.diffusion import predict_z0
from jaxlib_ext.samplers.inverse.operators import LinearOperator, as_linear_operator, check_adjoint

__all__ = [
    "LatentInverseProblem",
    "ResidualLinearization",
    "denoise",
    "latent_inverse_problem",
    "measurement_residual",
    "residual_linearization",
]


class LatentInverseProblem(NamedTuple):
    """The callables and arrays of (P.1)-(P.5).

    Attributes:
      eps_model: ``(z, t) -> eps``, ``z`` of ``latent_shape``, ``t`` an int32 scalar.
      decoder: ``z_0 -> x``.
      operator: the :class:`~jaxlib_ext.samplers.inverse.LinearOperator` ``A`` on ``x``.
      measurement: ``y``, of the shape ``A`` produces.
      alpha_bars: ``(T,)`` cumulative products ``abar_t`` of the VP schedule, in ``(0, 1]``,
        non-increasing.
      encoder: ``x -> z_0``, or ``None`` (only PSLD needs it).
      latent_shape: shape of one latent (a tuple of ints).
    """

    eps_model: Callable
    decoder: Callable
    operator: LinearOperator
    measurement: jax.Array
    alpha_bars: jax.Array
    encoder: Callable | None
    latent_shape: tuple


def latent_inverse_problem(eps_model: Callable, decoder: Callable, operator, measurement,
                           alpha_bars, *, latent_shape, encoder: Callable | None = None,
                           check_operator: bool = True) -> LatentInverseProblem:
    """Build and check a :class:`LatentInverseProblem`.

    Checks (``ValueError``/``TypeError`` naming the argument): callables; ``latent_shape`` a
    tuple of positive ints; ``eps_model`` returns ``latent_shape``; ``measurement`` has the
    shape ``A D(z)`` has; ``alpha_bars`` one-dimensional, in ``(0, 1]`` and non-increasing
    (when concrete); ``encoder`` maps ``x`` back to ``latent_shape``; and, with
    ``check_operator``, the dot-product test of
    :func:`~jaxlib_ext.samplers.inverse.check_adjoint`.

    Args:
      eps_model: ``(z, t) -> eps`` for one latent.
      decoder: ``z_0 -> x``.
      operator: ``A``, anything :func:`~jaxlib_ext.samplers.inverse.as_linear_operator` accepts
        (a :class:`~jaxlib_ext.samplers.inverse.LinearOperator`, a ``(forward, adjoint)`` pair
        of callables, an object with ``forward`` or ``apply`` and ``adjoint``).
      measurement: ``y``.
      alpha_bars: ``(T,)`` the VP schedule's ``abar_t``.
      latent_shape: the shape of one latent.
      encoder: ``x -> z_0``, or ``None`` (only PSLD needs it).
      check_operator: run the dot-product test of
        :func:`~jaxlib_ext.samplers.inverse.check_adjoint`.

    Returns:
      The :class:`LatentInverseProblem`.

    Raises:
      TypeError: a callable argument is not callable, or ``latent_shape`` is not a tuple of
        ints.
      ValueError: a shape or the schedule is wrong, or the operator fails the adjoint test.
    """
    for name, fn in (("eps_model", eps_model), ("decoder", decoder)):
        if not callable(fn):
            raise TypeError(f"{name}: expected a callable, got {type(fn).__name__}")
    if encoder is not None and not callable(encoder):
        raise TypeError(f"encoder: expected a callable or None, got {type(encoder).__name__}")
    op = as_linear_operator(operator)
    try:
        latent_shape = tuple(int(s) for s in latent_shape)
    except TypeError as e:
        raise TypeError(f"latent_shape: expected a tuple of ints, got {latent_shape!r}") from e
    if not latent_shape or min(latent_shape) < 1:
        raise ValueError(f"latent_shape: expected positive sizes, got {latent_shape}")
    alpha_bars = jnp.asarray(alpha_bars)
    if alpha_bars.ndim != 1 or alpha_bars.shape[0] < 1:
        raise ValueError(f"alpha_bars: expected a non-empty 1-D array, got shape "
                         f"{alpha_bars.shape}")
    if not isinstance(alpha_bars, jax.core.Tracer):
        ab = np.asarray(alpha_bars, np.float64)
        if not (np.all(ab > 0) and np.all(ab <= 1)):
            raise ValueError(f"alpha_bars: expected values in (0, 1], got range "
                             f"[{ab.min():.3g}, {ab.max():.3g}]")
        if np.any(np.diff(ab) > 0):
            raise ValueError("alpha_bars: expected a non-increasing schedule (abar_0 closest "
                             "to 1)")
    measurement = jnp.asarray(measurement)
    z = jax.ShapeDtypeStruct(latent_shape, jnp.float32)
    t = jax.ShapeDtypeStruct((), jnp.int32)
    eps = jax.eval_shape(eps_model, z, t)
    if tuple(eps.shape) != latent_shape:
        raise ValueError(f"eps_model: expected output shape {latent_shape} (latent_shape), got "
                         f"{tuple(eps.shape)}")
    x = jax.eval_shape(decoder, z)
    y = jax.eval_shape(op.apply, x)
    if tuple(measurement.shape) != tuple(y.shape):
        raise ValueError(f"measurement: expected shape {tuple(y.shape)} (the operator applied "
                         f"to a decoded latent), got {tuple(measurement.shape)}")
    if encoder is not None:
        ze = jax.eval_shape(encoder, x)
        if tuple(ze.shape) != latent_shape:
            raise ValueError(f"encoder: expected output shape {latent_shape} (latent_shape), "
                             f"got {tuple(ze.shape)}")
    if check_operator:
        check_adjoint(op, x.shape, dtype=x.dtype)
    return LatentInverseProblem(eps_model, decoder, op, measurement, alpha_bars, encoder,
                                latent_shape)


def denoise(problem: LatentInverseProblem, z, t):
    """Tweedie's denoiser (P.3) at one latent
    (:func:`~jaxlib_ext.models.diffusion.predict_z0`).

    Args:
      problem: the :class:`LatentInverseProblem`.
      z: one latent of ``latent_shape``.
      t: int index into ``problem.alpha_bars``.

    Returns:
      ``(eps_model(z, t), zhat_0(z, t))``.
    """
    eps = problem.eps_model(z, t)
    return eps, predict_z0(z, eps, problem.alpha_bars[t])


def _residual_and_aux(problem: LatentInverseProblem, t):
    def f(z):
        eps, z0 = denoise(problem, z, t)
        rho = problem.measurement - problem.operator.apply(problem.decoder(z0))
        return rho, (eps, z0)

    return f


def measurement_residual(problem: LatentInverseProblem, z, t):
    """The measurement residual ``r(z, t) = ||y - A D(zhat_0(z, t))||`` of (P.5).

    Args:
      problem: the :class:`LatentInverseProblem`.
      z: one latent of ``latent_shape``.
      t: int index into ``problem.alpha_bars``, or ``None``: ``z`` is clean (``r = ||y - A
        D(z)||``).

    Returns:
      The scalar ``r``.
    """
    if t is None:
        rho = problem.measurement - problem.operator.apply(problem.decoder(z))
    else:
        rho, _ = _residual_and_aux(problem, t)(z)
    return jnp.sqrt(jnp.sum(rho ** 2))


class ResidualLinearization(NamedTuple):
    """(P.3)-(P.5) at one latent with the residual's first-order model.

    Attributes:
      eps: ``eps_model(z, t)``.
      z0: ``zhat_0``.
      residual: the vector ``rho``.
      norm: ``r``.
      grad: ``grad_z r`` (zero where ``r = 0``).
      jvp: ``u -> J u`` with ``J = d rho / d z``, the linearised residual (a Gauss-Newton model
        ``rho(z + u) ~ rho + J u``).
      vjp: ``w -> J^T w``.
    """

    eps: jax.Array
    z0: jax.Array
    residual: jax.Array
    norm: jax.Array
    grad: jax.Array
    jvp: Callable
    vjp: Callable


def residual_linearization(problem: LatentInverseProblem, z, t) -> ResidualLinearization:
    """One ``eps_model`` forward pass, linearised (by ``jax.linearize`` and its transpose).

    Args:
      problem: the :class:`LatentInverseProblem`.
      z: one latent of ``latent_shape``.
      t: int index into ``problem.alpha_bars``.

    Returns:
      The :class:`ResidualLinearization`: ``eps``, ``rho``, ``r``, ``grad r`` and the
      Jacobian-vector products of ``rho``.
    """
    rho, jvp, (eps, z0) = jax.linearize(_residual_and_aux(problem, t), z, has_aux=True)
    transpose = jax.linear_transpose(jvp, z)

    def vjp(w):
        return transpose(w)[0]

    r = jnp.sqrt(jnp.sum(rho ** 2))
    grad = vjp(rho) / jnp.where(r > 0, r, 1.0)  # grad (1/2)||rho||^2 = J^T rho
    return ResidualLinearization(eps, z0, rho, r, grad, jvp, vjp)


def residual_and_grad(problem: LatentInverseProblem, z, t):
    """The residual and its gradient by one forward and one backward pass (no linearisation);
    what latent DPS needs.

    Args:
      problem: the :class:`LatentInverseProblem`.
      z: one latent of ``latent_shape``.
      t: int index into ``problem.alpha_bars``.

    Returns:
      ``(eps, zhat_0, r, grad_z r)``.
    """
    rho, vjp, (eps, z0) = jax.vjp(_residual_and_aux(problem, t), z, has_aux=True)
    r = jnp.sqrt(jnp.sum(rho ** 2))
    (jt_rho,) = vjp(rho)
    return eps, z0, r, jt_rho / jnp.where(r > 0, r, 1.0)
