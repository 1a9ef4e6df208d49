"""The covariance-conditioned energy ``U(y, Sigma) ~ -log p_Sigma(y)`` and what autodiff gives.

arXiv 2605.15487, sec. 3: ``p_Sigma(y) = int N(y; x, Sigma) p(x) dx`` is the density of
``y = x + Sigma^{1/2} eps``; a network ``f(y, Sigma)`` (same shape as ``y``) defines

    U(y, Sigma) = 1/2 <y - m, f(y, Sigma)> + 1/2 sum_k log(2 pi (v + s_k)) + b(Sigma)   (E.1)

("inner-product" parameterisation). The inner product vanishes at ``y = m`` for every
``Sigma``, so on its own it fixes ``U(m, Sigma)``, which a normalised family cannot have. The
second term is the log-normaliser of ``N(m, v I + Sigma)`` (``m``, ``v``: data mean and
variance, scalars or arrays), the exact ``Sigma``-dependence of ``-log p_Sigma`` as
``Sigma -> inf``, the limit that fixes ``U``'s one free constant; ``b(Sigma)`` (optional, learned,
a function of ``Sigma`` only) absorbs the rest of ``-log p_Sigma(m)``. A network returning ``f``
gives ``b = 0``; one returning ``(f, b)`` with ``b`` of shape ``[B]`` gives its own. With
``b = 0`` the form is exact for Gaussian data with ``m`` the mean (``f`` linear in ``y``); the
covariance score-matching term of the loss is what trains ``b``.

From ``U`` by automatic differentiation (one ``value_and_grad`` for all three)::

    score            grad_y U(y, Sigma)                                                (E.2)
    Tweedie          x_hat(y, Sigma) = y - Sigma grad_y U   (= E[x | y], anisotropic)   (E.3)
    noise score      dU / d diag(Sigma)  (= E[1/2 (1/s - |F(y - x)|^2 / s^2) | y])      (E.4)

Conventions: an energy function is ``energy_fn(y, cov) -> U`` with ``y`` a batch ``[B, ...]``,
``cov`` a :class:`~.covariance.Covariance` of the same shape and ``U`` of shape ``[B]``; samples
must not interact (no batch statistics), so gradients of ``U.sum()`` are per-sample gradients.
:func:`gaussian_energy` is the closed form for Gaussian data (the tests' oracle).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import jax
import jax.numpy as jnp

from jaxlib_ext.samplers.energy.covariance import Covariance, check_covariance

__all__ = [
    "EnergyFn",
    "energy_and_grads",
    "gaussian_energy",
    "inner_product_energy",
    "noise_score",
    "score",
    "tweedie_denoiser",
]

EnergyFn = Callable[[jax.Array, Covariance], jax.Array]


def _concrete_any(a) -> bool:
    """``any(a)`` for a concrete array; False while tracing (the check runs outside jit)."""
    try:
        return bool(jnp.any(a))
    except jax.errors.ConcretizationTypeError:
        return False


def _sum_rest(a):
    return jnp.sum(a, axis=tuple(range(1, a.ndim)))


def inner_product_energy(network: Callable, *, data_mean=0.0, data_var=1.0) -> EnergyFn:
    """The inner-product energy (E.1) of a network.

    Args:
      network: ``network(y, cov) -> f`` or ``-> (f, b)``, ``f`` of ``y``'s shape and ``b``
        ``[B]`` (the learned log-normaliser; 0 if not returned).
      data_mean: ``m``, a scalar or an array broadcastable to one sample.
      data_var: ``v`` > 0, a scalar or an array broadcastable to one sample.

    Returns:
      ``energy_fn(y, cov) -> U`` ``[B]``.

    References:
      arXiv 2605.15487, sec. 3 (the inner-product parameterisation).
    """
    if not callable(network):
        raise TypeError(f"network: expected a callable (y, cov) -> f, got {type(network)}")
    if _concrete_any(jnp.asarray(data_var) <= 0):
        raise ValueError("data_var: expected positive variance(s)")

    def energy_fn(y, cov):
        out = network(y, cov)
        f, b = out if isinstance(out, tuple) else (out, 0.0)
        quad = 0.5 * _sum_rest((y - data_mean) * f)
        log_norm = 0.5 * _sum_rest(jnp.log(2.0 * jnp.pi * (data_var + cov.diag)))
        return quad + log_norm + b

    return energy_fn


def energy_and_grads(energy_fn: EnergyFn, y, cov: Covariance):
    """The energy with its two gradients (E.2, E.4), from one reverse pass.

    Args:
      energy_fn: ``U(y, cov) -> [B]``.
      y: a batch ``[B, ...]``.
      cov: ``Sigma``, a :class:`~.covariance.Covariance` of ``y``'s shape.

    Returns:
      ``(U [B], grad_y U, dU/d diag Sigma)``, the gradients of ``y``'s shape.
    """

    def total(y_, d_):
        u = energy_fn(y_, cov.replace(d_))
        return u.sum(), u

    (_, u), (gy, gs) = jax.value_and_grad(total, argnums=(0, 1), has_aux=True)(y, cov.diag)
    return u, gy, gs


def _check(y, cov):
    y = jnp.asarray(y)
    if y.ndim < 2:
        raise ValueError(f"y: expected a batch [B, ...] of at least 2 axes, got shape {y.shape}")
    check_covariance(cov, y.shape)
    return y


def score(energy_fn: EnergyFn, y, cov: Covariance):
    """The score ``grad_y U(y, Sigma)`` (E.2).

    Args:
      energy_fn: ``U(y, cov) -> [B]``.
      y: a batch ``[B, ...]``.
      cov: ``Sigma``, a :class:`~.covariance.Covariance` of ``y``'s shape.

    Returns:
      ``grad_y U``, ``y``'s shape.
    """
    y = _check(y, cov)
    return jax.grad(lambda v: energy_fn(v, cov).sum())(y)


def tweedie_denoiser(energy_fn: EnergyFn, y, cov: Covariance):
    """Anisotropic Tweedie ``x_hat = y - Sigma grad_y U`` (E.3), ``= E[x | y]``.

    Args:
      energy_fn: ``U(y, cov) -> [B]``.
      y: a batch ``[B, ...]``.
      cov: ``Sigma``, a :class:`~.covariance.Covariance` of ``y``'s shape.

    Returns:
      ``x_hat``, ``y``'s shape.

    References:
      arXiv 2605.15487, sec. 3 (Tweedie's formula for anisotropic noise).
    """
    return y - cov.apply(score(energy_fn, y, cov))


def noise_score(energy_fn: EnergyFn, y, cov: Covariance):
    """The noise score ``dU / d diag(Sigma)`` (E.4).

    Args:
      energy_fn: ``U(y, cov) -> [B]``.
      y: a batch ``[B, ...]``.
      cov: ``Sigma``, a :class:`~.covariance.Covariance` of ``y``'s shape.

    Returns:
      ``dU / d diag(Sigma)``, ``cov.diag``'s shape.
    """
    y = _check(y, cov)
    return jax.grad(lambda d: energy_fn(y, cov.replace(d)).sum())(cov.diag)


def _dense(cov_diag, basis, shape):
    """``Sigma`` as a dense ``[d, d]`` matrix for one sample of image shape ``shape``."""
    d = math.prod(shape)
    eye = jnp.eye(d, dtype=cov_diag.dtype).reshape((d, *shape))
    c = Covariance(jnp.broadcast_to(cov_diag, (d, *shape)), basis)
    return c.apply(eye).reshape(d, d).T


def gaussian_energy(mean, covariance) -> EnergyFn:
    """The closed-form energy of Gaussian data ``x ~ N(mean, C)``::

        U*(y, Sigma) = 1/2 (y - mu)^T (C + Sigma)^{-1} (y - mu) + 1/2 log det(2 pi (C + Sigma))

    ``Sigma`` is formed densely from the :class:`Covariance` (either basis).

    Args:
      mean: ``mu``, of one sample's shape.
      covariance: ``C`` ``[d, d]`` over the flattened sample (``d = mean.size``).

    Returns:
      ``energy_fn(y, cov) -> U*`` ``[B]``.
    """
    mean = jnp.asarray(mean)
    covariance = jnp.asarray(covariance)
    d = mean.size
    if covariance.shape != (d, d):
        raise ValueError(f"covariance: expected shape {(d, d)}, got {covariance.shape}")

    def one(y, cov_diag, basis):
        s = _dense(cov_diag, basis, mean.shape)
        k = covariance + s
        r = (y - mean).reshape(-1)
        chol = jnp.linalg.cholesky(k)
        w = jax.scipy.linalg.solve_triangular(chol, r, lower=True)
        logdet = 2.0 * jnp.sum(jnp.log(jnp.diag(chol)))
        return 0.5 * jnp.dot(w, w) + 0.5 * (logdet + d * jnp.log(2.0 * jnp.pi))

    def energy_fn(y, cov):
        return jax.vmap(lambda a, b: one(a, b, cov.basis))(y, cov.diag)

    return energy_fn
