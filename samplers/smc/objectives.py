"""Gradient estimators handed to the optimiser: ``objective_grad(params, particles, weights,
key) -> grad`` (a pytree shaped like ``params``), from a weighted particle approximation
``sum_i W_i delta_{X_i}`` of ``pi_theta ∝ exp(-U_theta)`` (arXiv 2601.22003).

The problem: minimise ``l(theta)`` with ``grad l(theta) = E_{pi_theta}[H_theta(X)]``.

* **Maximum marginal likelihood** (and any objective with ``H = grad_theta U``): with
  ``U_theta(x) = -log p_theta(x, y)``, ``l(theta) = -log p_theta(y) = log Z_theta`` up to a
  constant and ``grad l = E_pi[grad_theta U_theta(X)]`` (Fisher's identity)::

      g = sum_i W_i grad_theta U_theta(X_i)                                             (G.1)

* **Reward tuning** with a KL penalty: maximise ``J(theta) = E_pi[r] - lam KL(p_ref || pi_theta)``.
  With ``grad_theta log pi_theta = -grad_theta U + E_pi[grad_theta U]``::

      grad E_pi[r]          = -Cov_pi(r(X), grad_theta U_theta(X))                       (G.2)
      grad KL(p_ref || pi)  = E_{p_ref}[grad_theta U] - E_pi[grad_theta U]               (G.3)
      g (loss = -J)         = Cov_pi(r, grad_theta U) + lam (E_ref[grad U] - E_pi[grad U])

  ``pi``-expectations use the particle weights; ``p_ref``-expectations use fresh reference
  draws each call (``reference_sampler(key)``).
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp

__all__ = ["per_particle_potential_grad", "reward_tuning_grad", "weighted_mean",
           "weighted_potential_grad"]


def weighted_mean(tree, weights):
    """``sum_i W_i tree[i]`` for every leaf (leading axis ``N``).

    Args:
      tree: pytree whose leaves have a leading axis ``N``.
      weights: ``(N,)`` weights (cast to each leaf's dtype).

    Returns:
      A pytree like ``tree`` without the leading axis.
    """
    return jax.tree.map(lambda a: jnp.tensordot(weights.astype(a.dtype), a, axes=1), tree)


def per_particle_potential_grad(potential: Callable, params, particles):
    """``grad_theta U_theta(X_i)`` for every particle.

    Args:
      potential: ``U(params, x)`` for one particle (a scalar).
      params: ``theta``, a pytree.
      particles: pytree of the ``X_i``, leading axis ``N``.

    Returns:
      A params-shaped pytree with a leading axis ``N``.
    """
    return jax.vmap(jax.grad(potential), in_axes=(None, 0))(params, particles)


def weighted_potential_grad(potential: Callable) -> Callable:
    """The default estimator (G.1) as an ``objective_grad(params, particles, weights, key)``.

    Args:
      potential: ``U(params, x)`` for one particle (a scalar).

    Returns:
      ``objective_grad(params, particles, weights, key=None)``: ``sum_i W_i grad_theta
      U_theta(X_i)``; ``key`` is unused.

    Raises:
      TypeError: if ``potential`` is not callable.
    """
    if not callable(potential):
        raise TypeError(f"potential: expected a callable U(params, x), got {type(potential)}")

    def objective_grad(params, particles, weights, key=None):
        del key
        return weighted_mean(per_particle_potential_grad(potential, params, particles), weights)

    return objective_grad


def reward_tuning_grad(potential: Callable, reward: Callable, *, kl_weight: float = 0.0,
                       reference_sampler: Callable | None = None) -> Callable:
    """Gradient of ``-J(theta)`` by (G.2)-(G.3) as an ``objective_grad``.

    Args:
      potential: ``U(params, x)`` for one particle.
      reward: ``r(x)`` for one particle (a scalar).
      kl_weight: ``lam >= 0``; ``0`` drops the KL term.
      reference_sampler: ``key -> particles`` (leading axis: the number of reference draws),
        draws from ``p_ref``; required when ``kl_weight > 0``.
    """
    if not callable(potential):
        raise TypeError(f"potential: expected a callable U(params, x), got {type(potential)}")
    if not callable(reward):
        raise TypeError(f"reward: expected a callable r(x), got {type(reward)}")
    kl_weight = float(kl_weight)
    if not (kl_weight >= 0.0 and jnp.isfinite(kl_weight)):
        raise ValueError(f"kl_weight: expected a finite value >= 0, got {kl_weight}")
    if kl_weight > 0 and not callable(reference_sampler):
        raise ValueError("reference_sampler: required (key -> reference draws) when kl_weight > 0")

    def objective_grad(params, particles, weights, key):
        gu = per_particle_potential_grad(potential, params, particles)
        r = jax.vmap(reward)(particles)
        r_c = r - jnp.dot(weights, r)
        # (G.2), sign flipped for the loss -J: Cov_pi(r, grad U) = sum_i W_i (r_i - rbar) gU_i
        g = weighted_mean(gu, weights * r_c)
        if kl_weight > 0:
            ref = reference_sampler(key)
            g_ref = jax.tree.map(lambda a: a.mean(0),
                                 per_particle_potential_grad(potential, params, ref))
            g_pi = weighted_mean(gu, weights)
            # (G.3)
            g = jax.tree.map(lambda a, b, c: a + kl_weight * (b - c), g, g_ref, g_pi)
        return g

    return objective_grad
