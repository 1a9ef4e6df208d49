"""Stochastic-approximation baselines of SOSMC (arXiv 2601.22003) in the same API: an
:class:`~.sosmc.SOSMCAlgorithm` over :class:`~.sosmc.SOSMCState` / :class:`~.sosmc.SOSMCInfo`,
driven by :func:`~.sosmc.run`. Neither has weights: the log-weights stay uniform, ``ess`` is
``N`` and ``log_z_increment`` is NaN.

* **ImpDiff** (single loop; Marion et al. 2024, "Implicit diffusion"): per outer step, the
  gradient from the unweighted particles at ``theta_k``, the optax update, and one ULA step
  (K.1) per particle at ``theta_k``::

      theta_{k+1} = theta_k + optax_update(mean_i H_{theta_k}(X_i))
      X_i <- X_i - h grad_x U_{theta_k}(X_i) + sqrt(2h) xi_i

* **SOUL** (double loop; De Bortoli, Durmus, Pereyra, Vidal 2021): per outer step,
  ``num_inner_steps`` ULA steps at ``theta_k`` on each of the ``N`` persistent chains; the
  gradient averages ``H_{theta_k}`` over every inner iterate of every chain (``M N`` points,
  uniform weights, handed to ``objective_grad`` as one particle set); then the optax update.
  It costs ``num_inner_steps`` times the moves of ImpDiff per outer step.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
import optax

from jaxlib_ext.samplers.smc.moves import ula
from jaxlib_ext.samplers.smc.objectives import weighted_potential_grad
from jaxlib_ext.samplers.smc.sosmc import (
    SOSMCAlgorithm,
    SOSMCInfo,
    SOSMCState,
    check_common,
    init_state,
    is_finite_state,
)

__all__ = ["impdiff", "soul"]


def _ula_all(key, potential, params, particles, h, n):
    keys = jax.random.split(key, n)
    moved, _ = jax.vmap(lambda k, x: ula(k, potential, params, x, h))(keys, particles)
    return moved


def _info(params, state, lw, particles, n):
    dt = lw.dtype
    return SOSMCInfo(params=params, ess=jnp.asarray(n, dt), step_size=state.step_size,
                     resampled=jnp.zeros((), bool), acceptance_rate=jnp.ones((), dt),
                     log_z_increment=jnp.full((), jnp.nan, dt),
                     objective=jnp.full((), jnp.nan, dt),
                     finite=is_finite_state(params, particles, lw))


def impdiff(potential: Callable, optimizer: optax.GradientTransformation, *, num_particles: int,
            step_size: float = 0.1, objective_grad: Callable | None = None) -> SOSMCAlgorithm:
    """ImpDiff (module docstring): one unweighted ULA step per parameter step.

    Arguments as in :func:`~.sosmc.sosmc`; ``step_size`` is the fixed ULA step ``h``.
    """
    n, h0 = check_common(potential, optimizer, num_particles, step_size, objective_grad)
    grad_fn = objective_grad if objective_grad is not None else weighted_potential_grad(potential)

    def init(params, particles, key=None):
        del key
        return init_state(optimizer, n, params, particles, h0)

    def step(state: SOSMCState, key):
        k_grad, k_move = jax.random.split(key)
        w = jnp.full((n,), 1.0 / n, state.log_weights.dtype)
        g = grad_fn(state.params, state.particles, w, k_grad)
        updates, opt_state = optimizer.update(g, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)
        moved = _ula_all(k_move, potential, state.params, state.particles, state.step_size, n)
        new = state._replace(params=params, particles=moved, opt_state=opt_state,
                             step=state.step + 1)
        return new, _info(params, state, state.log_weights, moved, n)

    return SOSMCAlgorithm(init, step, n)


def soul(potential: Callable, optimizer: optax.GradientTransformation, *, num_particles: int,
         step_size: float = 0.1, num_inner_steps: int = 50,
         objective_grad: Callable | None = None) -> SOSMCAlgorithm:
    """SOUL (module docstring): ``num_inner_steps`` ULA steps per parameter step on persistent
    chains, the gradient averaged over all inner iterates.

    Arguments as in :func:`~.sosmc.sosmc`, plus ``num_inner_steps`` (``M >= 1``; 50 in the
    reference notebooks).
    """
    n, h0 = check_common(potential, optimizer, num_particles, step_size, objective_grad)
    if isinstance(num_inner_steps, bool) or not isinstance(num_inner_steps, int) \
            or num_inner_steps < 1:
        raise ValueError(f"num_inner_steps: expected an int >= 1, got {num_inner_steps!r}")
    m = num_inner_steps
    grad_fn = objective_grad if objective_grad is not None else weighted_potential_grad(potential)

    def init(params, particles, key=None):
        del key
        return init_state(optimizer, n, params, particles, h0)

    def step(state: SOSMCState, key):
        k_inner, k_grad = jax.random.split(key)

        def inner(x, k):
            x = _ula_all(k, potential, state.params, x, state.step_size, n)
            return x, x

        last, path = jax.lax.scan(inner, state.particles, jax.random.split(k_inner, m))
        flat = jax.tree.map(lambda a: a.reshape((m * n,) + a.shape[2:]), path)
        w = jnp.full((m * n,), 1.0 / (m * n), state.log_weights.dtype)
        g = grad_fn(state.params, flat, w, k_grad)
        updates, opt_state = optimizer.update(g, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)
        new = state._replace(params=params, particles=last, opt_state=opt_state,
                             step=state.step + 1)
        return new, _info(params, state, state.log_weights, last, n)

    return SOSMCAlgorithm(init, step, n)
