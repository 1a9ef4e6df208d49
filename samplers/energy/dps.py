"""Diffusion posterior sampling (DPS) with the energy model's score: the comparison baseline.

Chung, Kim, Mccann, Klasky, Ye, "Diffusion Posterior Sampling for General Noisy Inverse
Problems", ICLR 2023 (arXiv 2209.14687), Algorithm 1 in the variance-exploding form, with the
score ``-grad_y U(y, sigma^2 I)`` of the same energy network (isotropic covariances only) and any
differentiable operator ``A`` (not only diagonal ones)::

    x_hat0(x_k) = x_k - sigma_k^2 grad U(x_k, sigma_k^2 I)                              (D.1)
    x' = x_k - (sigma_k^2 - sigma_{k+1}^2) grad U + sqrt(sigma_k^2 - sigma_{k+1}^2) xi      (D.2)
    x_{k+1} = x' - zeta grad_{x_k} || y - A(x_hat0(x_k)) ||                                  (D.3)

(D.3) is DPS's ``zeta_k grad ||y - A x_hat0||^2`` with ``zeta_k = zeta / (2 ||y - A x_hat0||)``.
It differentiates through the score: each step is one network gradient plus one
vector-Hessian product (counted as one network evaluation in ``nfe``, about twice the work).
The output is ``x_hat0`` at the last level.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp

from jaxlib_ext.samplers.energy.covariance import Covariance
from jaxlib_ext.samplers.energy.energy import EnergyFn
from jaxlib_ext.samplers.energy.levels import geometric_sigmas

__all__ = ["DPSResult", "sample"]


class DPSResult(NamedTuple):
    """denoised ``[B, ...]`` (``x_hat0`` at the last level), residual ``[K, B]``
    (``||y - A x_hat0||`` per level), nfe."""

    denoised: jax.Array
    residual: jax.Array
    nfe: int


def sample(energy_fn: EnergyFn, operator: Callable, y, key, *, image_shape, num_steps: int = 100,
           sigma_max: float = 20.0, sigma_end: float = 0.01, zeta: float = 1.0) -> DPSResult:
    """DPS (D.1)-(D.3) for measurements ``y`` ``[B, ...]`` of ``operator`` (batch in, batch
    out); ``image_shape`` = one image's shape."""
    y = jnp.asarray(y)
    b = y.shape[0]
    shape = (b, *tuple(image_shape))
    sigmas = geometric_sigmas(sigma_max, sigma_end, num_steps)
    nexts = jnp.concatenate([sigmas[1:], jnp.zeros((1,), sigmas.dtype)])
    rest = tuple(range(1, y.ndim))

    def x0_and_residual(x, s):
        cov = Covariance(jnp.full(shape, s ** 2, x.dtype), "pixel")
        g = jax.grad(lambda v: energy_fn(v, cov).sum())(x)
        x0 = x - s ** 2 * g                                                       # (D.1)
        r = jnp.sqrt(jnp.sum((y - operator(x0)) ** 2, axis=rest))
        return r.sum(), (g, x0, r)

    def body(carry, inp):
        x, _ = carry
        k, s, sn = inp
        (_, (g, x0, r)), gr = jax.value_and_grad(x0_and_residual, has_aux=True)(x, s)
        d = s ** 2 - sn ** 2
        xi = jax.random.normal(k, x.shape, x.dtype)
        x = x - d * g + jnp.sqrt(d) * xi * (sn > 0) - zeta * gr                  # (D.2), (D.3)
        return (x, x0), r

    k0, key = jax.random.split(key)
    x = sigma_max * jax.random.normal(k0, shape, y.dtype)
    keys = jax.random.split(key, num_steps)
    (_, x0), rs = jax.lax.scan(body, (x, x), (keys, sigmas, nexts))
    return DPSResult(x0, rs, num_steps)
