"""Discrete Langevin samplers over integer assignments, many chains under ``jit``/``vmap``.

Target: ``pi(z) ∝ exp(-E(z) / tau)`` with ``E`` the penalty energy (E.1) of :mod:`energy` and
``z`` integer in the box ``[lower, upper]`` (general integers, not only binaries).

**Discrete Langevin proposal** (DLP; Zhang, Liu, Liu, arXiv 2206.09914, eq. 3), coordinates
independent, ``g = grad E(z)`` on the relaxation, candidate moves ``d in {-W..W}`` inside the box::

    q_i(z_i + d | z) ∝ exp(-(g_i / (2 tau)) d - d^2 / (2 alpha))                           (D.1)

(for a binary ``z_i`` and ``W = 1`` this is the flip probability
``sigmoid(-(g_i/(2 tau))(1 - 2 z_i) - 1/(2 alpha))``). ``rule="dmala"`` adds the
Metropolis-Hastings test of Zhang et al. (Alg. 2)::

    accept with prob  min(1, exp(-(E(z') - E(z)) / tau) q(z | z') / q(z' | z))            (D.2)

which makes ``pi`` invariant exactly (the window ``{-W..W}`` is symmetric, so every move has its
reverse). ``rule="dlp"`` is the unadjusted proposal.

**Regularised flip rule** (``rule="rld"``; regularised Langevin dynamics, Feng and Yang, ICML
2025): each coordinate has one candidate move ``dir_i in {-1, +1}``, the one of larger first-order
decrease, with ``delta_i = 1/2 max_d (-g_i d)``; with ``delta_(k)`` the ``k``-th largest::

    P(move i) = sigmoid((delta_i - delta_(k)) / tau + b_i)                               (D.3)

so about ``k`` coordinates move per step. ``b_i`` is an optional learned logit (the
unsupervised GNN of :mod:`gnn`, zero when untrained); the rule is a heuristic annealer, not
MH-corrected, as in Feng and Yang.

**Learned proposal** (``rule="learned"`` and ``"learned-mh"``): the moves of every column are
drawn from the network's own distribution (P.1) of :mod:`proposal`, unadjusted or with the
Metropolis-Hastings test (P.2), which keeps ``pi`` invariant exactly for any parameters.

**Annealing** (:func:`annealing_schedule`): temperature ``tau`` and penalty ``lam`` follow
geometric schedules over the steps of a run, cooling ``tau`` and raising ``lam`` so that late
samples concentrate on feasible low-objective points. Every chain records the best objective among
the states it visits whose rows are satisfied (violation below ``feas_tol`` in (E.1)'s weighted
units; for problems with continuous columns this is only a hint, the host LP completion decides).

Layout (BlackJAX's, :mod:`jaxlib_ext.samplers.base`): :func:`init` makes a
:class:`DiscreteLangevinState`, :func:`build_kernel` returns ``kernel(rng_key, state, data,
shift, const, temperature, penalty, params) -> (state, info)`` with a
:class:`DiscreteLangevinInfo`, :func:`discrete_langevin` binds a problem and a fixed
temperature and penalty and returns a :class:`~jaxlib_ext.samplers.base.SamplingAlgorithm`,
and :func:`run_langevin` scans the kernel along an annealing schedule for all chains (vmapped)
in one ``jit``.

References:
  Zhang, Liu, Liu, A Langevin-like Sampler for Discrete Distributions, arXiv 2206.09914 (DLP,
  DMALA); Feng and Yang, Regularized Langevin Dynamics for Combinatorial Optimization, ICML
  2025 (the flip rule and the learned proposal); the unsupervised Langevin MILP sampler, ICML
  2026 (UNLS4MILP; abstract only).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxlib_ext.samplers.base import SamplingAlgorithm
from jaxlib_ext.samplers.milp.energy import EnergyData, energy_terms

__all__ = ["LEARNED_RULES", "RULES", "DiscreteLangevinInfo", "DiscreteLangevinState",
           "annealing_schedule", "build_kernel", "coordinate_gains", "discrete_langevin",
           "dlp_logits", "flip_logits", "init", "move_log_probs", "proposal_log_prob",
           "run_langevin"]

#: The sampling rules of :func:`build_kernel` (algorithms, not implementations).
RULES = ("dlp", "dmala", "rld", "learned", "learned-mh")
#: The rules whose moves a learned proposal draws.
LEARNED_RULES = ("learned", "learned-mh")


class DiscreteLangevinState(NamedTuple):
    """One discrete Langevin chain over the integer block.

    Attributes:
      z: ``(n,)`` the current assignment (float, integer-valued).
      energy: ``()`` its energy (E.1) at the penalty of the last step.
      best_z: ``(n,)`` the best row-feasible state visited.
      best_objective: ``()`` its objective (``+inf`` if none).
    """

    z: jax.Array
    energy: jax.Array
    best_z: jax.Array
    best_objective: jax.Array


class DiscreteLangevinInfo(NamedTuple):
    """Diagnostics of one step.

    Attributes:
      accepted: ``1.0`` if the move was accepted (always without a Metropolis-Hastings test).
      num_moved: the number of coordinates that moved.
      energy: the energy after the step.
      penalty_term: the weighted violation of (E.1) after the step.
    """

    accepted: jax.Array
    num_moved: jax.Array
    energy: jax.Array
    penalty_term: jax.Array


def annealing_schedule(num_steps: int, temperature=(1.0, 0.02), penalty=(1.0, 10.0)):
    """Geometric annealing schedules of the temperature ``tau`` and the penalty ``lam``.

    Computed on the host, so that no device program is compiled for it.

    Args:
      num_steps: the length of the schedules, ``>= 1``.
      temperature: ``(first, last)`` temperature, both ``> 0`` (equal values give a constant
        schedule).
      penalty: ``(first, last)`` penalty, both ``> 0``.

    Returns:
      ``(temperatures, penalties)``, each a float32 NumPy array ``(num_steps,)`` from the first
      to the last value of its pair.

    Raises:
      ValueError: ``num_steps < 1`` or a non-positive value.
    """
    if num_steps < 1:
        raise ValueError(f"num_steps: expected >= 1, got {num_steps}")
    for name, (a, b) in (("temperature", temperature), ("penalty", penalty)):
        if not (a > 0 and b > 0):
            raise ValueError(f"{name}: expected two positive values, got {(a, b)}")
    frac = np.linspace(0.0, 1.0, num_steps)
    geo = lambda a, b: (a * (b / a) ** frac).astype(np.float32)  # noqa: E731
    return geo(*map(float, temperature)), geo(*map(float, penalty))


def _terms_and_grad(data, z, shift, const, penalty, power):
    def e(z):
        obj, pen = energy_terms(data, z, shift, const, power)
        return obj + penalty * pen, (obj, pen)
    (val, (obj, pen)), g = jax.value_and_grad(e, has_aux=True)(z)
    return val, obj, pen, g * data.var_mask


def dlp_logits(data: EnergyData, z, g, temperature, step_size, window: int = 1):
    """The logits (D.1) of the discrete Langevin proposal over the moves ``d = -W..W``.

    Args:
      data: the :class:`~jaxlib_ext.samplers.milp.energy.EnergyData` of the integer block.
      z: ``(n,)`` the current assignment.
      g: ``(n,)`` the energy's gradient at ``z`` (on the relaxation).
      temperature: ``tau > 0``.
      step_size: ``alpha > 0``.
      window: ``W >= 1``, the largest move of one coordinate.

    Returns:
      ``(n, 2W+1)`` logits, ``-inf`` outside the box and for padded columns (which only keep
      ``d = 0``).

    References:
      Zhang, Liu, Liu, arXiv 2206.09914, eq. 3.
    """
    d = jnp.arange(-window, window + 1, dtype=z.dtype)
    v = z[:, None] + d
    valid = (v >= data.lower[:, None]) & (v <= data.upper[:, None])
    valid = valid & ((data.var_mask[:, None] > 0) | (d == 0))
    logits = -0.5 * (g / temperature)[:, None] * d - d * d / (2.0 * step_size)
    return jnp.where(valid, logits, -jnp.inf)


def proposal_log_prob(data: EnergyData, z_from, z_to, g_from, temperature, step_size,
                      window: int = 1):
    """``log q(z_to | z_from)`` of the discrete Langevin proposal (D.1).

    Args:
      data: the :class:`~jaxlib_ext.samplers.milp.energy.EnergyData` of the integer block.
      z_from: ``(n,)`` the assignment moved from.
      z_to: ``(n,)`` the assignment moved to.
      g_from: ``(n,)`` the energy's gradient at ``z_from``.
      temperature: ``tau > 0``.
      step_size: ``alpha > 0``.
      window: ``W >= 1``.

    Returns:
      The scalar log-probability, ``-inf`` if a coordinate moves beyond the window.

    References:
      Zhang, Liu, Liu, arXiv 2206.09914, eq. 3.
    """
    logp = jax.nn.log_softmax(dlp_logits(data, z_from, g_from, temperature, step_size, window), -1)
    d = (z_to - z_from).astype(jnp.int32)
    inside = jnp.abs(d) <= window
    idx = jnp.clip(d + window, 0, 2 * window)
    lp = jnp.take_along_axis(logp, idx[:, None], axis=-1)[:, 0]
    return jnp.where(jnp.all(inside), jnp.sum(lp), -jnp.inf)


def move_log_probs(logits, data: EnergyData, z):
    """Log-probabilities of the moves ``d = -1, 0, +1`` of the learned proposal (P.1) of
    :mod:`~jaxlib_ext.samplers.milp.proposal`.

    Args:
      logits: ``(n, 2)`` the network's output ``(u^-, u^+)`` at ``z``.
      data: the :class:`~jaxlib_ext.samplers.milp.energy.EnergyData` of the integer block.
      z: ``(n,)`` the current assignment.

    Returns:
      ``(n, 3)`` log-probabilities, ``-inf`` for moves out of the box and for padded columns
      (which stay).
    """
    real = data.var_mask > 0
    down_ok = (z - 1 >= data.lower) & real
    up_ok = (z + 1 <= data.upper) & real
    full = jnp.stack([jnp.where(down_ok, logits[:, 0], -jnp.inf), jnp.zeros_like(z),
                      jnp.where(up_ok, logits[:, 1], -jnp.inf)], -1)
    return jax.nn.log_softmax(full, axis=-1)


def coordinate_gains(data: EnergyData, z, shift=0.0, const=0.0, penalty=1.0, power: int = 1):
    """Exact single-coordinate energy decreases, in ``O(m n)``.

    The first-order terms ``-g_j`` and ``g_j`` are their Taylor approximation; (E.1) has kinks
    at the row bounds, where the exact change is what matters.

    Args:
      data: the :class:`~jaxlib_ext.samplers.milp.energy.EnergyData` of the integer block.
      z: ``(n,)`` the current assignment.
      shift: ``(m,)`` (or scalar) the continuous block's row shift of (E.1).
      const: the continuous block's constant objective (unused: it cancels in a difference).
      penalty: ``lam`` of (E.1).
      power: 1 (absolute) or 2 (squared) violations.

    Returns:
      ``(up, down)``, each ``(n,)``: ``E(z) - E(z + e_j)`` and ``E(z) - E(z - e_j)``, with the
      cut model of (E.2) where ``data`` has cuts.
    """
    r = data.A @ z + shift

    def pen(rr):
        v = data.row_weight[:, None] * (jnp.maximum(rr - data.row_upper[:, None], 0.0)
                                        + jnp.maximum(data.row_lower[:, None] - rr, 0.0))
        return jnp.sum(v if power == 1 else v * v, axis=0)

    base = pen(r[:, None])[0]
    up = (-data.c / data.obj_scale) + penalty * (base - pen(r[:, None] + data.A))
    down = (data.c / data.obj_scale) + penalty * (base - pen(r[:, None] - data.A))
    if data.cut_a.shape[0]:  # the cut model of (E.2): max_k (a_k + h_k^T z) after each move
        lin = data.cut_a + data.cut_h @ z
        cur = jnp.max(lin)
        up = up + (cur - jnp.max(lin[:, None] + data.cut_h, axis=0)) / data.obj_scale
        down = down + (cur - jnp.max(lin[:, None] - data.cut_h, axis=0)) / data.obj_scale
    return up, down


def flip_logits(data: EnergyData, z, g, temperature, num_flips: int, gains=None):
    """The regularised flip rule (D.3) without its learned term.

    Args:
      data: the :class:`~jaxlib_ext.samplers.milp.energy.EnergyData` of the integer block.
      z: ``(n,)`` the current assignment.
      g: ``(n,)`` the energy's gradient at ``z``.
      temperature: ``tau > 0``.
      num_flips: ``k``, about the number of coordinates that move per step.
      gains: optional exact ``(up, down)`` decreases from :func:`coordinate_gains`, used
        instead of the first-order ``(-g, g)``.

    Returns:
      ``(logits, direction)``, each ``(n,)``: the move logits (``-inf`` where no move is
      possible) and the move of each coordinate (``-1`` or ``+1``).

    References:
      Feng and Yang, Regularized Langevin Dynamics for Combinatorial Optimization, ICML 2025.
    """
    up_ok = (z + 1 <= data.upper) & (data.var_mask > 0)
    down_ok = (z - 1 >= data.lower) & (data.var_mask > 0)
    gu, gd = (-g, g) if gains is None else gains
    gain_up = jnp.where(up_ok, gu, -jnp.inf)
    gain_down = jnp.where(down_ok, gd, -jnp.inf)
    direction = jnp.where(gain_up >= gain_down, 1.0, -1.0).astype(z.dtype)
    delta = 0.5 * jnp.maximum(gain_up, gain_down)
    k = min(int(num_flips), z.shape[0])
    kth = jax.lax.top_k(jnp.where(jnp.isfinite(delta), delta, -1e30), k)[0][-1]
    kth = jnp.maximum(kth, 0.0)  # fewer than k improving moves: threshold at no gain
    logits = jnp.where(jnp.isfinite(delta), (delta - kth) / temperature, -jnp.inf)
    return logits, direction


def init(data: EnergyData, z, shift=0.0, const=0.0, penalty=1.0, power: int = 1,
         feas_tol: float = 1e-6) -> DiscreteLangevinState:
    """The state of one chain at an assignment.

    Args:
      data: the :class:`~jaxlib_ext.samplers.milp.energy.EnergyData` of the integer block.
      z: ``(n,)`` the assignment, rounded and clipped into the box.
      shift: ``(m,)`` (or scalar) the continuous block's row shift of (E.1).
      const: the continuous block's constant objective of (E.1).
      penalty: ``lam`` of (E.1).
      power: 1 (absolute) or 2 (squared) violations.
      feas_tol: the row violation below which ``z`` counts as row-feasible.

    Returns:
      A :class:`DiscreteLangevinState`.
    """
    z = jnp.clip(jnp.round(z), data.lower, data.upper) * data.var_mask
    obj, pen = energy_terms(data, z, shift, const, power)
    best = jnp.where(pen <= feas_tol, obj, jnp.inf)
    return DiscreteLangevinState(z, obj + penalty * pen, z, best)


def _check_rule(rule, *, step_size=1.0, window=1, num_flips=1, bias_fn=None, proposal_fn=None):
    if rule not in RULES:
        raise ValueError(f"rule: expected one of {RULES}, got {rule!r}")
    if isinstance(step_size, (int, float)) and not step_size > 0:
        raise ValueError(f"step_size: expected > 0, got {step_size}")
    if window < 1 or num_flips < 1:
        raise ValueError(f"window, num_flips: expected >= 1, got {window}, {num_flips}")
    if bias_fn is not None and rule != "rld":
        raise ValueError("bias_fn: a learned bias is used by rule='rld' only")
    if (proposal_fn is not None) != (rule in LEARNED_RULES):
        raise ValueError(f"proposal_fn: required by the rules {LEARNED_RULES} and used by "
                         f"no other, got rule={rule!r} with "
                         f"proposal_fn={'a callable' if proposal_fn is not None else None}")


def build_kernel(rule: str = "rld", *, step_size: float = 1.0, window: int = 1,
                 num_flips: int = 4, power: int = 1, feas_tol: float = 1e-6,
                 bias_fn: Callable | None = None, exact_gains: bool = True,
                 proposal_fn: Callable | None = None):
    """One step of a discrete Langevin rule as a kernel.

    Args:
      rule: "dlp" (D.1), "dmala" (D.1 + D.2), "rld" (D.3), "learned" (P.1) or "learned-mh"
        (P.1 + P.2); see :data:`RULES`.
      step_size: ``alpha`` of (D.1), ``> 0``.
      window: ``W`` of (D.1), ``>= 1``.
      num_flips: the ``k`` of (D.3), ``>= 1``.
      power: 1 (absolute) or 2 (squared) violations in (E.1).
      feas_tol: the row violation below which a state counts as row-feasible.
      bias_fn: ``bias_fn(params, data, z, g, shift, penalty) -> (n,)``, learned logits ``b_i``
        added to (D.3) (``rule="rld"`` only).
      exact_gains: with ``rule="rld"``, rank moves by the exact single-coordinate energy change
        (:func:`coordinate_gains`) instead of its first-order estimate.
      proposal_fn: ``proposal_fn(params, data, z, g, shift, penalty) -> (n, 2)``, the learned
        proposal's network (required by, and only used by, the learned rules; the temperature
        enters only the test of "learned-mh").

    Returns:
      ``kernel(rng_key, state, data, shift, const, temperature, penalty, params=None) ->
      (DiscreteLangevinState, DiscreteLangevinInfo)``; ``params`` are those of ``bias_fn`` or
      ``proposal_fn``.

    Raises:
      ValueError: an argument out of range, or ``bias_fn``/``proposal_fn`` with a rule that
        does not use it (or a learned rule without ``proposal_fn``).

    References:
      Zhang, Liu, Liu, arXiv 2206.09914, eq. 3 and Alg. 2; Feng and Yang, ICML 2025.
    """
    _check_rule(rule, step_size=step_size, window=window, num_flips=num_flips, bias_fn=bias_fn,
                proposal_fn=proposal_fn)

    def kernel(rng_key, state, data, shift, const, temperature, penalty, params=None):
        z = state.z
        e0, _, _, g = _terms_and_grad(data, z, shift, const, penalty, power)
        if rule in LEARNED_RULES:  # (P.1)
            k_prop, k_acc = jax.random.split(rng_key)
            logp = move_log_probs(proposal_fn(params, data, z, g, shift, penalty), data, z)
            idx = jax.random.categorical(k_prop, logp, axis=-1)
            z_new = z + (idx - 1).astype(z.dtype)
            accept = jnp.asarray(1.0)
        elif rule == "rld":
            gains = (coordinate_gains(data, z, shift, const, penalty, power) if exact_gains
                     else None)
            logits, direction = flip_logits(data, z, g, temperature, num_flips, gains)
            if bias_fn is not None:
                logits = logits + bias_fn(params, data, z, g, shift, penalty)
            move = jax.random.bernoulli(rng_key, jax.nn.sigmoid(logits))
            z_new = z + jnp.where(move, direction, 0.0)
            accept = jnp.asarray(1.0)
        else:
            k_prop, k_acc = jax.random.split(rng_key)
            logits = dlp_logits(data, z, g, temperature, step_size, window)
            idx = jax.random.categorical(k_prop, logits, axis=-1)
            z_new = z + (idx - window).astype(z.dtype)
            accept = jnp.asarray(1.0)
        e1, obj1, pen1, g1 = _terms_and_grad(data, z_new, shift, const, penalty, power)
        if rule in ("dmala", "learned-mh"):  # (D.2), (P.2)
            if rule == "dmala":
                fwd = proposal_log_prob(data, z, z_new, g, temperature, step_size, window)
                rev = proposal_log_prob(data, z_new, z, g1, temperature, step_size, window)
            else:  # the reverse of move index j (d = j - 1) is 2 - j
                logp1 = move_log_probs(proposal_fn(params, data, z_new, g1, shift, penalty),
                                       data, z_new)
                fwd = jnp.sum(jnp.take_along_axis(logp, idx[:, None], -1))
                rev = jnp.sum(jnp.take_along_axis(logp1, (2 - idx)[:, None], -1))
            log_acc = -(e1 - e0) / temperature + rev - fwd
            ok = jnp.log(jax.random.uniform(k_acc)) < log_acc
            accept = ok.astype(z.dtype)
            z_new = jnp.where(ok, z_new, z)
            e1 = jnp.where(ok, e1, e0)
            obj1, pen1 = energy_terms(data, z_new, shift, const, power)
        better = (pen1 <= feas_tol) & (obj1 < state.best_objective)
        new = DiscreteLangevinState(z_new, e1, jnp.where(better, z_new, state.best_z),
                                    jnp.where(better, obj1, state.best_objective))
        info = DiscreteLangevinInfo(accept, jnp.sum(z_new != z), e1, pen1)
        return new, info

    return kernel


def discrete_langevin(data: EnergyData, rule: str = "rld", *, temperature=1.0, penalty=1.0,
                      shift=0.0, const=0.0, params=None, step_size: float = 1.0,
                      window: int = 1, num_flips: int = 4, power: int = 1,
                      feas_tol: float = 1e-6, bias_fn: Callable | None = None,
                      exact_gains: bool = True,
                      proposal_fn: Callable | None = None) -> SamplingAlgorithm:
    """A discrete Langevin rule on one problem at a fixed temperature and penalty, as a
    sampling algorithm: ``init(position)`` and ``step(rng_key, state)``.

    For annealing, call :func:`build_kernel`'s kernel with each step's temperature and penalty
    (as :func:`run_langevin` does).

    Args:
      data: the :class:`~jaxlib_ext.samplers.milp.energy.EnergyData` of the integer block.
      rule: one of :data:`RULES`.
      temperature: ``tau > 0`` of the target ``exp(-E / tau)``.
      penalty: ``lam > 0`` of (E.1).
      shift: ``(m,)`` (or scalar) the continuous block's row shift of (E.1).
      const: the continuous block's constant objective of (E.1).
      params: the parameters of ``bias_fn`` or ``proposal_fn``.
      step_size, window, num_flips, power, feas_tol, bias_fn, exact_gains, proposal_fn: as
        :func:`build_kernel`.

    Returns:
      A :class:`~jaxlib_ext.samplers.base.SamplingAlgorithm` over
      :class:`DiscreteLangevinState` with :class:`DiscreteLangevinInfo`; ``init(position)``
      takes an ``(n,)`` assignment.

    Raises:
      TypeError: ``data`` is not an ``EnergyData``.
      ValueError: as :func:`build_kernel`, or a non-positive temperature or penalty, or a
        position of the wrong shape.

    References:
      Zhang, Liu, Liu, arXiv 2206.09914; Feng and Yang, ICML 2025.
    """
    if not isinstance(data, EnergyData):
        raise TypeError(f"data: expected an EnergyData (see energy_data), got "
                        f"{type(data).__name__}")
    for name, v in (("temperature", temperature), ("penalty", penalty)):
        if not isinstance(v, jax.core.Tracer) and not float(v) > 0:
            raise ValueError(f"{name}: expected > 0, got {v}")
    kernel = build_kernel(rule, step_size=step_size, window=window, num_flips=num_flips,
                          power=power, feas_tol=feas_tol, bias_fn=bias_fn,
                          exact_gains=exact_gains, proposal_fn=proposal_fn)
    n = data.c.shape[0]

    def init_fn(position):
        if jnp.shape(position) != (n,):
            raise ValueError(f"position: expected shape ({n},), got {jnp.shape(position)}")
        return init(data, jnp.asarray(position, data.c.dtype), shift, const, penalty, power,
                    feas_tol)

    def step_fn(rng_key, state):
        return kernel(rng_key, state, data, shift, const, temperature, penalty, params)

    return SamplingAlgorithm(init_fn, step_fn)


@functools.partial(jax.jit, static_argnames=("rule", "window", "num_flips", "power", "bias_fn",
                                             "feas_tol", "exact_gains", "proposal_fn"))
def _run(rng_key, data_shared, z0, shift, const, cost, temperatures, penalties, params,
         step_size, *,
         rule, window, num_flips, power, bias_fn, feas_tol, exact_gains, proposal_fn):
    kernel = build_kernel(rule, step_size=step_size, window=window, num_flips=num_flips,
                          power=power, feas_tol=feas_tol, bias_fn=bias_fn,
                          exact_gains=exact_gains, proposal_fn=proposal_fn)

    def chain(key, z0, shift, const, cost):
        data = data_shared._replace(c=cost)
        state = init(data, z0, shift, const, penalties[0], power, feas_tol)

        def body(state, xs):
            k, t, lam = xs
            state, info = kernel(k, state, data, shift, const, t, lam, params)
            return state, info

        keys = jax.random.split(key, temperatures.shape[0])
        return jax.lax.scan(body, state, (keys, temperatures, penalties))

    keys = jax.random.split(rng_key, z0.shape[0])
    return jax.vmap(chain)(keys, z0, shift, const, cost)


def run_langevin(rng_key, data: EnergyData, z0, *, temperatures, penalties, shift=None,
                 const=None, cost=None, rule: str = "rld", step_size: float = 1.0,
                 window: int = 1, num_flips: int = 4, power: int = 1, feas_tol: float = 1e-6,
                 bias_fn: Callable | None = None, bias_params=None, exact_gains: bool = True,
                 proposal_fn: Callable | None = None, proposal_params=None):
    """Run ``K`` annealed chains of :func:`build_kernel`'s kernel in one ``jit``.

    Args:
      rng_key: PRNG key, split into one key per chain.
      data: the :class:`~jaxlib_ext.samplers.milp.energy.EnergyData` of the integer block.
      z0: ``(K, n)`` the chains' starting assignments.
      temperatures: ``(T,)`` the temperature of each step (see :func:`annealing_schedule`).
      penalties: ``(T,)`` the penalty of each step.
      shift: ``(K, m)`` the per-chain continuous-block row shifts of (E.1) (zeros by default).
      const: ``(K,)`` the per-chain continuous-block constants of (E.1) (zeros by default).
      cost: ``(K, n)`` per-chain integer costs replacing ``data.c`` ((E.2) of
        :mod:`~jaxlib_ext.samplers.milp.energy`).
      rule: one of :data:`RULES`.
      step_size, window, num_flips, power, feas_tol, exact_gains: as :func:`build_kernel`.
      bias_fn: as :func:`build_kernel`; a hashable callable that is the same object across
        calls (it is a static argument).
      bias_params: the pytree of ``bias_fn``'s parameters.
      proposal_fn: as :func:`build_kernel`, hashable like ``bias_fn``.
      proposal_params: the pytree of ``proposal_fn``'s parameters.

    Returns:
      ``(state, info)``: the final :class:`DiscreteLangevinState` (leaves with a leading ``K``
      axis) and the :class:`DiscreteLangevinInfo` trace (leaves ``(K, T)``).

    Raises:
      ValueError: an argument of the wrong shape (naming it) or out of range.
    """
    z0 = jnp.asarray(z0, data.c.dtype)
    n, m = data.c.shape[0], data.A.shape[0]
    if z0.ndim != 2 or z0.shape[1] != n:
        raise ValueError(f"z0: expected shape (K, {n}), got {z0.shape}")
    k = z0.shape[0]
    temperatures = jnp.asarray(temperatures, data.c.dtype)
    penalties = jnp.asarray(penalties, data.c.dtype)
    if temperatures.ndim != 1 or temperatures.shape != penalties.shape:
        raise ValueError("temperatures, penalties: expected two vectors of the same length, got "
                         f"{temperatures.shape} and {penalties.shape}")
    shift = jnp.zeros((k, m), data.c.dtype) if shift is None else jnp.asarray(shift, data.c.dtype)
    const = jnp.zeros((k,), data.c.dtype) if const is None else jnp.asarray(const, data.c.dtype)
    cost = (jnp.broadcast_to(data.c, (k, n)) if cost is None
            else jnp.asarray(cost, data.c.dtype))
    if cost.shape != (k, n):
        raise ValueError(f"cost: expected shape ({k}, {n}), got {cost.shape}")
    if shift.shape != (k, m) or const.shape != (k,):
        raise ValueError(f"shift, const: expected shapes ({k}, {m}) and ({k},), got "
                         f"{shift.shape} and {const.shape}")
    if rule not in RULES:
        raise ValueError(f"rule: expected one of {RULES}, got {rule!r}")
    params = proposal_params if rule in LEARNED_RULES else bias_params
    return _run(rng_key, data, z0, shift, const, cost, temperatures, penalties, params,
                jnp.asarray(step_size, data.c.dtype), rule=rule, window=int(window),
                num_flips=int(num_flips), power=int(power), bias_fn=bias_fn,
                feas_tol=float(feas_tol), exact_gains=bool(exact_gains),
                proposal_fn=proposal_fn)
