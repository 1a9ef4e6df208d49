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
   annealed sampler of :mod:`langevin` (``rule``; with ``model`` the learned flip logits of
   :mod:`gnn` are added, with ``proposal`` the learned proposal of :mod:`proposal` draws the
   moves), as compiled chunks of a fixed length so that the time limit is checked between them.
   For problems with continuous columns the energy is (E.2) of :mod:`energy`: the elastic LP
   value (L.2) of :mod:`lp_completion` enters as a pool of ``num_cuts`` cuts, one per distinct
   completed assignment, grown every round (our choice, since the LP cannot run inside ``jit``).
4. After each round the chains' final states are repaired: a few greedy single-coordinate moves,
   each the one that lowers the constraint violation most (the objective switched off), inside
   ``jit`` (our choice). The chains' best row-feasible states, the repaired states and, with
   continuous columns, the final states (where their elastic LP is feasible) go to the host, are
   de-duplicated and completed by the exact LP (L.1); every completed ``x`` is measured in
   float64 (all rows and bounds to ``1e-6``, integer columns exactly integral) and only then may
   become the incumbent. A quarter of the chains restart from the incumbent (our choice). A round
   whose chains reached no feasible point doubles the next round's end penalty (our choice).

A returned ``x`` is therefore feasible to ``1e-6`` with integral integer columns, or
``feasible`` is False and ``x`` is all-NaN.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from tqdm.auto import tqdm

from jaxlib_ext.samplers.milp.energy import (
    EnergyData,
    energy_data,
    energy_terms,
    pad_energy_data,
)
from jaxlib_ext.samplers.milp.gnn import BipartiteGNN, gnn_bias_fn
from jaxlib_ext.samplers.milp.highs import solve_highs
from jaxlib_ext.samplers.milp.langevin import annealing_schedule, coordinate_gains, run_langevin
from jaxlib_ext.samplers.milp.lp_completion import complete
from jaxlib_ext.samplers.milp.problem import FEAS_TOL, MILP, check_solution

__all__ = ["SOLVE_RULES", "MILPResult", "solve"]

CHUNK_STEPS = 25  # sampler steps per compiled program; the time limit is checked between them
SOLVE_RULES = ("dlp", "dmala", "rld")  # the samplers of ``solve(rule=...)``
_FEAS_TOL = 1e-6  # the sampler's row check, in (E.1)'s weighted units
_MAX_PENALTY_GROWTH = 1e3  # adaptive penalty: the end penalty stays below this times the start


@dataclasses.dataclass(frozen=True)
class MILPResult:
    """The answer of :func:`solve` (and of ``diving.neural_diving``).

    Attributes:
      x: ``(n,)`` float64 over all columns in the problem's order (all-NaN when ``feasible``
        is False).
      objective: in the problem's sense (NaN without a solution).
      feasible: the float64 certificate holds.
      max_violation: of ``x`` over the rows and bounds.
      integrality_violation: of ``x`` over the integer columns.
      trace: list of ``(seconds, best objective)``.
      status: "feasible", "optimal" (LP route), "no_solution_found", "infeasible",
        "unbounded" or "unbounded_or_infeasible".
      message: the status in words.
      seconds: wall time.
      rule: the algorithm that produced ``x``: ``"langevin-<rule>"`` (``"+gnn"`` with a
        learned bias), ``"neural-diving"`` or ``"highs-lp"``.
      compile_seconds: of ``seconds``, the time spent compiling the sampler's programs (0 when
        they were compiled by an earlier call).
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
    rule: str = ""
    compile_seconds: float = 0.0

    def __str__(self) -> str:
        lines = [f"status: {self.status}", f"feasible: {self.feasible}",
                 f"objective: {self.objective:.10g}",
                 f"max_violation: {self.max_violation:.3g}",
                 f"integrality_violation: {self.integrality_violation:.3g}",
                 f"seconds: {self.seconds:.3f}", f"compile_seconds: {self.compile_seconds:.3f}",
                 f"rule: {self.rule}"]
        if self.message:
            lines.append(f"message: {self.message}")
        return "\n".join(lines)


def _no_solution(problem, status, message, trace, t0, rule):
    n = problem.num_vars
    return MILPResult(np.full(n, np.nan), float("nan"), False, float("inf"), float("inf"),
                      trace, status, message, time.perf_counter() - t0, rule)


def certified_result(problem: MILP, x, trace, t0, rule, status="feasible", message=""):
    """A :class:`MILPResult` for ``x`` after the float64 check; a failing ``x`` is never
    reported feasible.

    Args:
      problem: the :class:`~jaxlib_ext.samplers.milp.problem.MILP`.
      x: ``(n,)`` the candidate over all columns, or None (no solution found).
      trace: list of ``(seconds, best objective)``.
      t0: the ``time.perf_counter()`` at the call's start.
      rule: the algorithm that produced ``x`` (:attr:`MILPResult.rule`).
      status: the status of a certified ``x``.
      message: the status in words.

    Returns:
      A :class:`MILPResult`: feasible with ``x`` (integer columns rounded) when it passes
      :func:`~jaxlib_ext.samplers.milp.problem.check_solution`, otherwise
      ``"no_solution_found"`` with an all-NaN ``x``.
    """
    if x is None:
        return _no_solution(problem, "no_solution_found",
                            "no feasible assignment was found within the time limit", trace, t0,
                            rule)
    x = np.asarray(x, np.float64).copy()
    x[problem.integrality] = np.round(x[problem.integrality])
    chk = check_solution(problem, x, FEAS_TOL)
    if not chk.feasible:
        return _no_solution(problem, "no_solution_found",
                            f"the best point found violates the constraints by "
                            f"{chk.max_violation:.3g}; no certified solution", trace, t0, rule)
    return MILPResult(x, chk.objective, True, chk.max_violation, chk.integrality_violation,
                      trace, status, message, time.perf_counter() - t0, rule)


def _round_up(v, k):
    return int(-(-v // k) * k)


def _host_energy_data(problem, n, m):
    """(E.1)'s arrays of ``problem`` padded to ``n`` columns and ``m`` rows as NumPy arrays, so
    that no eager device op has to be compiled inside the time limit."""
    d = EnergyData(*(np.asarray(a) for a in energy_data(problem, lp_rows=True)))
    return pad_energy_data(d, n, m)


def _chunk_program(data, z, seed, counter, temperatures, penalties, params, *, rule, step_size,
                   num_flips, sampler_fn, learned):
    """One chunk of the annealed sampler for all chains: ``(z, best_z, best_objective)``."""
    key = jax.random.fold_in(jax.random.key(seed), counter)
    if learned:
        kw = {"proposal_fn": sampler_fn, "proposal_params": params}
    else:
        kw = {"bias_fn": sampler_fn, "bias_params": params}
    state, _ = run_langevin(key, data, z, temperatures=temperatures, penalties=penalties,
                            rule=rule, step_size=step_size, num_flips=num_flips, **kw)
    return state.z, state.best_z, state.best_objective


def _repair_program(data, z, *, steps):
    """Greedy repair of every chain's ``z`` (K, n): up to ``steps`` single-coordinate moves, each
    the one of largest exact violation decrease (``langevin.coordinate_gains`` with the objective
    and the cut pool switched off), stopping where no move lowers the violation. Returns the
    repaired ``z`` and its weighted violation (K,)."""
    n = data.c.shape[0]
    d = data._replace(c=jnp.zeros_like(data.c), cut_h=data.cut_h[:0], cut_a=data.cut_a[:0])

    def one(z):
        def cond(s):
            i, _, go = s
            return (i < steps) & go

        def body(s):
            i, z, _ = s
            up, down = coordinate_gains(d, z)
            up = jnp.where((z + 1 <= d.upper) & (d.var_mask > 0), up, -jnp.inf)
            down = jnp.where((z - 1 >= d.lower) & (d.var_mask > 0), down, -jnp.inf)
            gains = jnp.concatenate([up, down])
            j = jnp.argmax(gains)
            # a float32 gain below this is rounding noise, not a repair
            go = gains[j] > 1e-5 * (1.0 + energy_terms(d, z)[1])
            z = jnp.where(go, z.at[j % n].add(jnp.where(j < n, 1.0, -1.0)), z)
            return i + 1, z, go

        _, z, _ = jax.lax.while_loop(cond, body, (0, z, jnp.asarray(True)))
        return z, energy_terms(d, z)[1]

    return jax.vmap(one)(z)


class _Program:
    """A compiled sampler program and the measured seconds of its last run (None before)."""

    def __init__(self, executable):
        self.executable = executable
        self.seconds = None


_PROGRAMS: collections.OrderedDict = collections.OrderedDict()
_PROGRAMS_KEPT = 16  # compiled programs kept across calls, least recently used dropped first


def _compiled(fn, static: dict, args) -> tuple[_Program, float]:
    """``fn(*args, **static)`` compiled ahead of time for these argument shapes, and the seconds
    that compiling took (0 when an earlier call compiled it)."""
    leaves, treedef = jax.tree.flatten(args)
    key = (fn, tuple(sorted(static.items())), treedef,
           tuple((tuple(x.shape), str(x.dtype)) for x in leaves))
    program = _PROGRAMS.get(key)
    if program is not None:
        _PROGRAMS.move_to_end(key)
        return program, 0.0
    t = time.perf_counter()
    program = _Program(jax.jit(functools.partial(fn, **static)).lower(*args).compile())
    seconds = time.perf_counter() - t
    _PROGRAMS[key] = program
    while len(_PROGRAMS) > _PROGRAMS_KEPT:
        _PROGRAMS.popitem(last=False)
    return program, seconds


def solve(problem: MILP, *, time_limit: float = 60.0, num_chains: int = 16,
          model: BipartiteGNN | None = None, proposal: nnx.Module | None = None,
          metropolis: bool = False, seed: int = 0, rule: str = "rld",
          steps_per_round: int = 1000, num_flips: int = 4, temperature=(0.5, 0.005),
          penalty=(1.0, 10.0), step_size: float = 0.1, num_cuts: int = 64,
          repair_steps: int = 20, adaptive_penalty: bool = True, max_rounds: int | None = None,
          pad_to: tuple[int, int] | None = None, progress: bool = False) -> MILPResult:
    """Solve ``problem`` by annealed discrete Langevin sampling + exact LP completion.

    The sampler runs in compiled chunks of ``CHUNK_STEPS`` steps (one compiled program per
    problem shape, kept across calls). Before every chunk, and before every round's completion
    (its repair steps and exact LP), the time left is compared with the measured cost of a chunk
    and of the last completion, and nothing starts that would not fit. The first round always
    anneals from the hot to the cold end: when its ``steps_per_round`` steps do not fit, the rest
    of its schedule is re-created over the steps that do (at least one chunk), and its candidates
    are always completed.

    Args:
      problem: the :class:`~jaxlib_ext.samplers.milp.problem.MILP` to solve.
      time_limit: seconds of wall time for the whole call, compilation included. The call
        returns within ``time_limit`` plus one chunk and one completion, or right after the
        sampler's compilation if that alone exceeds the limit (an XLA compilation that started
        within the limit cannot be interrupted and runs to its end). On the first call for a
        problem shape a chunk's cost is not yet known, and if that first chunk alone ends past
        the limit, the first round takes one more chunk to reach the cold end.
      num_chains: parallel chains.
      model: a trained :class:`~jaxlib_ext.samplers.milp.gnn.BipartiteGNN` whose bounded logits
        are added to the flip rule (``rule="rld"`` only), or None.
      proposal: a learned proposal (an ``nnx.Module`` with output (n, 2), e.g.
        :class:`~jaxlib_ext.samplers.milp.proposal.LearnedProposal`) that draws every move
        itself (the ``langevin`` rule "learned"), or None. Excludes ``model`` and ``rule``.
      metropolis: with ``proposal``, add the Metropolis-Hastings test ("learned-mh").
      seed: seeds the initial states and the sampler.
      rule: "rld" (regularised flip rule, the default), "dlp" or "dmala" (discrete Langevin
        proposal without/with MH).
      steps_per_round: steps of each round's annealing schedule (rounded up to whole chunks).
      num_flips: the ``k`` of the flip rule (D.3).
      temperature: (start, end) of each round's geometric temperature schedule.
      penalty: (start, end) of each round's geometric penalty schedule; the end penalty also
        prices the elastic LP.
      step_size: DLP's ``alpha``.
      num_cuts: size of the LP-value cut pool of (E.2) (problems with continuous columns).
      repair_steps: greedy violation-reducing moves applied to the chains' final states after
        each round; the repaired states are completed as extra candidates (0: no repair).
      adaptive_penalty: double the next round's end penalty (of the integer rows; the elastic
        LP's price stays ``penalty[1]``) after a round whose chains reached no feasible point,
        up to ``1e3 * penalty[0]``, and return to ``penalty[1]`` once they reach one.
      max_rounds: stop after this many rounds (None: only the time limit).
      pad_to: ``(n_int, m)``: pad the device arrays to at least this size, so that instances of
        one family share one compiled program.
      progress: show a progress bar with the best objective and the elapsed time.

    Returns:
      A :class:`MILPResult`; ``feasible`` only with a point that passed the float64 check.

    Raises:
      TypeError: ``problem`` is not a MILP or ``proposal`` not an ``nnx.Module``.
      ValueError: an argument is out of range or contradicts another, or a learned ``model`` or
        ``proposal`` is given for a problem without integer columns.

    References:
      The unsupervised Langevin MILP sampler, ICML 2026 (UNLS4MILP; abstract only); Zhang,
      Liu, Liu, arXiv 2206.09914 (DLP, DMALA); Feng and Yang, ICML 2025 (the flip rule).
    """
    t0 = time.perf_counter()
    if not isinstance(problem, MILP):
        raise TypeError(f"problem: expected a MILP, got {type(problem).__name__}")
    if not time_limit > 0:
        raise ValueError(f"time_limit: expected > 0, got {time_limit}")
    if num_chains < 1 or steps_per_round < 1:
        raise ValueError(f"num_chains, steps_per_round: expected >= 1, got {num_chains}, "
                         f"{steps_per_round}")
    if repair_steps < 0:
        raise ValueError(f"repair_steps: expected >= 0, got {repair_steps}")
    if num_cuts < 1:
        raise ValueError(f"num_cuts: expected >= 1, got {num_cuts}")
    for arg, pair in (("temperature", temperature), ("penalty", penalty)):
        if len(pair) != 2 or not (pair[0] > 0 and pair[1] > 0):
            raise ValueError(f"{arg}: expected two positive values, got {pair}")
    if rule not in SOLVE_RULES:
        raise ValueError(f"rule: expected one of {SOLVE_RULES}, got {rule!r}")
    if model is not None and proposal is not None:
        raise ValueError("model, proposal: give one learned component, not both (model adds "
                         "bounded logits to the flip rule, proposal draws the moves itself)")
    if model is not None and rule != "rld":
        raise ValueError("model: the learned logits are used with rule='rld' only")
    if proposal is not None:
        if not isinstance(proposal, nnx.Module):
            raise TypeError(f"proposal: expected an nnx.Module, got {type(proposal).__name__}")
        if rule != "rld":
            raise ValueError(f"rule: a learned proposal draws the moves itself; leave rule "
                             f"at its default, got {rule!r}")
    if metropolis and proposal is None:
        raise ValueError("metropolis: the MH test of a learned proposal needs proposal=...; "
                         "use rule='dmala' for DLP with MH")
    if proposal is not None:
        sampler = "learned-mh" if metropolis else "learned"
        name = f"langevin-{sampler}"
    else:
        sampler = rule
        name = f"langevin-{rule}" + ("+gnn" if model is not None else "")
    if not problem.integrality.any():
        if model is not None or proposal is not None:
            raise ValueError(f"problem: {problem.name or 'the problem'} has no integer columns; "
                             f"a learned {'proposal' if proposal is not None else 'model'} "
                             "needs some")
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

    def elapsed():
        return time.perf_counter() - t0

    iz, ic = problem.integer_index, problem.continuous_index
    n0, m0 = iz.size, problem.num_rows
    pn, pm = pad_to if pad_to is not None else (0, 0)
    host_data = _host_energy_data(problem, _round_up(max(n0, pn), 8), _round_up(max(m0, pm), 16))
    n = host_data.c.shape[0]
    data = jax.device_put(host_data)  # a transfer, no compilation
    learned = model if model is not None else proposal
    sampler_fn = params = None
    if learned is not None:
        graphdef, params = nnx.split(learned)
        sampler_fn = gnn_bias_fn(graphdef)
    rng = np.random.default_rng(seed)
    seed32 = np.uint32(seed % 2**32)
    lo, up = np.ceil(problem.lower[iz]), np.floor(problem.upper[iz])
    z = np.where(rng.random((num_chains, n0)) < 0.5, lo, np.minimum(lo + 1, up))
    z[0] = lo
    best_x, best_val = None, np.inf  # best_val in minimisation form
    trace = []
    rounds = 0

    num_slots = num_cuts if ic.size else 0
    cut_h = np.zeros((num_slots, n), np.float32)
    cut_a = np.full(num_slots, -np.inf, np.float32)
    cut_z = {}  # assignment bytes -> slot: one cut per distinct completed z
    slot_key = [None] * num_slots
    cz = problem.sense * problem.c[iz]

    def add_cuts(Z):  # (E.2): cuts of the elastic LP value at the assignments Z
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
            cut_h[slot, :n0] = h
            cut_a[slot] = comp.value[k] - cz @ Z[k] - h @ Z[k]
        return comp

    add_cuts.count = 0
    post_time = 0.0  # measured cost of the last completion
    if ic.size:
        t_post = time.perf_counter()
        add_cuts(z)
        post_time = time.perf_counter() - t_post

    def padded(Z):
        out = np.zeros((num_chains, n), np.float32)
        out[:, :n0] = Z
        return out

    def data_with_cuts():
        return data._replace(cut_h=jax.device_put(cut_h), cut_a=jax.device_put(cut_a))

    bar = tqdm(total=None, desc="rounds", disable=not progress)
    shown = [-np.inf]

    def show(force=False):  # at most a few refreshes a second: chunks can take microseconds
        if progress and (force or time.perf_counter() - shown[0] > 0.2):
            best = f"{problem.sense * best_val:.6g}" if best_x is not None else "none"
            bar.set_postfix_str(f"best={best}, t={elapsed():.1f}s")
            shown[0] = time.perf_counter()

    show(force=True)
    chunk = min(CHUNK_STEPS, steps_per_round)
    chunks_per_round = -(-steps_per_round // chunk)
    if elapsed() >= time_limit:
        bar.close()
        return _no_solution(problem, "no_solution_found", "the time limit was spent before the "
                            "sampler started", trace, t0, name)
    temps0 = np.zeros(chunk, np.float32)
    run_prog, compile_seconds = _compiled(
        _chunk_program, {"rule": sampler, "step_size": float(step_size),
                         "num_flips": int(num_flips), "sampler_fn": sampler_fn,
                         "learned": proposal is not None},
        (data_with_cuts(), padded(z), seed32, np.uint32(0), temps0, temps0, params))
    repair_prog = None
    if repair_steps and elapsed() < time_limit:
        repair_prog, secs = _compiled(_repair_program, {"steps": int(repair_steps)},
                                      (data_with_cuts(), padded(z)))
        compile_seconds += secs
    if elapsed() >= time_limit:
        bar.close()
        return dataclasses.replace(
            _no_solution(problem, "no_solution_found",
                         f"compiling the sampler took {compile_seconds:.3g} s, and the time limit "
                         f"of {time_limit:g} s was spent before a round could run", trace, t0,
                         name), compile_seconds=compile_seconds)

    pen_end = float(penalty[1])
    pen_end_max = max(pen_end, _MAX_PENALTY_GROWTH * float(penalty[0]))
    counter = 0  # chunks run: folded into the sampler's key
    while max_rounds is None or rounds < max_rounds:
        if rounds and elapsed() + run_prog.seconds + post_time > time_limit:
            break  # the next round's first chunk and its completion would not fit
        temps, pens = annealing_schedule(chunks_per_round * chunk, temperature,
                                         (penalty[0], pen_end))
        data_round = data_with_cuts()
        bz = np.zeros((num_chains, n0))
        bobj = np.full(num_chains, np.inf)
        c0 = 0
        while c0 < temps.size:
            if run_prog.seconds is not None:
                left = time_limit - elapsed() - post_time
                if rounds == 0:  # compress the rest of the anneal into the chunks that fit
                    fit = max(1, int(left // run_prog.seconds))
                    if fit < (temps.size - c0) // chunk:
                        rest_t, rest_p = annealing_schedule(
                            fit * chunk, (temps[c0], temps[-1]), (pens[c0], pens[-1]))
                        temps = np.concatenate([temps[:c0], rest_t])
                        pens = np.concatenate([pens[:c0], rest_p])
                elif run_prog.seconds > left:
                    break
            t_chunk = time.perf_counter()
            zs, best_z, obj = run_prog.executable(data_round, padded(z), seed32,
                                                  np.uint32(counter), temps[c0:c0 + chunk],
                                                  pens[c0:c0 + chunk], params)
            counter += 1
            z = np.asarray(zs)[:, :n0].astype(np.float64)
            obj = np.asarray(obj)
            better = obj < bobj
            bobj = np.where(better, obj, bobj)
            bz[better] = np.asarray(best_z)[better, :n0]
            run_prog.seconds = time.perf_counter() - t_chunk
            c0 += chunk
            show()
        if rounds and elapsed() + post_time > time_limit:
            break
        t_post = time.perf_counter()
        final = z
        found = np.isfinite(bobj)
        cand = np.concatenate([bz[found], final]) if ic.size else bz[found]
        from_chain = np.ones(cand.shape[0], bool)
        if repair_prog is not None:
            zr, viol = repair_prog.executable(data_round, padded(final))
            zr = np.asarray(zr)[:, :n0].astype(np.float64)
            if not ic.size:  # without continuous columns only row-feasible repairs can complete
                zr = zr[np.asarray(viol) <= _FEAS_TOL]
            cand = np.concatenate([cand, zr])
            from_chain = np.concatenate([from_chain, np.zeros(zr.shape[0], bool)])
        if ic.size and cand.shape[0]:
            elastic = add_cuts(cand)  # exact completion only where the elastic LP is feasible
            cand, from_chain = cand[elastic.feasible], from_chain[elastic.feasible]
        chains_feasible = False
        if cand.shape[0]:
            comp = complete(problem, cand)
            chains_feasible = bool((comp.feasible & from_chain).any())
            vals = np.where(comp.feasible, problem.sense * comp.objective, np.inf)
            i = int(np.argmin(vals))
            if vals[i] < best_val - 1e-9 and check_solution(problem, comp.x[i]).feasible:
                best_val, best_x = float(vals[i]), comp.x[i].copy()
                trace.append((elapsed(), problem.sense * best_val))
        if adaptive_penalty:
            pen_end = float(penalty[1]) if chains_feasible else min(2.0 * pen_end, pen_end_max)
        post_time = time.perf_counter() - t_post
        rounds += 1
        bar.update(1)
        show(force=True)
        z = final
        if best_x is not None:  # intensify: a quarter of the chains restart at the incumbent
            z[: max(1, num_chains // 4)] = best_x[iz]
    show(force=True)
    bar.close()
    result = certified_result(problem, best_x, trace, t0, name)
    return dataclasses.replace(result, compile_seconds=compile_seconds)
