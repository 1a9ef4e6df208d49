"""Discrete Langevin samplers over integer assignments, many chains under ``jit``/``vmap``.

Target: ``pi(z) ∝ exp(-E(z) / tau)`` with ``E`` the penalty energy (E.1) of :mod:`energy` and
``z`` integer in the box ``[lower, upper]`` (general integers, not only binaries).

**Discrete Langevin proposal** (DLP; Zhang, Liu, Liu, arXiv 2206.09914, eq. 3), coordinates
independent, ``g = grad E(z)`` on the relaxation, candidate moves ``d in {-W..W}`` inside the box::

    q_i(z_i + d | z) ∝ exp(-(g_i / (2 tau)) d - d^2 / (2 alpha))                           (D.1)

(for a binary ``z_i`` and ``W = 1`` this is the flip probability
``sigmoid(-(g_i/(2 tau))(1 - 2 z_i) - 1/(2 alpha))``). ``method="dmala"`` adds the
Metropolis-Hastings test of Zhang et al. (Alg. 2)::

    accept with prob  min(1, exp(-(E(z') - E(z)) / tau) q(z | z') / q(z' | z))            (D.2)

which makes ``pi`` invariant exactly (the window ``{-W..W}`` is symmetric, so every move has its
reverse). ``method="dlp"`` is the unadjusted proposal.

**Regularised flip rule** (``method="rld"``; regularised Langevin dynamics, Feng and Yang, ICML
2025): each coordinate has one candidate move ``dir_i in {-1, +1}``, the one of larger first-order
decrease, with ``delta_i = 1/2 max_d (-g_i d)``; with ``delta_(k)`` the ``k``-th largest::

    P(move i) = sigmoid((delta_i - delta_(k)) / tau + b_i)                               (D.3)

so about ``k`` coordinates move per step. ``b_i`` is an optional learned logit (the
unsupervised GNN of :mod:`gnn`, zero when untrained); the rule is a heuristic annealer, not
MH-corrected, as in Feng and Yang.

**Learned proposal** (``method="learned"`` and ``"learned-mh"``): the moves of every column are
drawn from the network's own distribution (P.1) of :mod:`proposal`, unadjusted or with the
Metropolis-Hastings test (P.2), which keeps ``pi`` invariant exactly for any parameters.

**Annealing** (:func:`annealing_schedule`): temperature ``tau`` and penalty ``lam`` follow
geometric schedules over the steps of a run, cooling ``tau`` and raising ``lam`` so that late
samples concentrate on feasible low-objective points. Every chain records the best objective among
the states it visits whose rows are satisfied (violation below ``feas_tol`` in (E.1)'s weighted
units; for problems with continuous columns this is only a hint, the host LP completion decides).

Layout (BlackJAX-style): :func:`init` makes a :class:`LangevinState`, :func:`build_kernel` returns
``kernel(key, state, data, shift, const, temperature, penalty, params) -> (state, info)``
with a :class:`LangevinInfo`, and :func:`run_langevin` scans the kernel for all chains (vmapped)
in one ``jit``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxlib_ext.samplers.milp.energy import EnergyData, energy_terms

__all__ = ["METHODS", "LangevinInfo", "LangevinState", "annealing_schedule", "build_kernel",
           "coordinate_gains", "LEARNED_METHODS",
           "dlp_logits", "flip_logits", "init", "move_log_probs", "proposal_log_prob",
           "run_langevin"]

METHODS = ("dlp", "dmala", "rld", "learned", "learned-mh")
LEARNED_METHODS = ("learned", "learned-mh")


class LangevinState(NamedTuple):
    """One chain: ``z`` (n,) current assignment (float, integer-valued), ``energy`` () at the
    penalty of the last step, ``best_z`` (n,) and ``best_objective`` () the best row-feasible
    state visited (``+inf`` if none)."""

    z: jax.Array
    energy: jax.Array
    best_z: jax.Array
    best_objective: jax.Array


class LangevinInfo(NamedTuple):
    """Per-step diagnostics: ``accepted`` (1.0 without MH), ``num_moved`` coordinates,
    ``energy`` and ``penalty_term`` (the weighted violation of (E.1)) after the step."""

    accepted: jax.Array
    num_moved: jax.Array
    energy: jax.Array
    penalty_term: jax.Array


def annealing_schedule(num_steps: int, temperature=(1.0, 0.02), penalty=(1.0, 10.0)):
    """Geometric schedules ``(temperatures, penalties)``, each a float32 NumPy array
    (num_steps,), from the first to the second value of each pair (equal values give a constant
    schedule). Computed on the host, so that no device program is compiled for it."""
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
    """(D.1) logits of shape (n, 2W+1) over moves ``d = -W..W`` (``-inf`` outside the box and
    for padded columns, which only keep ``d = 0``)."""
    d = jnp.arange(-window, window + 1, dtype=z.dtype)
    v = z[:, None] + d
    valid = (v >= data.lower[:, None]) & (v <= data.upper[:, None])
    valid = valid & ((data.var_mask[:, None] > 0) | (d == 0))
    logits = -0.5 * (g / temperature)[:, None] * d - d * d / (2.0 * step_size)
    return jnp.where(valid, logits, -jnp.inf)


def proposal_log_prob(data: EnergyData, z_from, z_to, g_from, temperature, step_size,
                      window: int = 1):
    """``log q(z_to | z_from)`` of (D.1) (``-inf`` if a coordinate moves beyond the window)."""
    logp = jax.nn.log_softmax(dlp_logits(data, z_from, g_from, temperature, step_size, window), -1)
    d = (z_to - z_from).astype(jnp.int32)
    inside = jnp.abs(d) <= window
    idx = jnp.clip(d + window, 0, 2 * window)
    lp = jnp.take_along_axis(logp, idx[:, None], axis=-1)[:, 0]
    return jnp.where(jnp.all(inside), jnp.sum(lp), -jnp.inf)


def move_log_probs(logits, data: EnergyData, z):
    """Log-probabilities ``(n, 3)`` of the moves ``d = -1, 0, +1`` of the learned proposal (P.1)
    of :mod:`proposal` from its network's ``(n, 2)`` output at ``z``: ``-inf`` for moves out of
    the box and for padded columns (which stay)."""
    real = data.var_mask > 0
    down_ok = (z - 1 >= data.lower) & real
    up_ok = (z + 1 <= data.upper) & real
    full = jnp.stack([jnp.where(down_ok, logits[:, 0], -jnp.inf), jnp.zeros_like(z),
                      jnp.where(up_ok, logits[:, 1], -jnp.inf)], -1)
    return jax.nn.log_softmax(full, axis=-1)


def coordinate_gains(data: EnergyData, z, shift=0.0, const=0.0, penalty=1.0, power: int = 1):
    """Exact single-coordinate energy decreases ``E(z) - E(z + e_j)`` and ``E(z) - E(z - e_j)``,
    each (n,), in O(m n) (the first-order terms ``-g_j`` and ``g_j`` are their Taylor
    approximation; (E.1) has kinks at the row bounds, where the exact change is what matters)."""
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
    """(D.3) without the learned term: ``(logits (n,), direction (n,))``; ``logits`` is ``-inf``
    where no move is possible. ``gains``: optional exact ``(up, down)`` decreases from
    :func:`coordinate_gains` used instead of the first-order ``(-g, g)``."""
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
         feas_tol: float = 1e-6) -> LangevinState:
    """State at assignment ``z`` (n,) (rounded and clipped into the box)."""
    z = jnp.clip(jnp.round(z), data.lower, data.upper) * data.var_mask
    obj, pen = energy_terms(data, z, shift, const, power)
    best = jnp.where(pen <= feas_tol, obj, jnp.inf)
    return LangevinState(z, obj + penalty * pen, z, best)


def build_kernel(method: str = "rld", *, step_size: float = 1.0, window: int = 1,
                 num_flips: int = 4, power: int = 1, feas_tol: float = 1e-6,
                 bias_fn: Callable | None = None, exact_gains: bool = True,
                 proposal_fn: Callable | None = None):
    """The step ``kernel(key, state, data, shift, const, temperature, penalty, params)``.

    ``method``: "dlp" (D.1), "dmala" (D.1 + D.2), "rld" (D.3), "learned" (P.1) or "learned-mh"
    (P.1 + P.2). ``step_size`` is ``alpha`` of (D.1), ``window`` its ``W``, ``num_flips`` the
    ``k`` of (D.3). ``bias_fn(params, data, z, g, shift, penalty) -> (n,)`` adds learned logits
    ``b_i`` to (D.3) (``method="rld"`` only). ``exact_gains`` (rld): rank moves by the exact
    single-coordinate energy change (:func:`coordinate_gains`) instead of its first-order
    estimate. ``proposal_fn(params, data, z, g, shift, penalty) -> (n, 2)``: the learned
    proposal's network (required by, and only used by, the learned methods; the temperature
    enters only the test of "learned-mh").
    """
    if method not in METHODS:
        raise ValueError(f"method: expected one of {METHODS}, got {method!r}")
    if isinstance(step_size, (int, float)) and not step_size > 0:
        raise ValueError(f"step_size: expected > 0, got {step_size}")
    if window < 1 or num_flips < 1:
        raise ValueError(f"window, num_flips: expected >= 1, got {window}, {num_flips}")
    if bias_fn is not None and method != "rld":
        raise ValueError("bias_fn: a learned bias is used by method='rld' only")
    if (proposal_fn is not None) != (method in LEARNED_METHODS):
        raise ValueError(f"proposal_fn: required by the methods {LEARNED_METHODS} and used by "
                         f"no other, got method={method!r} with "
                         f"proposal_fn={'a callable' if proposal_fn is not None else None}")

    def kernel(key, state, data, shift, const, temperature, penalty, params=None):
        z = state.z
        e0, _, _, g = _terms_and_grad(data, z, shift, const, penalty, power)
        if method in LEARNED_METHODS:  # (P.1)
            k_prop, k_acc = jax.random.split(key)
            logp = move_log_probs(proposal_fn(params, data, z, g, shift, penalty), data, z)
            idx = jax.random.categorical(k_prop, logp, axis=-1)
            z_new = z + (idx - 1).astype(z.dtype)
            accept = jnp.asarray(1.0)
        elif method == "rld":
            gains = (coordinate_gains(data, z, shift, const, penalty, power) if exact_gains
                     else None)
            logits, direction = flip_logits(data, z, g, temperature, num_flips, gains)
            if bias_fn is not None:
                logits = logits + bias_fn(params, data, z, g, shift, penalty)
            move = jax.random.bernoulli(key, jax.nn.sigmoid(logits))
            z_new = z + jnp.where(move, direction, 0.0)
            accept = jnp.asarray(1.0)
        else:
            k_prop, k_acc = jax.random.split(key)
            logits = dlp_logits(data, z, g, temperature, step_size, window)
            idx = jax.random.categorical(k_prop, logits, axis=-1)
            z_new = z + (idx - window).astype(z.dtype)
            accept = jnp.asarray(1.0)
        e1, obj1, pen1, g1 = _terms_and_grad(data, z_new, shift, const, penalty, power)
        if method in ("dmala", "learned-mh"):  # (D.2), (P.2)
            if method == "dmala":
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
        new = LangevinState(z_new, e1, jnp.where(better, z_new, state.best_z),
                            jnp.where(better, obj1, state.best_objective))
        info = LangevinInfo(accept, jnp.sum(z_new != z), e1, pen1)
        return new, info

    return kernel


@functools.partial(jax.jit, static_argnames=("method", "window", "num_flips", "power", "bias_fn",
                                             "feas_tol", "exact_gains", "proposal_fn"))
def _run(key, data_shared, z0, shift, const, cost, temperatures, penalties, params,
         step_size, *,
         method, window, num_flips, power, bias_fn, feas_tol, exact_gains, proposal_fn):
    kernel = build_kernel(method, step_size=step_size, window=window, num_flips=num_flips,
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

    keys = jax.random.split(key, z0.shape[0])
    return jax.vmap(chain)(keys, z0, shift, const, cost)


def run_langevin(key, data: EnergyData, z0, *, temperatures, penalties, shift=None, const=None,
                 cost=None,
                 method: str = "rld", step_size: float = 1.0, window: int = 1,
                 num_flips: int = 4, power: int = 1, feas_tol: float = 1e-6,
                 bias_fn: Callable | None = None, bias_params=None, exact_gains: bool = True,
                 proposal_fn: Callable | None = None, proposal_params=None):
    """Run ``K`` chains from ``z0`` (K, n) for ``len(temperatures)`` steps in one ``jit``.

    ``shift`` (K, m) / ``const`` (K,) are the per-chain continuous-block terms of (E.1) (zeros by
    default); ``cost`` (K, n) per-chain integer costs replacing ``data.c`` ((E.2) of
    :mod:`energy`); ``temperatures``/``penalties`` (T,) the annealing schedule. Returns the final
    :class:`LangevinState` (leaves with a leading ``K`` axis) and the :class:`LangevinInfo` trace
    (leaves (K, T)). ``bias_fn`` must be a hashable callable that is the same object across calls
    (it is a static argument), ``bias_params`` its pytree of parameters.
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
    if method not in METHODS:
        raise ValueError(f"method: expected one of {METHODS}, got {method!r}")
    params = proposal_params if method in LEARNED_METHODS else bias_params
    return _run(key, data, z0, shift, const, cost, temperatures, penalties, params,
                jnp.asarray(step_size, data.c.dtype), method=method, window=int(window),
                num_flips=int(num_flips), power=int(power), bias_fn=bias_fn,
                feas_tol=float(feas_tol), exact_gains=bool(exact_gains),
                proposal_fn=proposal_fn)
