"""The MILP data type: validated host-side arrays in float64, and their host-side checks.

A problem is::

    minimise / maximise   c^T x + offset
    subject to            row_lower <= A x <= row_upper                                  (P.1)
                          lower <= x <= upper,   x_j integer for j with integrality[j]

``A`` is a ``scipy.sparse.csr_array`` of shape ``(m, n)``; bounds may be ``-inf``/``+inf``
(one-sided rows and free columns). ``sense`` is ``+1`` for minimisation and ``-1`` for
maximisation; every sampler works on the minimisation form ``sense * c`` and every reported
objective is in the problem's own sense.

:func:`make_milp` builds and validates a :class:`MILP` from arrays; :func:`check_solution` measures
a candidate ``x`` on the host in float64 (the certificate that ``solve`` reports).
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import numpy as np
import scipy.sparse as sp

__all__ = ["MILP", "SolutionCheck", "check_solution", "make_milp"]

FEAS_TOL = 1e-6  # row and bound tolerance of every feasibility certificate


@dataclasses.dataclass(frozen=True, eq=False)
class MILP:
    """A validated MILP (P.1). Build it with :func:`make_milp` or ``read_mps``.

    Attributes:
      c: ``(n,)`` objective coefficients.
      A: ``(m, n)`` the constraint matrix (CSR).
      row_lower: ``(m,)`` row lower bounds (may be ``-inf``).
      row_upper: ``(m,)`` row upper bounds (may be ``+inf``).
      lower: ``(n,)`` column lower bounds.
      upper: ``(n,)`` column upper bounds.
      integrality: ``(n,)`` bool, the integer columns.
      offset: the objective constant.
      sense: ``+1`` minimise, ``-1`` maximise.
      col_names: tuple of column names.
      row_names: tuple of row names.
      name: the problem's name.
    """

    c: np.ndarray
    A: sp.csr_array
    row_lower: np.ndarray
    row_upper: np.ndarray
    lower: np.ndarray
    upper: np.ndarray
    integrality: np.ndarray
    offset: float = 0.0
    sense: int = 1
    col_names: tuple = ()
    row_names: tuple = ()
    name: str = ""

    @property
    def num_vars(self) -> int:
        """The number of columns ``n``."""
        return int(self.c.shape[0])

    @property
    def num_rows(self) -> int:
        """The number of rows ``m``."""
        return int(self.A.shape[0])

    @property
    def integer_index(self) -> np.ndarray:
        """The indices of the integer columns."""
        return np.flatnonzero(self.integrality)

    @property
    def continuous_index(self) -> np.ndarray:
        """The indices of the continuous columns."""
        return np.flatnonzero(~self.integrality)

    def objective(self, x) -> float:
        """``c^T x + offset`` in the problem's own sense (float64).

        Args:
          x: ``(n,)`` a point.

        Returns:
          The objective value.
        """
        return float(np.dot(self.c, np.asarray(x, np.float64)) + self.offset)

    def __repr__(self) -> str:
        return (f"MILP(name={self.name!r}, vars={self.num_vars}, rows={self.num_rows}, "
                f"integers={int(self.integrality.sum())}, "
                f"sense={'min' if self.sense == 1 else 'max'})")


def _vector(name, value, n, fill=None):
    if value is None:
        return np.full(n, fill, np.float64)
    arr = np.asarray(value, dtype=np.float64)
    if arr.ndim == 0:
        arr = np.full(n, float(arr))
    if arr.shape != (n,):
        raise ValueError(f"{name}: expected shape ({n},), got {arr.shape}")
    if np.isnan(arr).any():
        raise ValueError(f"{name}: contains NaN")
    return arr


def make_milp(c, A, row_lower=None, row_upper=None, lower=0.0, upper=None, integrality=None, *,
              offset: float = 0.0, sense: int = 1, col_names=None, row_names=None,
              name: str = "") -> MILP:
    """Validate arrays and build a :class:`MILP` (P.1).

    Args:
      c: ``(n,)`` objective coefficients (finite, ``n > 0``).
      A: ``(m, n)`` dense or scipy sparse constraint matrix (finite).
      row_lower: ``(m,)`` row lower bounds, default ``-inf``.
      row_upper: ``(m,)`` row upper bounds, default ``+inf``.
      lower: ``(n,)`` column lower bounds, default 0 (scalars broadcast).
      upper: ``(n,)`` column upper bounds, default ``+inf`` (scalars broadcast).
      integrality: ``(n,)`` bool, default all continuous.
      offset: the objective constant (finite).
      sense: ``+1`` minimise, ``-1`` maximise.
      col_names: column names (default ``x0, x1, ...``).
      row_names: row names (default ``r0, r1, ...``).
      name: the problem's name.

    Returns:
      The :class:`MILP`.

    Raises:
      ValueError: naming the argument, on shape mismatches, non-finite costs or coefficients,
        NaN bounds, ``lower > upper``, ``row_lower > row_upper``, integer columns whose box holds
        no integer, or ``n == 0``.
    """
    c = np.asarray(c, dtype=np.float64)
    if c.ndim != 1:
        raise ValueError(f"c: expected a 1-D vector, got shape {c.shape}")
    n = c.shape[0]
    if n == 0:
        raise ValueError("c: the problem has no variables (empty problem)")
    if not np.isfinite(c).all():
        raise ValueError("c: objective coefficients must be finite")
    if sp.issparse(A):
        A = sp.csr_array(A, dtype=np.float64)
    else:
        A = np.asarray(A, dtype=np.float64)
        if A.ndim == 1 and A.size == 0:
            A = A.reshape(0, n)
        if A.ndim != 2:
            raise ValueError(f"A: expected a 2-D matrix, got shape {A.shape}")
        A = sp.csr_array(A)
    if A.shape[1] != n:
        raise ValueError(f"A: expected {n} columns (len(c)), got shape {A.shape}")
    A.sum_duplicates()
    A.eliminate_zeros()
    if not np.isfinite(A.data).all():
        raise ValueError("A: coefficients must be finite")
    m = A.shape[0]
    row_lower = _vector("row_lower", row_lower, m, -np.inf)
    row_upper = _vector("row_upper", row_upper, m, np.inf)
    lower = _vector("lower", lower, n, 0.0)
    upper = _vector("upper", upper, n, np.inf)
    if (bad := np.flatnonzero(row_lower > row_upper)).size:
        raise ValueError("row_lower > row_upper (infeasible row bounds) at rows "
                         f"{bad[:5].tolist()}")
    if (bad := np.flatnonzero(lower > upper)).size:
        raise ValueError("lower > upper (infeasible variable bounds) at columns "
                         f"{bad[:5].tolist()}")
    if np.isposinf(row_lower).any() or np.isneginf(row_upper).any():
        raise ValueError("row_lower/row_upper: a row bound of +inf below or -inf above is "
                         "infeasible")
    if np.isposinf(lower).any() or np.isneginf(upper).any():
        raise ValueError("lower/upper: a variable bound of +inf below or -inf above is infeasible")
    if integrality is None:
        integrality = np.zeros(n, bool)
    integrality = np.asarray(integrality)
    if integrality.shape != (n,):
        raise ValueError(f"integrality: expected shape ({n},), got {integrality.shape}")
    integrality = integrality.astype(bool)
    lo_i, up_i = np.ceil(lower[integrality] - 1e-9), np.floor(upper[integrality] + 1e-9)
    if (bad := np.flatnonzero(lo_i > up_i)).size:
        cols = np.flatnonzero(integrality)[bad]
        raise ValueError(f"lower/upper: integer columns {cols[:5].tolist()} have no integer "
                         "value inside their bounds")
    if sense not in (1, -1):
        raise ValueError(f"sense: expected +1 (minimise) or -1 (maximise), got {sense!r}")
    if not np.isfinite(offset):
        raise ValueError("offset: must be finite")
    col_names = tuple(col_names) if col_names is not None else tuple(f"x{j}" for j in range(n))
    row_names = tuple(row_names) if row_names is not None else tuple(f"r{i}" for i in range(m))
    if len(col_names) != n or len(row_names) != m:
        raise ValueError("col_names/row_names: lengths must match the columns/rows of A")
    return MILP(c=c, A=A, row_lower=row_lower, row_upper=row_upper, lower=lower, upper=upper,
                integrality=integrality, offset=float(offset), sense=int(sense),
                col_names=col_names, row_names=row_names, name=name)


class SolutionCheck(NamedTuple):
    """Host-side float64 measurement of a candidate ``x`` (the feasibility certificate).

    Attributes:
      feasible: rows and bounds within ``tol`` and integrality exactly 0.
      max_violation: the largest row or bound violation (0 if none).
      integrality_violation: the largest ``|x_j - round(x_j)|`` over integer columns.
      objective: ``c^T x + offset`` in the problem's sense.
    """

    feasible: bool
    max_violation: float
    integrality_violation: float
    objective: float


def check_solution(problem: MILP, x, tol: float = FEAS_TOL) -> SolutionCheck:
    """Measure ``x`` against every row, bound and integrality of ``problem`` in float64.

    Args:
      problem: the :class:`MILP`.
      x: ``(n,)`` the candidate.
      tol: the row and bound tolerance.

    Returns:
      A :class:`SolutionCheck` (not feasible, with infinite violations, for a non-finite ``x``).

    Raises:
      ValueError: ``x`` of the wrong shape.
    """
    x = np.asarray(x, dtype=np.float64)
    if x.shape != (problem.num_vars,):
        raise ValueError(f"x: expected shape ({problem.num_vars},), got {x.shape}")
    if not np.isfinite(x).all():
        return SolutionCheck(False, float("inf"), float("inf"), float("nan"))
    ax = problem.A @ x
    viol = 0.0
    if ax.size:
        viol = max(float(np.max(ax - problem.row_upper, initial=0.0)),
                   float(np.max(problem.row_lower - ax, initial=0.0)))
    viol = max(viol, float(np.max(x - problem.upper, initial=0.0)),
               float(np.max(problem.lower - x, initial=0.0)))
    xi = x[problem.integrality]
    int_viol = float(np.max(np.abs(xi - np.round(xi)), initial=0.0))
    return SolutionCheck(bool(viol <= tol and int_viol == 0.0), viol, int_viol,
                         problem.objective(x))
