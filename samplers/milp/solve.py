"""``solve``: Langevin sampling over the integer block with exact LP completion, certified.

The procedure (the abstract of the unsupervised Langevin MILP paper, ICML 2026, UNLS4MILP:
"learn only the integer variables; solve the continuous ones with an exact LP solver"; details
reconstructed, our choices marked):

1. No integer columns: the problem is an LP and goes to HiGHS directly.
2. The LP relaxation is solved once (HiGHS): an infeasible relaxation proves the MILP infeasible;
   an unbounded one (with the integer columns boxed) means the MILP is unbounded or infeasible,
   with no finite optimum either way. Both are returned as ``feasible=False`` with the reason in
   ``status``/``message``.
3. Rounds until ``time_limit``: ``num_chains`` chains run ``steps_per_round`` steps of the
   annealed sampler of :mod:`langevin` (``method``; with ``model`` the learned flip logits of
   :mod:`gnn` are added). For problems with continuous columns the energy is (E.2) of
   :mod:`energy`: the elastic LP value (L.2) of :mod:`lp_completion` enters as a pool of
   ``num_cuts`` cuts, one per distinct completed assignment, grown every round (our choice,
   since the LP cannot run inside ``jit``).
4. After each round the chains' best row-feasible states (and, with continuous columns, their
   final states, whose elastic LP is feasible) go to the host, are de-duplicated and completed
   by the exact LP (L.1); every completed ``x`` is measured in
   float64 (all rows and bounds to ``1e-6``, integer columns exactly integral) and only then may
   become the incumbent. A quarter of the chains restart from the incumbent (our choice).

A returned ``x`` is therefore feasible to ``1e-6`` with integral integer columns, or
``feasible`` is False and ``x`` is all-NaN.
"""

from __future__ import annotations

import dataclasses
import time

import jax
import numpy as np
from flax import nnx
from tqdm.auto import tqdm

from jaxlib_ext.samplers.milp.energy import energy_data, pad_energy_data, with_cuts
from jaxlib_ext.samplers.milp.gnn import BipartiteGNN, gnn_bias_fn
from jaxlib_ext.samplers.milp.highs import solve_highs
from jaxlib_ext.samplers.milp.langevin import METHODS, annealing_schedule, run_langevin
from jaxlib_ext.samplers.milp.lp_completion import complete
from jaxlib_ext.samplers.milp.problem import FEAS_TOL, MILP, check_solution

__all__ = ["MILPResult", "solve"]


@dataclasses.dataclass(frozen=True)
class MILPResult:
    """The answer of :func:`solve` (and of ``diving.neural_diving``).

    ``x`` (n,) float64 over all columns in the problem's order (all-NaN when ``feasible`` is
    False); ``objective`` in the problem's sense (NaN without a solution); ``feasible``: the
    float64 certificate holds; ``max_violation`` (rows and bounds) and ``integrality_violation``
    of ``x``; ``trace``: list of ``(seconds, best objective)``; ``status``: "feasible",
    "optimal" (LP route), "no_solution_found", "infeasible", "unbounded" or
    "unbounded_or_infeasible"; ``message`` in words; ``seconds`` wall time; ``method``.
    """

    x: np.ndarray
    objective: float
    feasible: bool
    max_violation: float
    integrality_violation: float
    trace: list
    status: str = "feasible"
    message: str = ""
    seconds: float = 0.0
    method: str = ""

    def __str__(self) -> str:
        lines = [f"status: {self.status}", f"feasible: {self.feasible}",
                 f"objective: {self.objective:.10g}",
                 f"max_violation: {self.max_violation:.3g}",
                 f"integrality_violation: {self.integrality_violation:.3g}",
                 f"seconds: {self.seconds:.3f}", f"method: {self.method}"]
        if self.message:
            lines.append(f"message: {self.message}")
        return "\n".join(lines)


def _no_solution(problem, status, message, trace, t0, method):
    n = problem.num_vars
    return MILPResult(np.full(n, np.nan), float("nan"), False, float("inf"), float("inf"),
                      trace, status, message, time.perf_counter() - t0, method)


def certified_result(problem: MILP, x, trace, t0, method, status="feasible", message=""):
    """A :class:`MILPResult` for ``x`` after the float64 check; a failing ``x`` is never
    reported feasible."""
    if x is None:
        return _no_solution(problem, "no_solution_found",
                            "no feasible assignment was found within the time limit", trace, t0,
                            method)
    x = np.asarray(x, np.float64).copy()
    x[problem.integrality] = np.round(x[problem.integrality])
    chk = check_solution(problem, x, FEAS_TOL)
    if not chk.feasible:
        return _no_solution(problem, "no_solution_found",
                            f"the best point found violates the constraints by "
                            f"{chk.max_violation:.3g}; no certified solution", trace, t0, method)
    return MILPResult(x, chk.objective, True, chk.max_violation, chk.integrality_violation,
                      trace, status, message, time.perf_counter() - t0, method)


def _round_up(v, k):
    return int(-(-v // k) * k)


def solve(problem: MILP, *, time_limit: float = 60.0, num_chains: int = 16,
          model: BipartiteGNN | None = None, seed: int = 0, method: str = "rld",
          steps_per_round: int = 1000, num_flips: int = 4, temperature=(0.5, 0.005),
          penalty=(1.0, 10.0), step_size: float = 0.1, num_cuts: int = 64,
          max_rounds: int | None = None, pad_to: tuple[int, int] | None = None,
          progress: bool = False) -> MILPResult:
    """Solve ``problem`` by annealed discrete Langevin sampling + exact LP completion.

    ``time_limit`` seconds of wall time (compilation included); ``num_chains`` parallel chains;
    ``model`` a trained :class:`~jaxlib_ext.samplers.milp.gnn.BipartiteGNN` (learned flip logits,
    ``method="rld"``) or None (the plain sampler); ``method`` one of "rld" (regularised flip rule,
    the default), "dlp" or "dmala" (discrete Langevin proposal without/with MH);
    ``steps_per_round``, ``num_flips``, ``temperature``/``penalty`` (start, end of each round's
    geometric schedule; the end penalty also prices the elastic LP), ``step_size`` (DLP's alpha)
    and ``num_cuts`` (the LP-value cut pool of (E.2)) configure the sampler; ``pad_to``
    ``(n_int, m)`` pads the device arrays to at least that size, so that instances of one family
    share one compiled program; ``max_rounds``
    stops early; ``progress`` shows a bar of the best objective. The first round always runs its
    whole annealing schedule (so that every call gets one complete anneal, even past a short
    limit); later rounds run as compiled chunks of up to 100 steps and the limit is checked
    between chunks (a chunk starts only if half a chunk's time is left), so a run ends within
    about one chunk of ``time_limit`` or at the end of the first round, plus the LP completions of
    the last round. The first call on a new shape also pays the ``jit`` compilation.
    """
    t0 = time.perf_counter()
    if not isinstance(problem, MILP):
        raise TypeError(f"problem: expected a MILP, got {type(problem).__name__}")
    if not time_limit > 0:
        raise ValueError(f"time_limit: expected > 0, got {time_limit}")
    if num_chains < 1 or steps_per_round < 1:
        raise ValueError(f"num_chains, steps_per_round: expected >= 1, got {num_chains}, "
                         f"{steps_per_round}")
    if method not in METHODS:
        raise ValueError(f"method: expected one of {METHODS}, got {method!r}")
    if model is not None and method != "rld":
        raise ValueError("model: the learned logits are used with method='rld' only")
    name = f"langevin-{method}" + ("+gnn" if model is not None else "")
    if not problem.integrality.any():
        r = solve_highs(problem, time_limit=time_limit, relax=True)
        if r.x is None:
            return _no_solution(problem, r.status, f"the problem has no integer variables; "
                                f"HiGHS reports the LP {r.status}", [], t0, "highs-lp")
        return certified_result(problem, r.x, [(r.seconds, r.objective)], t0, "highs-lp",
                                "optimal" if r.status == "optimal" else "feasible",
                                "no integer variables: solved as an LP with HiGHS")
    relax = solve_highs(problem, time_limit=time_limit, relax=True)
    if relax.status in ("infeasible", "unbounded", "unbounded_or_infeasible"):
        why = {"infeasible": "the LP relaxation is infeasible, so the MILP is infeasible",
               "unbounded": "the LP relaxation is unbounded: no finite optimum",
               "unbounded_or_infeasible": "the LP relaxation is unbounded or infeasible"}
        return _no_solution(problem, relax.status, why[relax.status], [], t0, name)

    iz, ic = problem.integer_index, problem.continuous_index
    data0 = energy_data(problem, lp_rows=True)
    n0, m0 = data0.c.shape[0], data0.A.shape[0]
    pn, pm = pad_to if pad_to is not None else (0, 0)
    data = pad_energy_data(data0, _round_up(max(n0, pn), 8), _round_up(max(m0, pm), 16))
    n = data.c.shape[0]
    bias_fn = bias_params = None
    if model is not None:
        graphdef, bias_params = nnx.split(model)
        bias_fn = gnn_bias_fn(graphdef)
    key = jax.random.key(seed)
    rng = np.random.default_rng(seed)
    lo, up = np.ceil(problem.lower[iz]), np.floor(problem.upper[iz])
    z = np.where(rng.random((num_chains, n0)) < 0.5, lo, np.minimum(lo + 1, up))
    z[0] = lo
    best_x, best_val = None, np.inf  # best_val in minimisation form
    trace = []
    rounds = 0
    bar = tqdm(total=None, desc="best objective", disable=not progress)

    cut_h = np.zeros((num_cuts if ic.size else 0, n0))
    cut_a = np.full(num_cuts if ic.size else 0, -np.inf)
    cut_z = {}  # assignment bytes -> slot: one cut per distinct completed z
    slot_key = [None] * cut_a.shape[0]
    cz = problem.sense * problem.c[iz]

    def add_cuts(Z):  # (E.2): cuts of the elastic LP value at the assignments Z
        if not ic.size:
            return None
        comp = complete(problem, Z, penalty=float(penalty[-1]))
        for k in range(Z.shape[0]):
            key_z = np.round(Z[k]).tobytes()
            if key_z in cut_z or not np.isfinite(comp.value[k]):
                continue
            slot = add_cuts.count % num_cuts  # a ring: the oldest cut makes room
            add_cuts.count += 1
            cut_z.pop(slot_key[slot], None)
            cut_z[key_z], slot_key[slot] = slot, key_z
            h = comp.value_grad[k]
            cut_h[slot] = h
            cut_a[slot] = comp.value[k] - cz @ Z[k] - h @ Z[k]
        return comp

    add_cuts.count = 0
    chunk = min(steps_per_round, 100)
    steps_per_round = -(-steps_per_round // chunk) * chunk
    temps, pens = annealing_schedule(steps_per_round, temperature, penalty)
    chunk_time = 0.0
    add_cuts(z)
    while (time.perf_counter() - t0 + 0.5 * chunk_time < time_limit
           and (max_rounds is None or rounds < max_rounds)):
        data_round = with_cuts(data, cut_h, cut_a) if ic.size else data
        bz = np.zeros((num_chains, n0))
        bobj = np.full(num_chains, np.inf)
        for c0 in range(0, steps_per_round, chunk):
            if rounds and time.perf_counter() - t0 + 0.5 * chunk_time >= time_limit:
                break
            t_chunk = time.perf_counter()
            zpad = np.zeros((num_chains, n), np.float32)
            zpad[:, :n0] = z
            key, sub = jax.random.split(key)
            state, _ = run_langevin(sub, data_round, zpad, temperatures=temps[c0:c0 + chunk],
                                    penalties=pens[c0:c0 + chunk], method=method,
                                    step_size=step_size, num_flips=num_flips, bias_fn=bias_fn,
                                    bias_params=bias_params)
            z = np.asarray(state.z)[:, :n0].astype(np.float64)
            obj = np.asarray(state.best_objective)
            better = obj < bobj
            bobj = np.where(better, obj, bobj)
            bz[better] = np.asarray(state.best_z)[better, :n0]
            chunk_time = time.perf_counter() - t_chunk
        final = z
        found = np.isfinite(bobj)
        cand = np.concatenate([bz[found], final]) if ic.size else bz[found]
        if cand.shape[0]:
            elastic = add_cuts(cand)
            if elastic is not None:  # exact completion only where the elastic LP is feasible
                cand = cand[elastic.feasible]
        if cand.shape[0]:
            comp = complete(problem, cand)
            vals = np.where(comp.feasible, problem.sense * comp.objective, np.inf)
            i = int(np.argmin(vals))
            if vals[i] < best_val - 1e-9 and check_solution(problem, comp.x[i]).feasible:
                best_val, best_x = float(vals[i]), comp.x[i].copy()
                trace.append((time.perf_counter() - t0, problem.sense * best_val))
                bar.set_postfix(best=f"{problem.sense * best_val:.6g}")
        rounds += 1
        bar.update(1)
        z = final
        if best_x is not None:  # intensify: a quarter of the chains restart at the incumbent
            z[: max(1, num_chains // 4)] = best_x[iz]
    bar.close()
    return certified_result(problem, best_x, trace, t0, name)
