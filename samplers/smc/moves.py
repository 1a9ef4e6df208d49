"""Move kernels for one particle, as functions of a potential ``U(theta, x)``.

Every kernel has the signature ``kernel(key, potential, params, x, step_size) -> (x_new, info)``
where ``potential(params, x)`` is ``U_theta(x)`` (a scalar), ``x`` any pytree (flattened with
``ravel_pytree`` internally) and ``info`` a :class:`MoveInfo`. They are pure, jit-able, and
meant to be ``vmap``-ed over particles. ``pi_theta ∝ exp(-U_theta)``; ``h = step_size``;
``xi ~ N(0, I)``.

* **ULA** (unadjusted Langevin; biased, not ``pi``-invariant)::

      x' = x - h grad U(x) + sqrt(2h) xi                                               (K.1)

* **MALA**: (K.1) as a proposal with the Metropolis-Hastings correction, ``q`` the Gaussian
  density of (K.1)::

      accept with prob min(1, exp(U(x) - U(x') + log q(x | x') - log q(x' | x)))         (K.2)

* **RWM** (random-walk Metropolis): ``x' = x + sqrt(2h) xi``, accept with ``exp(U(x) - U(x'))``.
  The proposal scale ``sqrt(2h)`` is the noise of (K.1), so one step-size grid serves all moves.
* **HMC**: momentum ``p ~ N(0, I)``, ``num_integration_steps`` leapfrog steps of size
  ``eps = sqrt(2h)``, accept with ``exp(H(x, p) - H(x', p'))``, ``H = U + |p|^2 / 2``. One
  leapfrog step of size ``sqrt(2h)`` proposes exactly (K.1), so HMC with one step is MALA.

MALA, RWM and HMC leave ``pi_theta`` invariant; they are the moves of the invariant SOSMC
variant (arXiv 2601.22003, the "invariant kernel" case). ULA is the move of the ULA variant,
whose weights (``weights.ula_log_increment``) correct its bias. The Langevin proposal, its
density and the MH step are the shared ones of :mod:`jaxlib_ext.samplers.mala`.

:func:`move_algorithm` runs one move as a chain of its own with ``theta`` fixed: a
:class:`~jaxlib_ext.samplers.base.SamplingAlgorithm` over :class:`MoveState` and
:class:`MoveInfo`, the kernel contract of :mod:`jaxlib_ext.samplers.base`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax.flatten_util import ravel_pytree

from jaxlib_ext.samplers import mala as mala_step
from jaxlib_ext.samplers.base import SamplingAlgorithm

__all__ = ["MOVES", "MoveInfo", "MoveState", "hmc", "mala", "move_algorithm", "rwm", "ula"]


class MoveState(NamedTuple):
    """One chain of a move: its position ``x`` (any pytree of float arrays)."""

    position: Any


class MoveInfo(NamedTuple):
    """Per-particle diagnostics of one move.

    acceptance_prob: the Metropolis-Hastings acceptance probability (1 for ULA).
    is_accepted: whether the proposal was accepted (True for ULA).
    """

    acceptance_prob: jax.Array
    is_accepted: jax.Array


def _flat(potential, params, x):
    v, unravel = ravel_pytree(x)
    return v, unravel, (lambda z: potential(params, unravel(z)))


def _mh(key, log_ratio, x, x_prop):
    x_new, accept, prob = mala_step.mh_accept(key, log_ratio, x, x_prop)
    return x_new, MoveInfo(prob, accept)


def ula(key, potential: Callable, params, x, step_size):
    """One ULA step (K.1).

    Args:
      key: PRNG key of the Gaussian noise.
      potential: ``U(params, x) -> scalar``.
      params: ``theta``.
      x: the particle (a pytree).
      step_size: ``h > 0``.

    Returns:
      ``(x', MoveInfo)`` with acceptance 1.
    """
    v, unravel, u = _flat(potential, params, x)
    v_new = mala_step.langevin_proposal(key, v, jax.grad(u)(v), step_size)
    return unravel(v_new), MoveInfo(jnp.ones((), v.dtype), jnp.ones((), bool))


def mala(key, potential: Callable, params, x, step_size):
    """One MALA step (K.2); leaves ``pi_theta`` invariant.

    Args:
      key: PRNG key, split into the proposal's and the acceptance's.
      potential, params, x, step_size: as in :func:`ula`.

    Returns:
      ``(x', MoveInfo)``.
    """
    v, unravel, u = _flat(potential, params, x)
    k_prop, k_acc = jax.random.split(key)
    u0, g0 = jax.value_and_grad(u)(v)
    prop = mala_step.langevin_proposal(k_prop, v, g0, step_size)
    u1, g1 = jax.value_and_grad(u)(prop)
    # one step size both ways: the normaliser of q cancels
    log_q = functools.partial(mala_step.log_proposal_density, step_size=step_size,
                              normalized=False)
    log_ratio = u0 - u1 + log_q(v, prop, g1) - log_q(prop, v, g0)
    v_new, info = _mh(k_acc, log_ratio, v, prop)
    return unravel(v_new), info


def rwm(key, potential: Callable, params, x, step_size):
    """One random-walk Metropolis step, proposal ``N(x, 2h I)``; leaves ``pi_theta`` invariant.

    Args:
      key: PRNG key, split into the proposal's and the acceptance's.
      potential, params, x, step_size: as in :func:`ula`.

    Returns:
      ``(x', MoveInfo)``.
    """
    v, unravel, u = _flat(potential, params, x)
    k_prop, k_acc = jax.random.split(key)
    prop = v + jnp.sqrt(2.0 * step_size) * jax.random.normal(k_prop, v.shape, v.dtype)
    v_new, info = _mh(k_acc, u(v) - u(prop), v, prop)
    return unravel(v_new), info


def hmc(key, potential: Callable, params, x, step_size, num_integration_steps: int = 5):
    """One HMC step: ``num_integration_steps`` leapfrog steps of size ``sqrt(2h)``; leaves
    ``pi_theta`` invariant.

    Args:
      key: PRNG key, split into the momentum's and the acceptance's.
      potential, params, x, step_size: as in :func:`ula`.
      num_integration_steps: leapfrog steps, an int >= 1.

    Returns:
      ``(x', MoveInfo)``.
    """
    if not isinstance(num_integration_steps, int) or num_integration_steps < 1:
        raise ValueError(f"num_integration_steps: expected an int >= 1, "
                         f"got {num_integration_steps!r}")
    v, unravel, u = _flat(potential, params, x)
    k_mom, k_acc = jax.random.split(key)
    eps = jnp.sqrt(2.0 * step_size)
    grad = jax.value_and_grad(u)
    p0 = jax.random.normal(k_mom, v.shape, v.dtype)
    u0, g0 = grad(v)

    def leapfrog(carry, _):
        q, p, g = carry
        p = p - 0.5 * eps * g
        q = q + eps * p
        _, g = grad(q)
        p = p - 0.5 * eps * g
        return (q, p, g), None

    (q, p, _), _ = jax.lax.scan(leapfrog, (v, p0, g0), None, length=num_integration_steps)
    log_ratio = u0 + 0.5 * jnp.dot(p0, p0) - u(q) - 0.5 * jnp.dot(p, p)
    v_new, info = _mh(k_acc, log_ratio, v, q)
    return unravel(v_new), info


MOVES = {"ula": ula, "mala": mala, "rwm": rwm, "hmc": hmc}


def move_algorithm(move: str | Callable, potential: Callable, params, step_size
                   ) -> SamplingAlgorithm:
    """One move as a chain kernel on ``pi_theta`` with ``theta = params`` fixed.

    Args:
      move: ``"ula"``, ``"mala"``, ``"rwm"``, ``"hmc"`` or a callable
        ``kernel(key, potential, params, x, step_size) -> (x, MoveInfo)``.
      potential: ``U(params, x) -> scalar``.
      params: ``theta``.
      step_size: ``h > 0``.

    Returns:
      A :class:`~jaxlib_ext.samplers.base.SamplingAlgorithm`: ``init(position)`` gives a
      :class:`MoveState` and ``step(rng_key, state) -> (MoveState, MoveInfo)``.
    """
    if callable(move):
        kernel = move
    elif move in MOVES:
        kernel = MOVES[move]
    else:
        raise ValueError(f"move: expected one of {sorted(MOVES)} or a callable, got {move!r}")
    if not callable(potential):
        raise TypeError(f"potential: expected a callable U(params, x), got {type(potential)}")

    def init(position) -> MoveState:
        return MoveState(jax.tree.map(jnp.asarray, position))

    def step(rng_key, state: MoveState) -> tuple[MoveState, MoveInfo]:
        x, info = kernel(rng_key, potential, params, state.position, step_size)
        return MoveState(x), info

    return SamplingAlgorithm(init, step)
