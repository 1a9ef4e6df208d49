"""The Metropolis-adjusted Langevin step, in pieces: proposal, proposal density, MH accept.

For a target ``pi(x) ∝ exp(-E(x) / T)``, a step size ``h`` and a preconditioner ``S`` (the
identity, or ``S = F^* diag(p) F`` diagonal in an orthonormal basis ``F``, ``p >= 0``; where
``p_k = 0`` the coordinate does not move)::

    x' = x - h S grad E(x) + sqrt(2 T h) S^{1/2} xi,          xi ~ N(0, I)              (L.1)
    log q(x' | x) = -|| S^{-1/2} (x' - x + h S grad E(x)) ||^2 / (4 T h)
                    - (r / 2) log h + const,                r = #{k : p_k > 0}          (L.2)
    log a = (E(x) - E(x')) / T + log q(x | x') - log q(x' | x);
    accept x' with probability min(1, a)                                                (L.3)

(L.1) alone is the unadjusted Langevin algorithm (ULA); with (L.3) it is MALA (Roberts and
Tweedie 1996; Girolami and Calderhead 2011, arXiv 0907.1100, for the preconditioned form), which
leaves ``pi`` invariant. ``-(r/2) log h`` cancels in (L.3) when both directions use one step
size; a state-dependent step (``h(x)`` forward, ``h(x')`` reverse) needs it.

Batching: ``step_size`` has the batch shape (``()`` for one chain, ``[B]`` for a batch), and the
trailing axes of ``position`` beyond it are one chain's coordinates. A preconditioner is any
object with ``diag`` (the ``p`` of each chain, ``position``'s shape), ``apply(v, power)``
(``S^power v``) and ``quad(v, d)`` (``sum_k d_k |(F v)_k|^2`` per chain over all but the first
axis), such as :class:`jaxlib_ext.samplers.energy.Covariance`; it batches over the first axis.
Everything is pure and jit-able; a kernel builds on these three functions (see
:mod:`jaxlib_ext.samplers.energy.langevin`).
"""

from __future__ import annotations

from typing import Protocol

import jax
import jax.numpy as jnp

from jaxlib_ext.samplers._common import expand_batch

__all__ = ["DiagonalPreconditioner", "langevin_proposal", "log_proposal_density", "mh_accept"]


class DiagonalPreconditioner(Protocol):
    """``S = F^* diag(diag) F`` for an orthonormal basis ``F``, batched over the first axis."""

    diag: jax.Array

    def apply(self, v, power: float = 1.0):
        """``S^power v``.

        Args:
          v: a batch of ``diag``'s shape.
          power: the power of ``S``.

        Returns:
          ``S^power v``, ``v``'s shape.
        """

    def quad(self, v, d):
        """The quadratic form of a diagonal operator in the basis.

        Args:
          v: a batch ``[B, ...]``.
          d: the diagonal, ``v``'s shape.

        Returns:
          ``sum_k d_k |(F v)_k|^2`` ``[B]``.
        """


def langevin_proposal(rng_key, position, grad, step_size, *,
                      precond: DiagonalPreconditioner | None = None, temperature=1.0):
    """The Langevin proposal (L.1).

    Args:
      rng_key: a PRNG key; the noise ``xi`` is ``jax.random.normal(rng_key, position.shape)``.
      position: ``x``, an array ``[*batch, ...]``.
      grad: ``grad E(x)``, ``position``'s shape.
      step_size: ``h``, a scalar or of the batch shape ``[*batch]``, > 0.
      precond: ``S`` (see the module docstring), or None for the identity.
      temperature: ``T`` > 0.

    Returns:
      The proposal ``x'``, ``position``'s shape and dtype.

    References:
      Roberts and Tweedie, Bernoulli 2(4), 1996; Girolami and Calderhead, arXiv 0907.1100.
    """
    xi = jax.random.normal(rng_key, position.shape, position.dtype)
    h = expand_batch(step_size, position)
    if precond is None:
        return position - h * grad + jnp.sqrt(2.0 * temperature * h) * xi
    return (position - h * precond.apply(grad)
            + jnp.sqrt(2.0 * temperature * h) * precond.apply(xi, 0.5))


def log_proposal_density(to, frm, grad_frm, step_size, *,
                         precond: DiagonalPreconditioner | None = None, temperature=1.0,
                         normalized: bool = True):
    """``log q(to | frm)`` of (L.2) up to a constant, per chain.

    Args:
      to: the end point, ``[*batch, ...]``.
      frm: the start point, ``to``'s shape.
      grad_frm: ``grad E(frm)``, ``to``'s shape.
      step_size: ``h`` of the move out of ``frm``, a scalar or ``[*batch]``, > 0.
      precond: ``S`` (see the module docstring), or None for the identity.
      temperature: ``T`` > 0.
      normalized: keep the term ``-(r/2) log h`` (needed where the forward and reverse step
        sizes differ; with one step size for both it cancels in (L.3)).

    Returns:
      ``log q`` of the batch shape (``step_size``'s for the identity, ``[B]`` with ``precond``).

    References:
      Girolami and Calderhead, arXiv 0907.1100 (the preconditioned MALA proposal density).
    """
    h = expand_batch(step_size, to)
    if precond is None:
        batch = jnp.shape(step_size)
        d = (to - frm + h * grad_frm).reshape(batch + (-1,))
        log_q = -jnp.einsum("...i,...i->...", d, d) / (4.0 * temperature * step_size)
        r = d.shape[-1]
    else:
        mean = frm - h * precond.apply(grad_frm)
        p = precond.diag
        # S^{-1} on the coordinates that move; the others carry no density
        inv = jnp.where(p > 0, 1.0 / jnp.where(p > 0, p, 1.0), 0.0)
        r = jnp.sum(p > 0, axis=tuple(range(1, to.ndim))).astype(to.dtype)
        log_q = -precond.quad(to - mean, inv) / (4.0 * temperature * step_size)
    if normalized:
        log_q = log_q - 0.5 * r * jnp.log(step_size)
    return log_q


def mh_accept(rng_key, log_ratio, current, proposal):
    """The Metropolis-Hastings accept step (L.3), per chain.

    Args:
      rng_key: a PRNG key; the uniform draw is ``jax.random.uniform(rng_key,
        log_ratio.shape)``.
      log_ratio: ``log a`` of the batch shape; NaN (a proposal off the target's domain) counts
        as ``-inf``, a rejection.
      current: the chain's state, a pytree whose leaves have the batch shape as their leading
        axes.
      proposal: the proposed state, ``current``'s structure and shapes.

    Returns:
      ``(state, is_accepted, acceptance_prob)``: ``proposal`` where accepted and ``current``
      elsewhere, leaf by leaf; the accept decisions; ``min(1, a)``.

    References:
      Metropolis et al., J. Chem. Phys. 21, 1953; Hastings, Biometrika 57, 1970.
    """
    log_ratio = jnp.where(jnp.isnan(log_ratio), -jnp.inf, log_ratio)
    accept = jnp.log(jax.random.uniform(rng_key, log_ratio.shape, log_ratio.dtype)) < log_ratio
    state = jax.tree.map(lambda new, old: jnp.where(expand_batch(accept, new), new, old),
                         proposal, current)
    return state, accept, jnp.exp(jnp.minimum(log_ratio, 0.0))
