"""A linear inverse problem diagonal in a basis, as anisotropic denoising, and its evidence.

Measurement ``y = A x + sigma_n n`` with ``A = F^* diag(a) F`` (``basis="fourier"``: a circular
blur with transfer function ``a``) or ``A = diag(a)`` (``basis="pixel"``: a mask or gain). In the
basis, coefficient by coefficient (arXiv 2605.15487, sec. 3)::

    observed (sigma_n^2 / |a_k|^2 < sigma_max^2):   z_k = y_k / a_k,  s_k = sigma_n^2 / |a_k|^2
    missing  (otherwise):                            z_k = 0,          s_k = sigma_max^2       (P.1)

so ``z = x + Sigma^{1/2} eps`` on the observed coefficients; on the missing ones ``Sigma`` is
capped at ``sigma_max^2`` (in place of infinity, the largest training noise level). The
negative log-evidence of the measurement under the prior follows by a change of variables::

    -log p(y | A, sigma_n) = U(z, Sigma) + sum_obs log|a_k|
                             + sum_miss (|y_k|^2 / (2 sigma_n^2) + 1/2 log(2 pi sigma_n^2))
                             - sum_miss 1/2 log(2 pi sigma_max^2)                            (P.2)

exact up to two approximations: an infinite variance is replaced by ``sigma_max^2`` (the last
line removes the Gaussian factor ``N(z_k; ., sigma_max^2)`` this adds), and a coefficient with
``0 < |a_k| < sigma_n / sigma_max`` is treated as missing (its likelihood factor
``N(y_k; a_k x_k, sigma_n^2)`` is replaced by ``N(y_k; 0, sigma_n^2)``, an error of order
``|a_k x_k|^2 / sigma_n^2 < |x_k|^2 / sigma_max^2``). Blind estimation compares (P.2) across
operators; the samplers start from ``(z, Sigma)``.

:func:`from_operator` reads ``a`` and the basis off a
:class:`~jaxlib_ext.samplers.inverse.LinearOperator` (masks: pixel; circular blurs: Fourier).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from jaxlib_ext.samplers._common import expand_batch
from jaxlib_ext.samplers.energy.covariance import BASES, Covariance
from jaxlib_ext.samplers.inverse.operators import LinearOperator

__all__ = ["DiagonalProblem", "diagonal_problem", "from_operator", "operator_diagonal",
           "problem_nll_offset"]


@dataclasses.dataclass(frozen=True)
class DiagonalProblem:
    """Anisotropic-denoising form (P.1) of a batch of measurements.

    Attributes:
      z: ``[B, ...]`` equivalent observation (image space, real).
      cov: ``Sigma`` with the capped variances.
      observed: ``[B, ...]`` bool, in the basis: the coefficients with a finite variance.
      nll_offset: ``[B]``, the terms of (P.2) besides ``U(z, Sigma)``.
      sigma_max: the cap (static).
    """

    z: jax.Array
    cov: Covariance
    observed: jax.Array
    nll_offset: jax.Array
    sigma_max: float


jax.tree_util.register_dataclass(DiagonalProblem, data_fields=["z", "cov", "observed",
                                                               "nll_offset"],
                                 meta_fields=["sigma_max"])


def operator_diagonal(operator: LinearOperator):
    """The diagonal of an operator that is diagonal in the pixel or Fourier basis.

    Args:
      operator: a :class:`~jaxlib_ext.samplers.inverse.LinearOperator`.

    Returns:
      ``(a, basis)``, ``a`` broadcastable to images ``[B, H, W, C]``.

    Raises:
      TypeError: ``operator`` is not a ``LinearOperator``.
      ValueError: it is diagonal in neither basis.
    """
    if not isinstance(operator, LinearOperator):
        raise TypeError(f"operator: expected an inverse.LinearOperator, got "
                        f"{type(operator).__name__}")
    if operator.basis not in BASES:
        raise ValueError(f"operator: {operator.name} is not diagonal in the pixel or Fourier "
                         f"basis (basis={operator.basis!r}); use the DPS baseline for it")
    a = operator.diagonal
    return (a if operator.basis == "pixel" else a[..., None]), operator.basis


def from_operator(y, operator: LinearOperator, noise_std, *, sigma_max: float = 20.0):
    """The anisotropic-denoising form (P.1) of measurements ``y = operator(x) + noise_std n``.

    Args:
      y: the measurements ``[B, *operator.shape_out]``.
      operator: a :class:`~jaxlib_ext.samplers.inverse.LinearOperator` diagonal in the
        pixel or Fourier basis.
      noise_std: ``sigma_n`` > 0, a scalar or ``[B]``.
      sigma_max: the cap of the missing coefficients' variance.

    Returns:
      The :class:`DiagonalProblem`.

    References:
      arXiv 2605.15487, sec. 3.
    """
    a, basis = operator_diagonal(operator)
    y = jnp.asarray(y)
    if y.ndim != 4 or tuple(y.shape[1:]) != tuple(operator.shape_out):
        raise ValueError(f"y: expected [B, {', '.join(map(str, operator.shape_out))}] for "
                         f"{operator.name}, got {tuple(y.shape)}")
    return diagonal_problem(y, a, basis=basis, noise_std=noise_std, sigma_max=sigma_max)


def problem_nll_offset(y, a, basis, noise_std, sigma_max):
    """The terms of (P.2) besides ``U(z, Sigma)``, and the observed mask.

    Args:
      y: the measurements ``[B, ...]``.
      a: the operator's diagonal, ``y``'s shape.
      basis: ``"pixel"`` or ``"fourier"``.
      noise_std: ``sigma_n`` > 0, a scalar or ``[B]``.
      sigma_max: the cap of the missing coefficients' variance.

    Returns:
      ``(offset [B], observed)``, ``observed`` bool of ``y``'s shape (in the basis).
    """
    cov = Covariance(jnp.ones(y.shape, y.dtype), basis)
    yb = cov.to_basis(y)
    ab = jnp.broadcast_to(a, y.shape)
    s2 = expand_batch(jnp.asarray(noise_std, y.dtype), y) ** 2
    mag2 = jnp.abs(ab) ** 2
    observed = mag2 * sigma_max ** 2 > s2
    rest = tuple(range(1, y.ndim))
    log_jac = jnp.sum(jnp.where(observed, 0.5 * jnp.log(jnp.where(observed, mag2, 1.0)), 0.0),
                      axis=rest)
    miss = jnp.where(observed, 0.0,
                     jnp.abs(yb) ** 2 / (2.0 * s2) + 0.5 * jnp.log(s2 / sigma_max ** 2))
    return log_jac + jnp.sum(miss, axis=rest), observed


def diagonal_problem(y, a, *, basis: str, noise_std, sigma_max: float = 20.0) -> DiagonalProblem:
    """The anisotropic-denoising form (P.1) of measurements of a diagonal operator.

    Args:
      y: the measurements ``[B, ...]`` (images ``[B, H, W, C]`` for the Fourier basis).
      a: the operator's diagonal, broadcastable to ``y`` (complex allowed for Fourier).
      basis: ``"pixel"`` or ``"fourier"``.
      noise_std: ``sigma_n`` > 0, a scalar or ``[B]``.
      sigma_max: the cap of the missing coefficients' variance, > 0.

    Returns:
      The :class:`DiagonalProblem`.

    References:
      arXiv 2605.15487, sec. 3.
    """
    if basis not in BASES:
        raise ValueError(f"basis: expected one of {BASES}, got {basis!r}")
    y = jnp.asarray(y)
    if y.ndim < 2:
        raise ValueError(f"y: expected a batch [B, ...], got shape {y.shape}")
    if basis == "fourier" and y.ndim != 4:
        raise ValueError(f"y: basis='fourier' needs images [B, H, W, C], got shape {y.shape}")
    try:
        ab = jnp.broadcast_to(jnp.asarray(a), y.shape)
    except ValueError as e:
        raise ValueError(f"a: shape {jnp.shape(a)} does not broadcast to y's {y.shape}") from e
    ns = jnp.asarray(noise_std)
    if ns.ndim > 1 or (ns.ndim == 1 and ns.shape[0] != y.shape[0]):
        raise ValueError(f"noise_std: expected a scalar or [B], got shape {ns.shape}")
    try:
        bad = not bool(jnp.all(ns > 0))
    except jax.errors.ConcretizationTypeError:  # traced: checked where it is concrete
        bad = False
    if bad:
        raise ValueError("noise_std: expected positive noise level(s)")
    if not sigma_max > 0:
        raise ValueError(f"sigma_max: expected > 0, got {sigma_max}")
    offset, observed = problem_nll_offset(y, ab, basis, ns, sigma_max)
    cov1 = Covariance(jnp.ones(y.shape, y.dtype), basis)
    s2 = expand_batch(jnp.asarray(ns, y.dtype), y) ** 2
    mag2 = jnp.abs(ab) ** 2
    safe_a = jnp.where(observed, ab, 1.0)
    zb = jnp.where(observed, cov1.to_basis(y) / safe_a, 0.0)
    z = cov1.from_basis(zb).astype(y.dtype)
    var = jnp.where(observed, s2 / jnp.where(observed, mag2, 1.0), sigma_max ** 2)
    return DiagonalProblem(z, Covariance(var.astype(y.dtype), basis), observed, offset,
                           float(sigma_max))
