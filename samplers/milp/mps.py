"""Reading MPS and LP files into a :class:`MILP` through HiGHS (``highspy``, the ``milp`` extra).

The column order, names, objective sense and offset are the file's own. HiGHS' reader is lenient
(it skips lines it does not understand), so a file that yields no columns is reported as an empty
or malformed problem instead of being returned.
"""

from __future__ import annotations

import os

import numpy as np
import scipy.sparse as sp

from jaxlib_ext.samplers.milp.problem import MILP, make_milp

__all__ = ["read_mps"]


def _highspy():
    try:
        import highspy
    except ImportError as e:  # pragma: no cover - the milp extra is part of the test environment
        raise ImportError("jaxlib_ext.samplers.milp needs highspy: pip install 'jaxlib-ext[milp]'"
                          ) from e
    return highspy


def read_mps(path) -> MILP:
    """Read an MPS (free or fixed) or CPLEX LP file into a validated :class:`MILP`.

    Args:
      path: the file (a path or a string).

    Returns:
      The :class:`~jaxlib_ext.samplers.milp.problem.MILP`, with the file's column order, names,
      objective sense and offset.

    Raises:
      FileNotFoundError: the file is missing.
      ValueError: HiGHS cannot parse the file, it holds no columns, or its data fails
        :func:`~jaxlib_ext.samplers.milp.problem.make_milp`'s validation.
    """
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"path: no such file {path!r}")
    highspy = _highspy()
    h = highspy.Highs()
    h.setOptionValue("output_flag", False)
    status = h.readModel(path)
    if status == highspy.HighsStatus.kError:
        raise ValueError(f"path: HiGHS could not parse {path!r} as an MPS/LP file (malformed)")
    lp = h.getLp()
    n, m = int(lp.num_col_), int(lp.num_row_)
    if n == 0:
        raise ValueError(f"path: {path!r} holds no columns (empty or malformed MPS/LP file)")
    a = lp.a_matrix_
    start, index, value = (np.asarray(a.start_), np.asarray(a.index_, np.int64),
                           np.asarray(a.value_, np.float64))
    if a.format_ == highspy.MatrixFormat.kColwise:
        A = sp.csc_array((value, index, start), shape=(m, n))
    else:
        A = sp.csr_array((value, index, start), shape=(m, n))
    integrality = np.zeros(n, bool)
    if len(lp.integrality_):
        integrality = np.array([v == highspy.HighsVarType.kInteger for v in lp.integrality_])
    inf = h.getInfinity()

    def unbound(v):
        v = np.asarray(v, np.float64).copy()
        v[v >= inf] = np.inf
        v[v <= -inf] = -np.inf
        return v

    sense = -1 if lp.sense_ == highspy.ObjSense.kMaximize else 1
    name = lp.model_name_ or os.path.splitext(os.path.basename(path))[0]
    return make_milp(
        np.asarray(lp.col_cost_, np.float64), A, unbound(lp.row_lower_), unbound(lp.row_upper_),
        unbound(lp.col_lower_), unbound(lp.col_upper_), integrality, offset=float(lp.offset_),
        sense=sense, col_names=list(lp.col_names_) or None, row_names=list(lp.row_names_) or None,
        name=name)
