"""Stochastic-approximation baselines of SOSMC (arXiv 2601.22003) in the same API: a
:class:`~jaxlib_ext.samplers.base.SamplingAlgorithm` over :class:`~.sosmc.SOSMCState` /
:class:`~.sosmc.SOSMCInfo`, driven by :func:`~.sosmc.run`. Neither has weights: the log-weights
stay uniform, ``ess`` is the number of particles (chains) and ``log_z_increment`` is NaN.

The defaults follow the SOSMC authors' baselines (their reward-tuning notebook,
``reward_tuning/langevin_processes/experiments.ipynb``); our forms are named options.

* **ImpDiff** (single loop; Marion et al. 2024, "Implicit diffusion", arXiv 2402.05468): per
  outer step, one ULA step (K.1) per particle at ``theta_k``, then the gradient from the
  unweighted *moved* particles at ``theta_k``, then the optax update
  (``order="move_first"``, the authors' order)::

      X_i' = X_i - h grad_x U_{theta_k}(X_i) + sqrt(2h) xi_i
      theta_{k+1} = theta_k + optax_update(mean_i H_{theta_k}(X_i'))

  ``order="grad_first"`` (ours) takes the gradient at the particles before the move, then
  moves them at ``theta_k``.

* **SOUL** (double loop; De Bortoli, Durmus, Pereyra, Vidal 2021, arXiv 2003.11475): per outer
  step, ``M = num_inner_steps`` ULA steps at ``theta_k`` on each of ``C = num_chains``
  persistent chains, ``X^c_1, ..., X^c_M``; the first ``b = burn_in`` iterates of every chain
  are dropped and the gradient averages ``H_{theta_k}`` over the remaining ``(M - b) C`` path
  points (uniform weights, handed to ``objective_grad`` as one particle set)::

      theta_{k+1} = theta_k + optax_update( 1/((M - b) C) sum_c sum_{j > b} H_{theta_k}(X^c_j) )

  The default ``num_chains=1`` is the authors' SOUL: **one** chain whose path supplies the
  samples (their experiments set ``M`` to SOSMC's particle count and ``b = M / 2``, so one
  outer step costs as many moves as one SOSMC step). ``num_chains=N`` is ours: ``N``
  persistent chains, ``M N`` moves per outer step.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
import optax

from jaxlib_ext.samplers.base import SamplingAlgorithm
from jaxlib_ext.samplers.smc.moves import ula
from jaxlib_ext.samplers.smc.objectives import weighted_potential_grad
from jaxlib_ext.samplers.smc.sosmc import (
    SOSMCInfo,
    SOSMCState,
    check_callables,
    check_common,
    init,
    is_finite_state,
)

__all__ = ["IMPDIFF_ORDERS", "build_impdiff_kernel", "build_soul_kernel", "impdiff", "soul"]

#: ``"move_first"``: the SOSMC authors' ImpDiff; ``"grad_first"``: ours.
IMPDIFF_ORDERS = ("move_first", "grad_first")


def _ula_all(key, potential, params, particles, h, n):
    keys = jax.random.split(key, n)
    moved, _ = jax.vmap(lambda k, x: ula(k, potential, params, x, h))(keys, particles)
    return moved


def _info(params, state, lw, particles, n):
    dt = lw.dtype
    return SOSMCInfo(ess=jnp.asarray(n, dt), step_size=state.step_size,
                     resampled=jnp.zeros((), bool), acceptance_rate=jnp.ones((), dt),
                     log_z_increment=jnp.full((), jnp.nan, dt),
                     finite=is_finite_state(params, particles, lw))


def _check_int(name, value, minimum):
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name}: expected an int >= {minimum}, got {value!r}")
    return value


def _init_fn(optimizer, num_particles, step_size):
    def init_fn(position, rng_key=None) -> SOSMCState:
        del rng_key
        return init(position, optimizer, step_size, num_particles=num_particles)

    return init_fn


def build_impdiff_kernel(potential: Callable, optimizer: optax.GradientTransformation, *,
                         objective_grad: Callable | None = None,
                         order: str = "move_first") -> Callable:
    """One ImpDiff step (module docstring) as a pure kernel on :class:`~.sosmc.SOSMCState`.

    Args:
      potential, optimizer, objective_grad, order: as in :func:`impdiff`.

    Returns:
      ``kernel(rng_key, state) -> (state, info)``; the ULA step size is ``state.step_size``
      and the particle count is read off ``state.log_weights``. The key is split into
      ``(k_move, k_grad)``, the move's key into one key per particle.

    References:
      Marion et al., "Implicit diffusion: efficient optimization through stochastic
      sampling", arXiv 2402.05468.
    """
    check_callables(potential, optimizer, objective_grad)
    if order not in IMPDIFF_ORDERS:
        raise ValueError(f"order: expected one of {IMPDIFF_ORDERS}, got {order!r}")
    grad_fn = objective_grad if objective_grad is not None else weighted_potential_grad(potential)

    def kernel(rng_key, state: SOSMCState) -> tuple[SOSMCState, SOSMCInfo]:
        n = state.log_weights.shape[0]
        k_move, k_grad = jax.random.split(rng_key)
        w = jnp.full((n,), 1.0 / n, state.log_weights.dtype)
        moved = _ula_all(k_move, potential, state.params, state.particles, state.step_size, n)
        at = moved if order == "move_first" else state.particles
        g = grad_fn(state.params, at, w, k_grad)
        updates, opt_state = optimizer.update(g, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)
        new = state._replace(params=params, particles=moved, opt_state=opt_state,
                             step=state.step + 1)
        return new, _info(params, state, state.log_weights, moved, n)

    return kernel


def impdiff(potential: Callable, optimizer: optax.GradientTransformation, *, num_particles: int,
            step_size: float = 0.1, objective_grad: Callable | None = None,
            order: str = "move_first") -> SamplingAlgorithm:
    """ImpDiff (module docstring): one unweighted ULA step per parameter step.

    Args:
      potential, optimizer, num_particles, objective_grad: as in :func:`~.sosmc.sosmc`.
      step_size: the fixed ULA step ``h``.
      order: ``"move_first"`` (the SOSMC authors' order: move at ``theta_k``, then the
        gradient at the moved particles) or ``"grad_first"`` (ours: the gradient at the
        current particles, then the move).

    Returns:
      A :class:`~jaxlib_ext.samplers.base.SamplingAlgorithm`: ``init(position, rng_key=None)``
      with ``position = (params, particles)`` (:func:`~.sosmc.init`) and
      ``step(rng_key, state)`` (:func:`build_impdiff_kernel`).

    References:
      Marion et al., "Implicit diffusion: efficient optimization through stochastic
      sampling", arXiv 2402.05468.
    """
    n, h0 = check_common(potential, optimizer, num_particles, step_size, objective_grad)
    kernel = build_impdiff_kernel(potential, optimizer, objective_grad=objective_grad,
                                  order=order)
    return SamplingAlgorithm(_init_fn(optimizer, n, h0), kernel)


def build_soul_kernel(potential: Callable, optimizer: optax.GradientTransformation, *,
                      num_inner_steps: int = 50, burn_in: int = 0,
                      objective_grad: Callable | None = None) -> Callable:
    """One SOUL outer step (module docstring) as a pure kernel on
    :class:`~.sosmc.SOSMCState`.

    Args:
      potential, optimizer, num_inner_steps, burn_in, objective_grad: as in :func:`soul`.

    Returns:
      ``kernel(rng_key, state) -> (state, info)``; the ULA step size is ``state.step_size``
      and the chain count ``C`` is read off ``state.log_weights``. The key is split into
      ``(k_inner, k_grad)``, ``k_inner`` into ``M`` keys, one per inner step, each split into
      one key per chain.

    References:
      De Bortoli, Durmus, Pereyra, Vidal, "Efficient stochastic optimisation by unadjusted
      Langevin Monte Carlo", arXiv 2003.11475.
    """
    m = _check_int("num_inner_steps", num_inner_steps, 1)
    b = _check_int("burn_in", burn_in, 0)
    if b >= m:
        raise ValueError(f"burn_in: expected < num_inner_steps={m}, got {burn_in!r}")
    check_callables(potential, optimizer, objective_grad)
    grad_fn = objective_grad if objective_grad is not None else weighted_potential_grad(potential)

    def kernel(rng_key, state: SOSMCState) -> tuple[SOSMCState, SOSMCInfo]:
        c = state.log_weights.shape[0]
        used = (m - b) * c
        k_inner, k_grad = jax.random.split(rng_key)

        def inner(x, k):
            x = _ula_all(k, potential, state.params, x, state.step_size, c)
            return x, x

        last, path = jax.lax.scan(inner, state.particles, jax.random.split(k_inner, m))
        flat = jax.tree.map(lambda a: a[b:].reshape((used,) + a.shape[2:]), path)
        w = jnp.full((used,), 1.0 / used, state.log_weights.dtype)
        g = grad_fn(state.params, flat, w, k_grad)
        updates, opt_state = optimizer.update(g, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)
        new = state._replace(params=params, particles=last, opt_state=opt_state,
                             step=state.step + 1)
        return new, _info(params, state, state.log_weights, last, c)

    return kernel


def soul(potential: Callable, optimizer: optax.GradientTransformation, *,
         num_inner_steps: int = 50, num_chains: int = 1, burn_in: int = 0,
         step_size: float = 0.1, objective_grad: Callable | None = None) -> SamplingAlgorithm:
    """SOUL (module docstring): ``num_inner_steps`` ULA steps per parameter step on
    ``num_chains`` persistent chains, the gradient averaged over the path after ``burn_in``.

    Args:
      potential, optimizer, objective_grad: as in :func:`~.sosmc.sosmc`.
      num_inner_steps: ``M >= 1`` ULA steps per outer step (50 by default, as in the authors'
        ``soul``; their experiments use SOSMC's particle count).
      num_chains: ``C >= 1`` chains; ``1`` (default) is the authors' single chain, ``C = N``
        our ``N`` persistent chains. The particles of ``init``'s position have leading axis
        ``C``.
      burn_in: ``0 <= b < M`` path points dropped per chain and outer step (0 by default, as in
        the authors' ``soul``; their experiments use ``M / 2``).
      step_size: the fixed ULA step ``h``.

    Returns:
      A :class:`~jaxlib_ext.samplers.base.SamplingAlgorithm`: ``init(position, rng_key=None)``
      with ``position = (params, particles)`` (:func:`~.sosmc.init`) and
      ``step(rng_key, state)`` (:func:`build_soul_kernel`).

    References:
      De Bortoli, Durmus, Pereyra, Vidal, "Efficient stochastic optimisation by unadjusted
      Langevin Monte Carlo", arXiv 2003.11475.
    """
    _check_int("num_inner_steps", num_inner_steps, 1)
    c = _check_int("num_chains", num_chains, 1)
    _, h0 = check_common(potential, optimizer, None, step_size, objective_grad)
    kernel = build_soul_kernel(potential, optimizer, num_inner_steps=num_inner_steps,
                               burn_in=burn_in, objective_grad=objective_grad)
    return SamplingAlgorithm(_init_fn(optimizer, c, h0), kernel)
