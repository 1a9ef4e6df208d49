"""The supervised baseline: Neural Diving's predict, fix and complete (Nair et al., arXiv
2012.13349, sec. 4), with the network of :mod:`gnn` trained by ``training.train_supervised``.

The network's logits at the all-lower-bound state are read as ``logit P(z_j = upper)``; the
``coverage`` fraction of integer columns with the most confident predictions is fixed to the
rounded prediction and HiGHS solves the remaining sub-MILP within the time left. Where the fixed
sub-MILP is infeasible or gives no solution in time, the coverage halves and the dive repeats
(Neural Diving's SelectiveNet coverage threshold is replaced by this fixed back-off; our choice).
"""

from __future__ import annotations

import functools
import time

import jax
import numpy as np
from flax import nnx

from jaxlib_ext.samplers.milp.energy import energy_data, pad_energy_data
from jaxlib_ext.samplers.milp.gnn import BipartiteGNN
from jaxlib_ext.samplers.milp.highs import solve_highs
from jaxlib_ext.samplers.milp.langevin import _terms_and_grad
from jaxlib_ext.samplers.milp.problem import MILP
from jaxlib_ext.samplers.milp.solve import MILPResult, _no_solution, certified_result

__all__ = ["neural_diving", "predict_assignment"]


@functools.partial(jax.jit, static_argnums=0)
def _predict(graphdef, params, data):
    _, _, _, g = _terms_and_grad(data, data.lower, 0.0, 0.0, 1.0, 1)
    return jax.nn.sigmoid(nnx.merge(graphdef, params)(data, data.lower, g, 0.0, 1.0))


def predict_assignment(problem: MILP, model: BipartiteGNN, *,
                       pad_to: tuple[int, int] | None = None):
    """The network's prediction of the integer columns at the all-lower-bound state.

    Args:
      problem: the :class:`~jaxlib_ext.samplers.milp.problem.MILP`.
      model: a trained :class:`~jaxlib_ext.samplers.milp.gnn.BipartiteGNN` (``train_supervised``).
      pad_to: ``(n_int, m)``: pad the arrays to at least this size (one compiled program per
        family).

    Returns:
      ``(z_hat, confidence)`` over the integer columns: the rounded prediction in the box and
      ``|p - 1/2|``.

    References:
      Nair et al., Solving Mixed Integer Programs Using Neural Networks, arXiv 2012.13349, sec. 4.
    """
    data = energy_data(problem)
    n0, m0 = data.c.shape[0], data.A.shape[0]
    pn, pm = pad_to if pad_to is not None else (0, 0)
    data = pad_energy_data(data, -(-max(n0, pn) // 8) * 8, -(-max(m0, pm) // 16) * 16)
    graphdef, params = nnx.split(model)
    p = np.asarray(_predict(graphdef, params, data), np.float64)[:n0]
    lo = np.asarray(data.lower, np.float64)[:n0]
    up = np.asarray(data.upper, np.float64)[:n0]
    return np.round(lo + p * (up - lo)), np.abs(p - 0.5)


def neural_diving(problem: MILP, model: BipartiteGNN, *, time_limit: float = 60.0,
                  coverage: float = 0.7, min_coverage: float = 0.05,
                  pad_to: tuple[int, int] | None = None) -> MILPResult:
    """Predict, fix the ``coverage`` most confident integer columns, complete with HiGHS; halve the
    coverage and repeat where the fixed sub-MILP gives no solution.

    Args:
      problem: the :class:`~jaxlib_ext.samplers.milp.problem.MILP`, with integer columns.
      model: a trained :class:`~jaxlib_ext.samplers.milp.gnn.BipartiteGNN`.
      time_limit: seconds for the whole dive.
      coverage: the fraction of integer columns fixed first, in ``[0, 1]``.
      min_coverage: below this the next try fixes nothing.
      pad_to: as :func:`predict_assignment`.

    Returns:
      A certified :class:`~jaxlib_ext.samplers.milp.solve.MILPResult` with ``rule =
      "neural-diving"``.

    Raises:
      ValueError: ``coverage`` out of range or a problem without integer columns.

    References:
      Nair et al., arXiv 2012.13349, sec. 4.
    """
    t0 = time.perf_counter()
    if not 0 <= coverage <= 1:
        raise ValueError(f"coverage: expected in [0, 1], got {coverage}")
    if not problem.integrality.any():
        raise ValueError("problem: no integer columns to dive on")
    iz = problem.integer_index
    z_hat, conf = predict_assignment(problem, model, pad_to=pad_to)
    order = np.argsort(-conf, kind="stable")
    trace = []
    cov = coverage
    while True:
        left = time_limit - (time.perf_counter() - t0)
        if left <= 0:
            break
        k = int(round(cov * iz.size))
        fix = {int(iz[j]): float(z_hat[j]) for j in order[:k]}
        r = solve_highs(problem, time_limit=left, fix=fix)
        if r.x is not None:
            trace.append((time.perf_counter() - t0, r.objective))
            return certified_result(problem, r.x, trace, t0, "neural-diving",
                                    message=f"fixed {k} of {iz.size} integer columns")
        if k == 0 or r.status == "time_limit":
            break
        cov = cov / 2 if cov / 2 >= min_coverage else 0.0
    return _no_solution(problem, "no_solution_found", "the dive found no feasible completion in "
                        "time", trace, t0, "neural-diving")
