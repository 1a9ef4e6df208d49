"""The energy on the integer block: objective plus constraint-violation penalty, jit-able.

With ``x = (z, y)`` split into integer ``z`` and continuous ``y`` columns and the problem in
minimisation form (``c <- sense * c``), the energy of an integer assignment is::

    E_lam(z; y) = (c_z^T z + c_y^T y) / S + lam * sum_i w_i psi(v_i(A_z z + A_y y))       (E.1)
    v_i(r) = max(0, r - row_upper_i) + max(0, row_lower_i - r)

with ``S`` the objective scale (``max |c|``), ``w_i = 1 / max_j |A_ij|`` the row scale and
``psi(t) = t`` (``power=1``) or ``t^2`` (``power=2``). The unsupervised Langevin MILP paper
(ICML 2026, UNLS4MILP) says only that its energy "unifies objective and constraint
satisfaction"; (E.1) is our choice: the penalty energy of regularised Langevin dynamics (Feng and
Yang, ICML 2025) extended with the continuous block. The continuous part enters through the
per-chain ``shift = A_y y`` and ``const = c_y^T y`` of a completion ``y``: with ``psi(t) = t``
and ``y`` the elastic LP completion (``lp_completion.complete(..., penalty=lam)``),
``min_y E_lam(z; y)`` is exactly that LP's value divided by ``S``, so (E.1) at the LP's ``y`` is
"the objective plus penalty with the LP value where continuous variables exist", and its
gradient in ``z`` at fixed ``y`` is a valid subgradient of the LP value function (Danskin).

Inside the sampler (``solve``) the rows that hold continuous columns are handed to the LP
instead (``energy_data(..., lp_rows=True)`` frees them in (E.1)), and the LP value enters
through a pool of cuts. The elastic LP value ``v(z)`` of (L.2) (``lp_completion``) is convex in
``z`` (the value of an LP as a function of its right-hand side), and every completed ``z_k`` gives
a cut ``v(z) >= v(z_k) + h_k^T (z - z_k)`` with ``h_k = -A_z^T pi_k`` from the LP duals
``pi_k``. The energy uses the cut model, exact at every completed point and a lower bound
elsewhere (Benders' master problem, with the sampler as the heuristic master solver)::

    E(z) = (c_z^T z + max_k (a_k + h_k^T z)) / S + lam * sum_{i integer-only} w_i psi(v_i)  (E.2)

``a_k = v(z_k) - h_k^T z_k``. The cuts live in ``EnergyData.cut_h`` (C, n) / ``cut_a`` (C,)
(unused slots have ``cut_a = -inf``; ``C = 0`` means no continuous part). This is our choice:
the paper says the continuous variables are solved by an exact LP solver, but not how the LP
value reaches the sampler.

``z`` is treated as real-valued for the gradient (the relaxation), which is what the discrete
Langevin proposal of Zhang et al. (arXiv 2206.09914, eq. 3) needs.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxlib_ext.samplers.milp.problem import MILP

__all__ = ["EnergyData", "continuous_shift", "cut_value", "energy", "energy_data",
           "energy_terms", "pad_energy_data", "violation", "with_cuts"]


class EnergyData(NamedTuple):
    """Arrays of (E.1) for one problem (a pytree; float32 on device).

    Attributes:
      c: ``(n,)`` integer-block costs (minimisation form).
      A: ``(m, n)`` the dense integer block.
      row_lower: ``(m,)`` row lower bounds (may be infinite).
      row_upper: ``(m,)`` row upper bounds (may be infinite).
      row_weight: ``(m,)`` the row weights ``w_i``.
      obj_scale: ``()`` the objective scale ``S``.
      lower: ``(n,)`` finite integer lower bounds.
      upper: ``(n,)`` finite integer upper bounds.
      var_mask: ``(n,)`` 1 for real columns, 0 for padding (padded columns are fixed at 0).
      cut_h: ``(C, n)`` the subgradients of the LP-value cuts of (E.2) (``C = 0`` by default).
      cut_a: ``(C,)`` their intercepts.
    """

    c: jax.Array
    A: jax.Array
    row_lower: jax.Array
    row_upper: jax.Array
    row_weight: jax.Array
    obj_scale: jax.Array
    lower: jax.Array
    upper: jax.Array
    var_mask: jax.Array
    cut_h: jax.Array
    cut_a: jax.Array


def energy_data(problem: MILP, *, normalize: bool = True, lp_rows: bool = False,
                dtype=jnp.float32) -> EnergyData:
    """Build :class:`EnergyData` of ``problem``'s integer block (host, once per problem).

    Args:
      problem: the :class:`~jaxlib_ext.samplers.milp.problem.MILP`.
      normalize: scale the objective by ``S = max |c|`` and each row by ``w_i = 1 / max_j
        |A_ij|``; ``False`` sets ``S = 1`` and ``w_i = 1`` (then (E.1) at a feasible point is
        exactly ``c^T x`` in minimisation form).
      lp_rows: free the rows that hold continuous columns (infinite bounds), as in (E.2).
      dtype: the arrays' dtype.

    Returns:
      The :class:`EnergyData` of the integer columns, without cuts.

    Raises:
      ValueError: the problem has no integer columns, or an integer column has an infinite bound
        (the sampler moves inside a finite box).
    """
    iz = problem.integer_index
    if iz.size == 0:
        raise ValueError("problem: no integer columns; solve it as an LP (solve() does this)")
    lo, up = np.ceil(problem.lower[iz] - 1e-9), np.floor(problem.upper[iz] + 1e-9)
    if not (np.isfinite(lo).all() and np.isfinite(up).all()):
        raise ValueError("problem: the sampler needs finite bounds on every integer column")
    cmin = problem.sense * problem.c
    A = problem.A.toarray()
    if normalize:
        s = float(np.max(np.abs(cmin), initial=0.0)) or 1.0
        amax = np.max(np.abs(A), axis=1, initial=0.0)
        w = np.where(amax > 0, 1.0 / np.where(amax > 0, amax, 1.0), 1.0)
    else:
        s, w = 1.0, np.ones(problem.num_rows)
    row_lower, row_upper = problem.row_lower, problem.row_upper
    if lp_rows:
        mixed = np.abs(A[:, problem.continuous_index]).sum(1) > 0
        row_lower = np.where(mixed, -np.inf, row_lower)
        row_upper = np.where(mixed, np.inf, row_upper)
    f = lambda a: jnp.asarray(a, dtype)  # noqa: E731
    return EnergyData(f(cmin[iz]), f(A[:, iz]), f(row_lower), f(row_upper), f(w),
                      f(s), f(lo), f(up), f(np.ones(iz.size)), f(np.zeros((0, iz.size))),
                      f(np.zeros(0)))


def with_cuts(data: EnergyData, cut_h, cut_a) -> EnergyData:
    """``data`` with the cut pool of (E.2).

    Args:
      data: the :class:`EnergyData`.
      cut_h: ``(C, n_int)`` subgradients (padded to ``data``'s column count).
      cut_a: ``(C,)`` intercepts (raw objective units, minimisation form; ``-inf`` marks an
        empty slot).

    Returns:
      ``data`` with ``cut_h`` and ``cut_a`` replaced.

    Raises:
      ValueError: the shapes do not match ``(C, <= n)`` and ``(C,)``.
    """
    cut_h = jnp.asarray(cut_h, data.c.dtype)
    cut_a = jnp.asarray(cut_a, data.c.dtype)
    n = data.c.shape[0]
    if cut_h.ndim != 2 or cut_h.shape[1] > n or cut_a.shape != cut_h.shape[:1]:
        raise ValueError(f"cut_h, cut_a: expected shapes (C, <= {n}) and (C,), got "
                         f"{cut_h.shape} and {cut_a.shape}")
    cut_h = jnp.pad(cut_h, ((0, 0), (0, n - cut_h.shape[1])))
    return data._replace(cut_h=cut_h, cut_a=cut_a)


def cut_value(data: EnergyData, z):
    """The cut model ``max_k (a_k + h_k^T z)`` of (E.2).

    Args:
      data: the :class:`EnergyData`.
      z: ``(n,)`` an assignment.

    Returns:
      The scalar cut value (0 without cuts).
    """
    if data.cut_a.shape[0] == 0:
        return jnp.zeros((), data.c.dtype)
    return jnp.max(data.cut_a + data.cut_h @ z)


def continuous_shift(problem: MILP, y) -> tuple[np.ndarray, np.ndarray]:
    """The continuous block's terms of (E.1) for continuous values ``y``.

    Args:
      problem: the :class:`~jaxlib_ext.samplers.milp.problem.MILP`.
      y: ``(..., n_cont)`` values of the continuous columns.

    Returns:
      ``(shift, const) = (A_y y, c_y^T y)`` (minimisation form), of shapes ``(..., m)`` and
      ``(...)``; zeros when the problem has no continuous columns.
    """
    ic = problem.continuous_index
    y = np.asarray(y, np.float64)
    if ic.size == 0:
        return np.zeros(y.shape[:-1] + (problem.num_rows,)), np.zeros(y.shape[:-1])
    Ay = problem.A[:, ic]
    shift = (Ay @ y.reshape(-1, ic.size).T).T.reshape(y.shape[:-1] + (problem.num_rows,))
    return shift, y @ (problem.sense * problem.c[ic])


def pad_energy_data(data: EnergyData, n: int, m: int) -> EnergyData:
    """Pad ``data`` to ``n`` columns and ``m`` rows, leaving (E.1) unchanged.

    Padded rows are free (infinite bounds, zero coefficients), padded columns are fixed at 0
    (``var_mask`` 0). NumPy arrays stay NumPy arrays (padding on the host, no device program).

    Args:
      data: the :class:`EnergyData`.
      n: the padded column count, ``>=`` the current one.
      m: the padded row count, ``>=`` the current one.

    Returns:
      The padded :class:`EnergyData`.

    Raises:
      ValueError: ``n`` or ``m`` is below the current size.
    """
    n0, m0 = data.c.shape[0], data.A.shape[0]
    if n < n0 or m < m0:
        raise ValueError(f"n, m: cannot pad ({n0}, {m0}) down to ({n}, {m})")
    xp = np if isinstance(data.c, np.ndarray) else jnp
    pn, pm = n - n0, m - m0
    return EnergyData(
        xp.pad(data.c, (0, pn)), xp.pad(data.A, ((0, pm), (0, pn))),
        xp.pad(data.row_lower, (0, pm), constant_values=-np.inf),
        xp.pad(data.row_upper, (0, pm), constant_values=np.inf),
        xp.pad(data.row_weight, (0, pm), constant_values=1.0), data.obj_scale,
        xp.pad(data.lower, (0, pn)), xp.pad(data.upper, (0, pn)), xp.pad(data.var_mask, (0, pn)),
        xp.pad(data.cut_h, ((0, 0), (0, pn))), data.cut_a)


def violation(data: EnergyData, z, shift=0.0):
    """The per-row violation ``v_i`` of (E.1) at ``r = A_z z + shift``.

    Args:
      data: the :class:`EnergyData`.
      z: ``(n,)`` an assignment.
      shift: ``(m,)`` (or scalar) the continuous block's row shift.

    Returns:
      ``(m,)`` the violations (distance of ``r_i`` to ``[row_lower_i, row_upper_i]``).
    """
    r = data.A @ z + shift
    return jnp.maximum(r - data.row_upper, 0.0) + jnp.maximum(data.row_lower - r, 0.0)


def energy_terms(data: EnergyData, z, shift=0.0, const=0.0, power: int = 1):
    """The two terms of (E.1), with the cut model of (E.2) in the objective when ``data`` holds
    cuts.

    Args:
      data: the :class:`EnergyData`.
      z: ``(n,)`` an assignment.
      shift: ``(m,)`` (or scalar) the continuous block's row shift.
      const: the continuous block's constant objective.
      power: 1 (absolute, ``psi(v) = v``) or 2 (squared, ``psi(v) = v^2``) violations.

    Returns:
      ``(objective / S, sum_i w_i psi(v_i))``.
    """
    obj = (jnp.dot(data.c, z) + const + cut_value(data, z)) / data.obj_scale
    v = data.row_weight * violation(data, z, shift)
    return obj, jnp.sum(v if power == 1 else v * v)


def energy(data: EnergyData, z, shift=0.0, const=0.0, penalty=1.0, power: int = 1):
    """The penalty energy (E.1) for one assignment; differentiable in ``z`` on the relaxation.

    Args:
      data: the :class:`EnergyData`.
      z: ``(n,)`` an assignment.
      shift: ``(m,)`` (or scalar) the continuous block's row shift.
      const: the continuous block's constant objective.
      penalty: ``lam`` of (E.1).
      power: 1 (absolute) or 2 (squared) violations.

    Returns:
      The scalar ``objective / S + lam sum_i w_i psi(v_i)``.
    """
    obj, pen = energy_terms(data, z, shift, const, power)
    return obj + penalty * pen
