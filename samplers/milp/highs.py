"""HiGHS on the host: a :class:`MILP` as a HiGHS model, the LP relaxation, and the exact baseline.

:func:`highs_model` passes a problem (or its LP relaxation) to a fresh ``highspy.Highs``;
:func:`solve_highs` runs HiGHS' branch-and-cut under a time limit and records its incumbent trace
(objective vs seconds, through the improving-solution callback), the yardstick of the benchmark.
"""

from __future__ import annotations

import time
from typing import NamedTuple

import numpy as np

from jaxlib_ext.samplers.milp.mps import _highspy
from jaxlib_ext.samplers.milp.problem import MILP

__all__ = ["HighsResult", "highs_model", "solve_highs"]


def _finite(v, inf):
    v = np.asarray(v, np.float64).copy()
    v[np.isposinf(v)] = inf
    v[np.isneginf(v)] = -inf
    return v


def highs_model(problem: MILP, *, relax: bool = False, time_limit: float | None = None,
                threads: int = 1):
    """A quiet ``highspy.Highs`` holding ``problem``, in its own sense.

    Args:
      problem: the :class:`~jaxlib_ext.samplers.milp.problem.MILP`.
      relax: drop integrality (the LP relaxation).
      time_limit: HiGHS' time limit in seconds, or None.
      threads: HiGHS' thread count.

    Returns:
      The ``highspy.Highs`` instance with the model passed, not yet run.
    """
    highspy = _highspy()
    h = highspy.Highs()
    h.setOptionValue("output_flag", False)
    h.setOptionValue("threads", int(threads))
    if time_limit is not None:
        h.setOptionValue("time_limit", float(max(time_limit, 1e-3)))
    inf = h.getInfinity()
    lp = highspy.HighsLp()
    lp.num_col_, lp.num_row_ = problem.num_vars, problem.num_rows
    lp.col_cost_ = problem.c
    lp.col_lower_, lp.col_upper_ = _finite(problem.lower, inf), _finite(problem.upper, inf)
    lp.row_lower_ = _finite(problem.row_lower, inf)
    lp.row_upper_ = _finite(problem.row_upper, inf)
    lp.offset_ = problem.offset
    lp.sense_ = highspy.ObjSense.kMaximize if problem.sense == -1 else highspy.ObjSense.kMinimize
    A = problem.A.tocsc()
    lp.a_matrix_.format_ = highspy.MatrixFormat.kColwise
    lp.a_matrix_.start_, lp.a_matrix_.index_, lp.a_matrix_.value_ = A.indptr, A.indices, A.data
    lp.a_matrix_.num_col_, lp.a_matrix_.num_row_ = problem.num_vars, problem.num_rows
    if not relax and problem.integrality.any():
        lp.integrality_ = [highspy.HighsVarType.kInteger if b else highspy.HighsVarType.kContinuous
                           for b in problem.integrality]
    h.passModel(lp)
    return h


class HighsResult(NamedTuple):
    """HiGHS' answer.

    Attributes:
      status: "optimal", "time_limit", "infeasible", "unbounded", "unbounded_or_infeasible" or
        HiGHS' own status text.
      x: the solution over all columns, or None.
      objective: in the problem's sense (NaN without a solution).
      bound: the dual bound.
      seconds: HiGHS' wall time.
      trace: list of ``(seconds, objective)`` incumbents.
    """

    status: str
    x: np.ndarray | None
    objective: float
    bound: float
    seconds: float
    trace: list


def _status_name(h) -> str:
    highspy = _highspy()
    s = h.getModelStatus()
    names = {highspy.HighsModelStatus.kOptimal: "optimal",
             highspy.HighsModelStatus.kInfeasible: "infeasible",
             highspy.HighsModelStatus.kUnbounded: "unbounded",
             highspy.HighsModelStatus.kUnboundedOrInfeasible: "unbounded_or_infeasible",
             highspy.HighsModelStatus.kTimeLimit: "time_limit"}
    return names.get(s, h.modelStatusToString(s))


def solve_highs(problem: MILP, *, time_limit: float = 60.0, relax: bool = False,
                threads: int = 1, fix: dict | None = None) -> HighsResult:
    """Solve ``problem`` (or its LP relaxation) with HiGHS under ``time_limit`` seconds.

    Args:
      problem: the :class:`~jaxlib_ext.samplers.milp.problem.MILP`.
      time_limit: seconds.
      relax: solve the LP relaxation.
      threads: HiGHS' thread count.
      fix: column index -> value to fix (bounds set to the value) before solving, the "fix and
        complete" step of Neural Diving.

    Returns:
      A :class:`HighsResult` with the incumbent trace (through HiGHS' improving-solution
      callback); integer columns of ``x`` rounded.

    References:
      Nair et al., Solving Mixed Integer Programs Using Neural Networks, arXiv 2012.13349, sec. 4
      (``fix``).
    """
    h = highs_model(problem, relax=relax, time_limit=time_limit, threads=threads)
    if fix:
        idx = np.fromiter(fix.keys(), np.int32)
        val = np.fromiter(fix.values(), np.float64)
        h.changeColsBounds(len(idx), idx, val, val)
    trace = []
    t0 = time.perf_counter()
    if not relax and problem.integrality.any():
        def on_improve(e):
            trace.append((time.perf_counter() - t0, float(e.data_out.objective_function_value)))
        h.cbMipImprovingSolution.subscribe(on_improve)
    h.run()
    seconds = time.perf_counter() - t0
    status = _status_name(h)
    info = h.getInfo()
    x = None
    obj = float("nan")
    if info.primal_solution_status == 2:  # kSolutionStatusFeasible
        x = np.asarray(h.getSolution().col_value, np.float64)
        if problem.integrality.any() and not relax:
            x[problem.integrality] = np.round(x[problem.integrality])
        obj = problem.objective(x)
    bound = float(info.mip_dual_bound) if not relax and problem.integrality.any() else obj
    return HighsResult(status, x, obj, bound, seconds, trace)
