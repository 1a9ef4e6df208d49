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

Levels ``sigma_0 = sigma_max > ... > sigma_{K-1} = sigma_end`` (geometric) and
``sigma_K = 0``; the level index is part of the state (:class:`DPSState`), so one step is
``step(rng_key, state)``; a step past the last level repeats the last one. :func:`init`,
:func:`build_kernel` follow BlackJAX; :func:`diffusion_posterior_sampling` binds the
measurement and returns a :class:`~jaxlib_ext.samplers.base.SamplingAlgorithm`; :func:`sample`
runs it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp

from jaxlib_ext.samplers.base import SamplingAlgorithm
from jaxlib_ext.samplers.energy.covariance import Covariance
from jaxlib_ext.samplers.energy.energy import EnergyFn
from jaxlib_ext.samplers.energy.levels import geometric_sigmas

__all__ = ["DPSInfo", "DPSResult", "DPSState", "build_kernel", "diffusion_posterior_sampling",
           "init", "initial_position", "sample"]


class DPSState(NamedTuple):
    """The DPS state.

    Attributes:
      position: ``x_k`` ``[B, ...]``.
      step: the level index ``k``, an int32 scalar.
    """

    position: jax.Array
    step: jax.Array


class DPSInfo(NamedTuple):
    """Diagnostics of one step.

    Attributes:
      sigma: ``sigma_k`` (a scalar).
      residual: ``||y - A x_hat0(x_k)||`` ``[B]``.
      denoised: ``x_hat0(x_k)`` of (D.1) ``[B, ...]``.
    """

    sigma: jax.Array
    residual: jax.Array
    denoised: jax.Array


class DPSResult(NamedTuple):
    """The output of :func:`sample`.

    Attributes:
      denoised: ``[B, ...]``, ``x_hat0`` at the last level.
      residual: ``[K, B]``, ``||y - A x_hat0||`` per level.
      nfe: network gradients per chain.
    """

    denoised: jax.Array
    residual: jax.Array
    nfe: int


def init(position) -> DPSState:
    """The state at the first level.

    Args:
      position: ``x_0`` ``[B, ...]`` (e.g. :func:`initial_position`).

    Returns:
      A :class:`DPSState` with level index 0.
    """
    return DPSState(position, jnp.zeros((), jnp.int32))


def initial_position(rng_key, shape, sigma_max: float = 20.0, dtype=jnp.float32):
    """``x_0 = sigma_max xi``, ``xi ~ N(0, I)``.

    Args:
      rng_key: a PRNG key.
      shape: ``[B, ...]``, the batch of images.
      sigma_max: the first level.
      dtype: the images' dtype.

    Returns:
      ``x_0`` of ``shape``.
    """
    return sigma_max * jax.random.normal(rng_key, tuple(shape), dtype)


def build_kernel(energy_fn: EnergyFn, *, zeta: float = 1.0):
    """One DPS step (D.1)-(D.3).

    Args:
      energy_fn: ``U(y, cov) -> [B]``, called with isotropic pixel covariances.
      zeta: the step of the measurement guidance (D.3).

    Returns:
      ``kernel(rng_key, state, operator, y, sigmas) -> (state, info)``: ``state`` a
      :class:`DPSState` at level ``sigmas[k]``, ``k = state.step``, moved to ``sigmas[k + 1]``
      (0 after the last); ``operator`` maps a batch ``[B, ...]`` to measurements of ``y``'s
      shape; ``info`` a :class:`DPSInfo`.

    References:
      Chung et al., arXiv 2209.14687, Algorithm 1.
    """

    def kernel(rng_key, state: DPSState, operator: Callable, y, sigmas):
        last = sigmas.shape[0] - 1
        s = sigmas[jnp.minimum(state.step, last)]
        sn = jnp.where(state.step < last, sigmas[jnp.minimum(state.step + 1, last)],
                       jnp.zeros((), sigmas.dtype))
        rest = tuple(range(1, y.ndim))

        def x0_and_residual(x):
            cov = Covariance(jnp.full(x.shape, s ** 2, x.dtype), "pixel")
            g = jax.grad(lambda v: energy_fn(v, cov).sum())(x)
            x0 = x - s ** 2 * g                                                   # (D.1)
            r = jnp.sqrt(jnp.sum((y - operator(x0)) ** 2, axis=rest))
            return r.sum(), (g, x0, r)

        x = state.position
        (_, (g, x0, r)), gr = jax.value_and_grad(x0_and_residual, has_aux=True)(x)
        d = s ** 2 - sn ** 2
        xi = jax.random.normal(rng_key, x.shape, x.dtype)
        x = x - d * g + jnp.sqrt(d) * xi * (sn > 0) - zeta * gr                  # (D.2), (D.3)
        return DPSState(x, state.step + 1), DPSInfo(s, r, x0)

    return kernel


def _check(y, image_shape, num_steps, sigma_max, sigma_end, zeta):
    if jnp.ndim(y) < 2:
        raise ValueError(f"y: expected a batch [B, ...], got shape {jnp.shape(y)}")
    if not all(int(n) == n and n > 0 for n in tuple(image_shape)):
        raise ValueError(f"image_shape: expected positive ints, got {image_shape!r}")
    if isinstance(num_steps, bool) or not isinstance(num_steps, int) or num_steps < 2:
        raise ValueError(f"num_steps: expected an int >= 2, got {num_steps!r}")
    if not sigma_max > sigma_end > 0:
        raise ValueError(f"sigma_max, sigma_end: expected sigma_max > sigma_end > 0, got "
                         f"{sigma_max}, {sigma_end}")
    if not isinstance(zeta, jax.core.Tracer) and not zeta >= 0:  # traced: its caller checks it
        raise ValueError(f"zeta: expected >= 0, got {zeta}")


def diffusion_posterior_sampling(energy_fn: EnergyFn, operator: Callable, y, *, image_shape,
                                 num_steps: int = 100, sigma_max: float = 20.0,
                                 sigma_end: float = 0.01,
                                 zeta: float = 1.0) -> SamplingAlgorithm:
    """DPS with the measurement and the levels bound.

    Args:
      energy_fn: ``U(y, cov) -> [B]``.
      operator: ``A``, a batch ``[B, *image_shape]`` to measurements of ``y``'s shape.
      y: the measurements ``[B, ...]``, one row per chain.
      image_shape: one image's shape.
      num_steps: ``K``, the levels (>= 2).
      sigma_max: the first level.
      sigma_end: the last level, in ``(0, sigma_max)``.
      zeta: the step of the measurement guidance (D.3), >= 0.

    Returns:
      A :class:`~jaxlib_ext.samplers.base.SamplingAlgorithm`: ``init(position) ->``
      :class:`DPSState` and ``step(rng_key, state) -> (state,`` :class:`DPSInfo` ``)``.

    References:
      Chung et al., arXiv 2209.14687, Algorithm 1.
    """
    y = jnp.asarray(y)
    _check(y, image_shape, num_steps, sigma_max, sigma_end, zeta)
    sigmas = geometric_sigmas(sigma_max, sigma_end, num_steps)
    kernel = build_kernel(energy_fn, zeta=zeta)

    def step_fn(rng_key, state: DPSState):
        return kernel(rng_key, state, operator, y, sigmas)

    return SamplingAlgorithm(init, step_fn)


def sample(rng_key, energy_fn: EnergyFn, operator: Callable, y, *, image_shape,
           num_steps: int = 100, sigma_max: float = 20.0, sigma_end: float = 0.01,
           zeta: float = 1.0) -> DPSResult:
    """Run DPS (D.1)-(D.3) from ``x_0 = sigma_max xi``.

    Args:
      rng_key: a PRNG key (the start and every step).
      energy_fn: ``U(y, cov) -> [B]``.
      operator: ``A``, a batch ``[B, *image_shape]`` to measurements of ``y``'s shape.
      y: the measurements ``[B, ...]``, one row per chain.
      image_shape: one image's shape.
      num_steps: ``K``, the levels (>= 2), one network gradient and one vector-Hessian
        product each.
      sigma_max: the first level.
      sigma_end: the last level, in ``(0, sigma_max)``.
      zeta: the step of the measurement guidance (D.3), >= 0.

    Returns:
      A :class:`DPSResult`.

    References:
      Chung et al., arXiv 2209.14687, Algorithm 1.
    """
    y = jnp.asarray(y)
    algorithm = diffusion_posterior_sampling(energy_fn, operator, y, image_shape=image_shape,
                                             num_steps=num_steps, sigma_max=sigma_max,
                                             sigma_end=sigma_end, zeta=zeta)
    k0, key = jax.random.split(rng_key)
    x = initial_position(k0, (y.shape[0], *tuple(image_shape)), sigma_max, y.dtype)

    # the last denoised estimate rides in the carry: only the residuals are stacked
    def body(carry, k):
        state, _ = carry
        state, info = algorithm.step(k, state)
        return (state, info.denoised), info.residual

    (_, x0), rs = jax.lax.scan(body, (algorithm.init(x), x), jax.random.split(key, num_steps))
    return DPSResult(x0, rs, num_steps)
