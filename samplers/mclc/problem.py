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
adjoint by the dot-product test ``<A x, u> = <x, A^T u>`` on random vectors). The problem is a
plain container: solvers close over it, so ``jax.jit`` and ``jax.vmap`` over keys (or over
``problem._replace(measurement=y)``) work as usual. One chain is one latent of
``latent_shape``; batch chains with ``vmap``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

__all__ = [
    "LatentInverseProblem",
    "LinearOperator",
    "ResidualLinearization",
    "as_linear_operator",
    "check_adjoint",
    "ddim_timesteps",
    "denoise",
    "latent_inverse_problem",
    "measurement_residual",
    "residual_linearization",
    "vp_alpha_bars",
]


class LinearOperator(NamedTuple):
    """A linear map ``A`` on single (unbatched) arrays and its adjoint ``A^T``.

    Attributes:
      forward: ``x -> A x``.
      adjoint: ``u -> A^T u``.
    """

    forward: Callable[[jax.Array], jax.Array]
    adjoint: Callable[[jax.Array], jax.Array]


def as_linear_operator(operator: Any) -> LinearOperator:
    """A :class:`LinearOperator` from one, from a ``(forward, adjoint)`` pair of callables, or from
    any object with callable ``forward`` (or ``apply``) and ``adjoint`` attributes.

    Args:
      operator: the operator in one of those forms.

    Returns:
      The :class:`LinearOperator`.

    Raises:
      TypeError: ``operator`` is none of those.
    """
    if isinstance(operator, LinearOperator):
        return operator
    if isinstance(operator, tuple) and len(operator) == 2 and all(map(callable, operator)):
        return LinearOperator(*operator)
    fwd = getattr(operator, "forward", None) or getattr(operator, "apply", None)
    adj = getattr(operator, "adjoint", None)
    if callable(fwd) and callable(adj):
        return LinearOperator(fwd, adj)
    raise TypeError(
        "operator: expected a LinearOperator, a (forward, adjoint) pair of callables or an "
        f"object with forward and adjoint methods, got {type(operator).__name__}")


def _is_concrete(*arrays) -> bool:
    return not any(isinstance(a, jax.core.Tracer) for a in arrays)


def check_adjoint(operator, x_shape, *, dtype=jnp.float32, rtol: float = 1e-4,
                  seed: int = 0) -> None:
    """Raise ``ValueError`` unless ``<A x, u> = <x, A^T u>`` on two random pairs ``(x, u)``.

    The mismatch is measured relative to ``||A x|| ||u|| + ||x|| ||A^T u||`` (float32 round-off
    is far below the default ``rtol``). Also checks that ``A^T`` maps back to ``x_shape``.
    Skipped (returns) when the operator's outputs are traced, e.g. built inside ``jit`` from
    traced arrays.

    Args:
      operator: anything :func:`as_linear_operator` accepts.
      x_shape: the shape of the forward map's input.
      dtype: the dtype of the random vectors.
      rtol: the relative tolerance of the dot-product test.
      seed: the NumPy seed of the random vectors.

    Raises:
      ValueError: the adjoint maps to another shape, or fails the dot-product test.
    """
    op = as_linear_operator(operator)
    x_shape = tuple(x_shape)
    y_struct = jax.eval_shape(op.forward, jax.ShapeDtypeStruct(x_shape, dtype))
    back = jax.eval_shape(op.adjoint, jax.ShapeDtypeStruct(y_struct.shape, dtype))
    if tuple(back.shape) != x_shape:
        raise ValueError(f"operator: adjoint maps measurements of shape {y_struct.shape} to "
                         f"shape {tuple(back.shape)}, expected the forward's input shape "
                         f"{x_shape}")
    rng = np.random.default_rng(seed)
    for _ in range(2):
        x = jnp.asarray(rng.standard_normal(x_shape), dtype)
        u = jnp.asarray(rng.standard_normal(y_struct.shape), dtype)
        ax, atu = op.forward(x), op.adjoint(u)
        if not _is_concrete(ax, atu):
            return
        ax, atu = np.asarray(ax, np.float64), np.asarray(atu, np.float64)
        xn, un = np.asarray(x, np.float64), np.asarray(u, np.float64)
        lhs, rhs = float(np.sum(ax * un)), float(np.sum(xn * atu))
        scale = np.linalg.norm(ax) * np.linalg.norm(un) + np.linalg.norm(xn) * np.linalg.norm(atu)
        if not np.isfinite(lhs - rhs) or abs(lhs - rhs) > rtol * max(scale, 1e-30):
            raise ValueError(
                "operator: the adjoint is inconsistent with the forward map: "
                f"<A x, u> = {lhs:.6g} but <x, A^T u> = {rhs:.6g} on random x, u "
                f"(relative mismatch {abs(lhs - rhs) / max(scale, 1e-30):.3g} > {rtol:g})")


class LatentInverseProblem(NamedTuple):
    """The callables and arrays of (P.1)-(P.5).

    Attributes:
      eps_model: ``(z, t) -> eps``, ``z`` of ``latent_shape``, ``t`` an int32 scalar.
      decoder: ``z_0 -> x``.
      operator: the :class:`LinearOperator` ``A`` on ``x``.
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
    ``check_operator``, the dot-product test of :func:`check_adjoint`.

    Args:
      eps_model: ``(z, t) -> eps`` for one latent.
      decoder: ``z_0 -> x``.
      operator: ``A``, anything :func:`as_linear_operator` accepts.
      measurement: ``y``.
      alpha_bars: ``(T,)`` the VP schedule's ``abar_t``.
      latent_shape: the shape of one latent.
      encoder: ``x -> z_0``, or ``None`` (only PSLD needs it).
      check_operator: run the dot-product test of :func:`check_adjoint`.

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
    if _is_concrete(alpha_bars):
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
    y = jax.eval_shape(op.forward, x)
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


def ddim_timesteps(num_train_steps: int, num_steps: int, t_max: int | None = None) -> np.ndarray:
    """``num_steps`` distinct training indices from ``t_max`` down to ``0``, evenly spaced.

    A schedule whose last ``abar`` is close to 0 (the cosine schedule's is about 1e-9) makes
    ``zhat_0`` of (P.3), and any gradient through it, blow up at ``T - 1``; start lower there.

    Args:
      num_train_steps: ``T``, the length of the training schedule.
      num_steps: the number of indices, in ``[1, t_max + 1]``.
      t_max: the first index (default ``T - 1``), in ``[0, T - 1]``.

    Returns:
      ``(num_steps,)`` int32 NumPy array, descending.

    Raises:
      ValueError: ``t_max`` or ``num_steps`` out of range.

    References:
      Song, Meng, Ermon, arXiv 2010.02502 (the sub-sequences of accelerated sampling).
    """
    if t_max is None:
        t_max = num_train_steps - 1
    if isinstance(t_max, bool) or not isinstance(t_max, int | np.integer) or not (
            0 <= t_max < num_train_steps):
        raise ValueError(f"t_max: expected an int in [0, {num_train_steps - 1}], got {t_max!r}")
    if isinstance(num_steps, bool) or not isinstance(num_steps, int | np.integer) or not (
            1 <= num_steps <= t_max + 1):
        raise ValueError(f"num_steps: expected an int in [1, {t_max + 1}] (t_max + 1), got "
                         f"{num_steps!r}")
    return np.round(np.linspace(t_max, 0, num_steps)).astype(np.int32)


def vp_alpha_bars(num_train_steps: int = 1000, beta_min: float = 1e-4,
                  beta_max: float = 2e-2) -> jax.Array:
    """``abar_t = prod_{s <= t} (1 - beta_s)`` for betas linear from ``beta_min`` to ``beta_max``.

    Args:
      num_train_steps: ``T >= 1``.
      beta_min: the first beta.
      beta_max: the last beta, ``0 < beta_min <= beta_max < 1``.

    Returns:
      ``(num_train_steps,)`` float32.

    Raises:
      ValueError: an argument out of range.

    References:
      Ho, Jain, Abbeel, Denoising Diffusion Probabilistic Models, arXiv 2006.11239, sec. 4.
    """
    if num_train_steps < 1:
        raise ValueError(f"num_train_steps: expected >= 1, got {num_train_steps}")
    if not 0 < beta_min <= beta_max < 1:
        raise ValueError(f"beta_min, beta_max: expected 0 < beta_min <= beta_max < 1, got "
                         f"{beta_min}, {beta_max}")
    betas = np.linspace(beta_min, beta_max, num_train_steps)
    return jnp.asarray(np.cumprod(1.0 - betas), jnp.float32)


def denoise(problem: LatentInverseProblem, z, t):
    """Tweedie's denoiser (P.3) at one latent.

    Args:
      problem: the :class:`LatentInverseProblem`.
      z: one latent of ``latent_shape``.
      t: int index into ``problem.alpha_bars``.

    Returns:
      ``(eps_model(z, t), zhat_0(z, t))``.
    """
    ab = problem.alpha_bars[t]
    eps = problem.eps_model(z, t)
    return eps, (z - jnp.sqrt(1.0 - ab) * eps) / jnp.sqrt(ab)


def _residual_and_aux(problem: LatentInverseProblem, t):
    def f(z):
        eps, z0 = denoise(problem, z, t)
        rho = problem.measurement - problem.operator.forward(problem.decoder(z0))
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
        rho = problem.measurement - problem.operator.forward(problem.decoder(z))
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
