"""Preconditioned Langevin moves with a state-dependent step and the exact MH correction.

One move on a batch of independent chains, each targeting ``pi(x) ∝ exp(-E(x) / T)``, with a
preconditioner ``S = F^* diag(p) F`` diagonal in the pixel or Fourier basis (``p >= 0``; where
``p = 0`` the coordinate does not move) and step size ``h``::

    x' = x - h S grad E(x) + sqrt(2 T h) S^{1/2} xi,            xi ~ N(0, I)            (M.1)

``metropolis=False`` is the unadjusted (ULA) corrector of the predictor-corrector sampler;
``metropolis=True`` accepts ``x'`` with probability ``min(1, a)`` (PC-MALA, arXiv 2605.15487)::

    log a = (E(x) - E(x')) / T + log q(x | x') - log q(x' | x)                             (M.2)
    log q(x' | x) = -sum_{p_k > 0} |F(x' - x + h(x) S grad E(x))_k|^2 / (4 T h(x) p_k)
                    - (r / 2) log h(x) + const,          r = #{k : p_k > 0}                (M.3)

The step size is either fixed or the signal-to-noise rule of the predictor-corrector sampler
(Song et al. 2021; arXiv 2605.15487)::

    h(x) = 2 (snr sqrt(r) / || S^{1/2} grad E(x) ||)^2                                      (M.4)

(``sqrt(r)`` = the expected norm of ``S``'s share of the noise, so ``h`` is a function of the
state alone). Because ``h`` depends on the state, the reverse density ``q(x | x')`` of (M.3) uses
``h(x')``, recomputed from ``grad E(x')``; using ``h(x)`` for both directions breaks detailed
balance. The log-normaliser ``-(r/2) log h`` then no longer cancels and is kept.

Layout after BlackJAX: :class:`LangevinState` (position with its energy and gradient, so one
target evaluation per move), :class:`LangevinInfo`, :func:`init`, :func:`build_kernel`.
``target_fn(x) -> (E [B], grad E [B, ...])`` evaluates a batch.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp

from jaxlib_ext.samplers.energy.covariance import Covariance

__all__ = ["LangevinInfo", "LangevinState", "build_kernel", "init", "snr_step_size"]

TargetFn = Callable[[jax.Array], tuple[jax.Array, jax.Array]]


class LangevinState(NamedTuple):
    """position ``[B, ...]``; energy ``E(position)`` ``[B]``; grad ``grad E(position)``."""

    position: jax.Array
    energy: jax.Array
    grad: jax.Array


class LangevinInfo(NamedTuple):
    """acceptance_rate ``min(1, a)`` ``[B]`` (1 for ULA); is_accepted ``[B]``; step_size ``h(x)``
    ``[B]``."""

    acceptance_rate: jax.Array
    is_accepted: jax.Array
    step_size: jax.Array


def init(position, target_fn: TargetFn) -> LangevinState:
    e, g = target_fn(position)
    return LangevinState(position, e, g)


def _bshape(v, x):
    return jnp.reshape(v, v.shape + (1,) * (x.ndim - v.ndim))


def snr_step_size(grad, precond: Covariance, snr):
    """(M.4) per chain: ``2 (snr sqrt(r) / ||S^{1/2} grad||)^2``, shape ``[B]``."""
    rest = tuple(range(1, grad.ndim))
    r = jnp.sum(precond.diag > 0, axis=rest).astype(grad.dtype)
    gnorm2 = precond.quad(grad, precond.diag)
    # a chain with nothing free (r = 0) does not move; h = 1 keeps (M.3) finite there
    return jnp.where(r > 0, 2.0 * snr ** 2 * r / jnp.maximum(gnorm2, 1e-30), 1.0)


def _log_q(to, frm, grad_frm, h, precond: Covariance, temperature):
    """(M.3) up to the constant, per chain."""
    hb = _bshape(h, to)
    mean = frm - hb * precond.apply(grad_frm)
    p = precond.diag
    inv = jnp.where(p > 0, 1.0 / jnp.where(p > 0, p, 1.0), 0.0)
    rest = tuple(range(1, to.ndim))
    r = jnp.sum(p > 0, axis=rest).astype(to.dtype)
    return -precond.quad(to - mean, inv) / (4.0 * temperature * h) - 0.5 * r * jnp.log(h)


def build_kernel(*, metropolis: bool = True) -> Callable:
    """``kernel(key, state, target_fn, precond, *, step_size=None, snr=None, temperature=1.0)
    -> (state, info)``: one move (M.1) of every chain, MH-corrected (M.2) if ``metropolis``.

    Exactly one of ``step_size`` (scalar or ``[B]``) and ``snr`` (rule M.4) is given."""

    def kernel(key, state: LangevinState, target_fn: TargetFn, precond: Covariance, *,
               step_size=None, snr=None, temperature=1.0):
        if (step_size is None) == (snr is None):
            raise ValueError("step_size, snr: give exactly one of them")
        x = state.position
        b = x.shape[0]

        def h_of(grad):
            if snr is not None:
                return snr_step_size(grad, precond, snr)
            return jnp.broadcast_to(jnp.asarray(step_size, x.dtype), (b,))

        k_xi, k_u = jax.random.split(key)
        h = h_of(state.grad)
        xi = jax.random.normal(k_xi, x.shape, x.dtype)
        hb = _bshape(h, x)
        prop = (x - hb * precond.apply(state.grad)
                + jnp.sqrt(2.0 * temperature * hb) * precond.apply(xi, 0.5))       # (M.1)
        e1, g1 = target_fn(prop)
        if not metropolis:
            ones = jnp.ones((b,), x.dtype)
            return LangevinState(prop, e1, g1), LangevinInfo(ones, ones > 0, h)
        h1 = h_of(g1)  # the reverse step size, recomputed at the proposal
        log_a = ((state.energy - e1) / temperature
                 + _log_q(x, prop, g1, h1, precond, temperature)
                 - _log_q(prop, x, state.grad, h, precond, temperature))           # (M.2)
        log_a = jnp.where(jnp.isfinite(log_a), log_a, -jnp.inf)
        accept = jnp.log(jax.random.uniform(k_u, (b,), x.dtype)) < log_a
        ab = _bshape(accept, x)
        new = LangevinState(jnp.where(ab, prop, x), jnp.where(accept, e1, state.energy),
                            jnp.where(ab, g1, state.grad))
        return new, LangevinInfo(jnp.exp(jnp.minimum(log_a, 0.0)), accept, h)

    return kernel
