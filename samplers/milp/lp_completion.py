"""Exact LP completion of the continuous variables for fixed integer assignments (HiGHS, host).

For an integer assignment ``z`` the completion solves::

    LP(z) = min_y  c_y^T y   s.t.  row_lower - A_z z <= A_y y <= row_upper - A_z z,
                                   lower_y <= y <= upper_y                               (L.1)

(minimisation form) and reports ``y*(z)`` or that ``z`` admits no feasible ``y``. With
``penalty=lam`` it solves the elastic form instead, with slacks ``s+, s- >= 0`` on every row
priced at ``lam * S * w_i`` (the weights of (E.1) in ``energy``)::

    min_y,s  c_y^T y + lam S sum_i w_i (s+_i + s-_i)
    s.t.     row_lower - A_z z <= A_y y + s-_i - s+_i <= row_upper - A_z z               (L.2)

whose value is ``S * min_y E_lam(z; y)`` (always feasible when the bounds on ``y`` are), used to
refresh the continuous block inside the sampler.

Batching: the assignments are de-duplicated first (parallel chains often agree), one HiGHS
model is built per call and only its row bounds change between solves, so HiGHS warm-starts
each LP from the previous basis. Problems without continuous columns need no LP: the rows are
checked directly. Every returned ``x`` is re-measured on the host in float64
(``problem.check_solution``); a completion HiGHS calls optimal but that misses a row by more
than ``1e-6`` is reported infeasible.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import scipy.sparse as sp

from jaxlib_ext.samplers.milp.highs import _status_name
from jaxlib_ext.samplers.milp.mps import _highspy
from jaxlib_ext.samplers.milp.problem import FEAS_TOL, MILP, check_solution

__all__ = ["Completion", "complete", "lp_value_cuts"]


class Completion(NamedTuple):
    """Batched completion of ``B`` assignments.

    Attributes:
      x: ``(B, n)`` full vectors (integer columns exactly ``z``).
      objective: ``(B,)`` in the problem's sense (exact mode: NaN where infeasible; elastic mode:
        ``c^T x`` of the elastic solution).
      value: ``(B,)`` the LP value in minimisation form including the integer block (elastic
        mode: with the slack cost).
      feasible: ``(B,)`` bool, the float64 certificate.
      status: list of ``B`` strings ("optimal", "infeasible", "unbounded", ...).
      value_grad: ``(B, n_int)`` a subgradient in ``z`` of the LP part of ``value``,
        ``-A_z^T pi`` with ``pi`` HiGHS' row duals (zeros without continuous columns or where the
        LP was not solved to optimality).
    """

    x: np.ndarray
    objective: np.ndarray
    value: np.ndarray
    feasible: np.ndarray
    status: list
    value_grad: np.ndarray


def _lp_model(problem: MILP, penalty):
    highspy = _highspy()
    ic = problem.continuous_index
    Ay = problem.A[:, ic].tocsc()
    cy = problem.sense * problem.c[ic]
    lo, up = problem.lower[ic], problem.upper[ic]
    m = problem.num_rows
    if penalty is not None:
        amax = np.max(np.abs(problem.A.toarray()), axis=1, initial=0.0)
        w = np.where(amax > 0, 1.0 / np.where(amax > 0, amax, 1.0), 1.0)
        s = float(np.max(np.abs(problem.c), initial=0.0)) or 1.0
        eye = sp.identity(m, format="csc")
        Ay = sp.hstack([Ay, -eye, eye], format="csc")
        price = penalty * s * w
        cy = np.concatenate([cy, price, price])
        lo = np.concatenate([lo, np.zeros(2 * m)])
        up = np.concatenate([up, np.full(2 * m, np.inf)])
    h = highspy.Highs()
    h.setOptionValue("output_flag", False)
    h.setOptionValue("threads", 1)
    inf = h.getInfinity()
    lp = highspy.HighsLp()
    lp.num_col_, lp.num_row_ = Ay.shape[1], m
    lp.col_cost_ = cy
    lp.col_lower_ = np.where(np.isneginf(lo), -inf, lo)
    lp.col_upper_ = np.where(np.isposinf(up), inf, up)
    lp.row_lower_ = np.full(m, -inf)
    lp.row_upper_ = np.full(m, inf)
    lp.a_matrix_.format_ = highspy.MatrixFormat.kColwise
    lp.a_matrix_.start_, lp.a_matrix_.index_, lp.a_matrix_.value_ = Ay.indptr, Ay.indices, Ay.data
    lp.a_matrix_.num_col_, lp.a_matrix_.num_row_ = Ay.shape[1], m
    h.passModel(lp)
    return h, inf, ic.size


def complete(problem: MILP, Z, *, penalty: float | None = None) -> Completion:
    """Complete every row of ``Z`` with the exact LP (L.1), or the elastic LP (L.2) when
    ``penalty`` is given.

    Args:
      problem: the :class:`~jaxlib_ext.samplers.milp.problem.MILP`.
      Z: ``(B, n_int)`` integer values in ``problem.integer_index`` order (rounded).
      penalty: ``lam > 0`` of (L.2), or None for the exact LP (L.1).

    Returns:
      A :class:`Completion`; every ``x`` re-measured in float64.

    Raises:
      ValueError: ``Z`` of the wrong shape or a non-positive ``penalty``.
    """
    iz, ic = problem.integer_index, problem.continuous_index
    Z = np.asarray(Z, np.float64)
    if Z.ndim != 2 or Z.shape[1] != iz.size:
        raise ValueError(f"Z: expected shape (B, {iz.size}), got {Z.shape}")
    if penalty is not None and not penalty > 0:
        raise ValueError(f"penalty: expected > 0, got {penalty}")
    Z = np.round(Z)
    uniq, inverse = np.unique(Z, axis=0, return_inverse=True)
    inverse = inverse.reshape(-1)
    U = uniq.shape[0]
    n = problem.num_vars
    X = np.zeros((U, n))
    X[:, iz] = uniq
    value = np.full(U, np.nan)
    vgrad = np.zeros((U, iz.size))
    status = ["optimal"] * U
    cmin = problem.sense * problem.c
    if ic.size:
        h, inf, nc = _lp_model(problem, penalty)
        Az = problem.A[:, iz]
        m = problem.num_rows
        rows = np.arange(m, dtype=np.int32)
        for u in range(U):
            r = Az @ uniq[u]
            lo = np.where(np.isneginf(problem.row_lower), -inf, problem.row_lower - r)
            hi = np.where(np.isposinf(problem.row_upper), inf, problem.row_upper - r)
            h.changeRowsBounds(m, rows, lo, hi)
            h.run()
            st = _status_name(h)
            status[u] = st
            if st == "optimal":
                sol = h.getSolution()
                X[u, ic] = np.asarray(sol.col_value)[:nc]
                value[u] = h.getInfo().objective_function_value + cmin[iz] @ uniq[u]
                # dv/d(row bound) = pi and the bounds move by -A_z dz: grad = -A_z^T pi
                vgrad[u] = -(Az.T @ np.asarray(sol.row_dual))
            elif st == "unbounded_or_infeasible":  # decide with a feasibility-only solve
                h.changeColsCost(h.getNumCol(), np.arange(h.getNumCol(), dtype=np.int32),
                                 np.zeros(h.getNumCol()))
                h.run()
                status[u] = "unbounded" if _status_name(h) == "optimal" else "infeasible"
                h, inf, nc = _lp_model(problem, penalty)
    feasible = np.zeros(U, bool)
    objective = np.full(U, np.nan)
    for u in range(U):
        if status[u] != "optimal":
            continue
        chk = check_solution(problem, X[u], FEAS_TOL)
        objective[u] = chk.objective
        if ic.size == 0:
            value[u] = cmin @ X[u]
        feasible[u] = chk.feasible
        if penalty is None and not chk.feasible:
            status[u] = "infeasible"
            objective[u] = np.nan
    return Completion(X[inverse], objective[inverse], value[inverse], feasible[inverse],
                      [status[i] for i in inverse], vgrad[inverse])


def lp_value_cuts(problem: MILP, Z, *, penalty: float) -> tuple[np.ndarray, np.ndarray]:
    """The cuts of (E.2) of :mod:`~jaxlib_ext.samplers.milp.energy` at the assignments ``Z``, for
    ``energy.with_cuts``.

    Args:
      problem: the :class:`~jaxlib_ext.samplers.milp.problem.MILP`.
      Z: ``(B, n_int)`` integer assignments.
      penalty: ``lam > 0`` of the elastic LP (L.2).

    Returns:
      ``(cut_h, cut_a)`` of shapes ``(B, n_int)`` and ``(B,)``: the subgradients ``h_k`` of the
      continuous part of the elastic LP value (L.2) and the intercepts ``a_k = value_k - c_z^T
      z_k - h_k^T z_k`` (minimisation form); ``cut_a = -inf`` where that LP has no finite value.
    """
    Z = np.round(np.asarray(Z, np.float64))
    comp = complete(problem, Z, penalty=penalty)
    cz = problem.sense * problem.c[problem.integer_index]
    h = np.where(np.isfinite(comp.value)[:, None], comp.value_grad, 0.0)
    a = np.where(np.isfinite(comp.value),
                 comp.value - Z @ cz - np.einsum("bn,bn->b", h, Z), -np.inf)
    return h, a
