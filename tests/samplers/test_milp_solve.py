"""End-to-end: the tiny-MILP oracle (enumeration + LP completion = scipy.optimize.milp = solve),
certified solutions, the wall-clock limit, repair and adaptive penalty, learned components, bad
input."""

import importlib
import time

import numpy as np
import pytest
from scipy.optimize import Bounds, LinearConstraint
from scipy.optimize import milp as scipy_milp

from jaxlib_ext.samplers import milp


def tiny_milp(seed, n_int=10, n_cont=3, m=4):
    """Random small MILP: binaries z, boxed continuous y, mixed <= rows and one cover row."""
    rng = np.random.default_rng(seed)
    n = n_int + n_cont
    A = np.zeros((m + 1, n))
    A[:m, :n_int] = rng.integers(0, 4, size=(m, n_int))
    A[:m, n_int:] = rng.integers(-2, 3, size=(m, n_cont))
    A[m, :n_int] = 1.0  # pick at least 3 binaries
    c = np.r_[rng.integers(-6, 3, size=n_int), rng.integers(-3, 4, size=n_cont)].astype(float)
    row_upper = np.r_[rng.integers(4, 9, size=m), np.inf]
    row_lower = np.r_[np.full(m, -np.inf), 3.0]
    return milp.make_milp(c, A, row_lower, row_upper, 0.0,
                          np.r_[np.ones(n_int), np.full(n_cont, 2.5)],
                          np.r_[np.ones(n_int, bool), np.zeros(n_cont, bool)],
                          name=f"tiny-{seed}")


def _scipy_optimum(p):
    res = scipy_milp(p.c, constraints=LinearConstraint(p.A.toarray(), p.row_lower, p.row_upper),
                     integrality=p.integrality.astype(int), bounds=Bounds(p.lower, p.upper))
    assert res.status == 0
    return res.fun


@pytest.mark.parametrize("seed", [0, *(pytest.param(s, marks=pytest.mark.slow) for s in (1, 2))])
def test_tiny_milp_enumeration_equals_scipy_and_solve_reaches_it(seed):
    p = tiny_milp(seed)
    Z = np.array(list(np.ndindex(*(2,) * 10)), float)
    comp = milp.complete(p, Z)
    assert comp.feasible.any()
    enum_opt = np.nanmin(np.where(comp.feasible, comp.objective, np.nan))
    assert enum_opt == pytest.approx(_scipy_optimum(p), abs=1e-7)
    r = milp.solve(p, time_limit=120.0, num_chains=8, max_rounds=4, seed=seed)
    assert r.feasible and r.status == "feasible"
    assert r.objective == pytest.approx(enum_opt, abs=1e-7)
    assert milp.check_solution(p, r.x).feasible


CERTIFY = {
    "p0033": lambda: milp.read_mps(milp.miplib_path("p0033")),
    "facility": lambda: milp.capacitated_facility_location(2, n_customers=6, n_facilities=4),
    "setcover": lambda: milp.set_cover(2, n_rows=15, n_cols=30),
}


@pytest.mark.parametrize("rule, name", [  # instances beyond the first two are sweeps
    ("rld", "p0033"), pytest.param("rld", "facility", marks=pytest.mark.slow), ("rld", "setcover"),
    pytest.param("dlp", "facility", marks=pytest.mark.slow),
    pytest.param("dmala", "setcover", marks=pytest.mark.slow)])
def test_every_returned_solution_is_certified(rule, name):
    for p in [CERTIFY[name]()]:
        r = milp.solve(p, time_limit=60.0, num_chains=4, max_rounds=2, rule=rule,
                       steps_per_round=50)
        if r.feasible:
            assert r.x.dtype == np.float64 and r.x.shape == (p.num_vars,)
            A_x = p.A @ r.x
            assert np.all(A_x <= p.row_upper + 1e-6) and np.all(A_x >= p.row_lower - 1e-6)
            assert np.all(r.x <= p.upper + 1e-6) and np.all(r.x >= p.lower - 1e-6)
            xi = r.x[p.integrality]
            assert np.array_equal(xi, np.round(xi))
            assert r.max_violation <= 1e-6 and r.integrality_violation == 0.0
            assert r.objective == pytest.approx(p.objective(r.x))
            assert r.trace and r.trace[-1][1] == pytest.approx(r.objective)
        else:
            assert np.isnan(r.x).all() and r.status == "no_solution_found"


def test_integer_infeasible_problem_says_so():
    # 2 x1 + 2 x2 = 1 has an LP solution but no integer one
    p = milp.make_milp([1.0, 1.0], [[2.0, 2.0]], [1.0], [1.0], 0.0, 1.0, [True, True])
    r = milp.solve(p, time_limit=60.0, num_chains=4, max_rounds=2, steps_per_round=20)
    assert not r.feasible and r.status == "no_solution_found"
    assert np.isnan(r.x).all() and np.isnan(r.objective) and "no feasible" in r.message


def test_infeasible_and_unbounded_problems():
    inf = milp.make_milp([1.0, 1.0], [[1.0, 1.0]], [5.0], None, 0.0, 1.0, [True, True])
    r = milp.solve(inf, time_limit=10.0)
    assert not r.feasible and r.status == "infeasible" and "infeasible" in r.message
    unb = milp.make_milp([1.0, -1.0], [[1.0, -1.0]], None, [1.0], 0.0, [1.0, np.inf],
                         [True, False])
    r = milp.solve(unb, time_limit=10.0)
    assert not r.feasible and r.status in ("unbounded", "unbounded_or_infeasible")
    assert "unbounded" in r.message


def test_no_integer_variables_routes_to_lp():
    p = milp.make_milp([-1.0, -2.0], [[1.0, 1.0]], None, [1.5], 0.0, 1.0)
    r = milp.solve(p, time_limit=10.0)
    assert r.feasible and r.status == "optimal" and r.rule == "highs-lp"
    assert r.objective == pytest.approx(-2.5) and "LP" in r.message
    bad = milp.make_milp([1.0], [[1.0]], [2.0], None, 0.0, 1.0)
    r = milp.solve(bad, time_limit=10.0)
    assert not r.feasible and r.status == "infeasible"


def test_solve_argument_checks():
    p = tiny_milp(0)
    with pytest.raises(TypeError, match="problem"):
        milp.solve("p0033.mps")
    with pytest.raises(ValueError, match="time_limit"):
        milp.solve(p, time_limit=0.0)
    with pytest.raises(ValueError, match="num_chains"):
        milp.solve(p, num_chains=0)
    with pytest.raises(ValueError, match="rule"):
        milp.solve(p, rule="sa")


def test_p0033_reaches_optimum_within_budget():
    p = milp.read_mps(milp.miplib_path("p0033"))
    r = milp.solve(p, time_limit=120.0, num_chains=16, max_rounds=6, seed=0)
    assert r.feasible and r.objective == pytest.approx(3089.0)


def test_time_limit_includes_compilation_and_a_cached_call_meets_it():
    # a round of 10^5 steps cannot fit: the first round's anneal is compressed into the limit
    p = milp.set_cover(5, n_rows=18, n_cols=36)
    limit, tol = 1.0, 1.0  # tol: one chunk and one completion, with room for a loaded CI machine
    kw = dict(num_chains=8, steps_per_round=100_000)
    first = milp.solve(p, time_limit=limit, **kw)
    assert first.compile_seconds >= 0.0
    assert first.seconds - first.compile_seconds <= limit + tol
    # on a loaded machine compiling the chunk alone can spend the first limit, so that the repair
    # program is compiled only by a later call: one call with room compiles both
    milp.solve(p, time_limit=60.0, max_rounds=1, num_chains=8, steps_per_round=100)
    again = milp.solve(p, time_limit=limit, seed=1, **kw)
    assert again.compile_seconds == 0.0  # the compiled programs are kept across calls
    assert again.seconds <= limit + tol
    assert again.feasible and again.status == "feasible"


def test_a_limit_spent_by_compilation_stops_right_after_it(monkeypatch):
    solve_mod = importlib.import_module("jaxlib_ext.samplers.milp.solve")

    def slow_compiled(fn, static, args):  # a compilation that outlasts the limit
        time.sleep(0.6)
        program, _ = compiled(fn, static, args)
        return program, 0.6

    compiled = solve_mod._compiled
    monkeypatch.setattr(solve_mod, "_compiled", slow_compiled)
    r = milp.solve(tiny_milp(0), time_limit=0.5, num_chains=4, steps_per_round=25)
    assert not r.feasible and r.status == "no_solution_found" and np.isnan(r.x).all()
    assert r.compile_seconds == pytest.approx(0.6) and "compiling" in r.message
    assert r.seconds < 0.5 + 0.6 + 1.0


def knapsack_cover(seed, n=30, m=4, fill=0.85):
    """Binaries with knapsack-like cover rows ``a_i^T z >= fill * sum(a_i)``, positive costs:
    the objective pulls every column to 0, the rows need most of them at 1."""
    rng = np.random.default_rng(seed)
    A = rng.integers(1, 20, size=(m, n)).astype(float)
    return milp.make_milp(rng.integers(1, 10, size=n).astype(float), A, fill * A.sum(1), None,
                          0.0, 1.0, np.ones(n, bool), name=f"knapsack-cover-{seed}")


def test_repair_makes_the_final_states_feasible():
    # one hot step at a negligible penalty cannot reach the rows; the greedy repair can
    p = knapsack_cover(0)
    kw = dict(time_limit=30.0, num_chains=4, max_rounds=1, steps_per_round=1,
              temperature=(5.0, 5.0), penalty=(1e-3, 1e-3), adaptive_penalty=False)
    assert not milp.solve(p, repair_steps=0, **kw).feasible
    r = milp.solve(p, repair_steps=40, **kw)
    assert r.feasible and milp.check_solution(p, r.x).feasible


def test_adaptive_penalty_reaches_feasibility_from_a_too_small_penalty():
    p = knapsack_cover(1)
    kw = dict(time_limit=30.0, num_chains=4, max_rounds=14, steps_per_round=50,
              penalty=(0.01, 0.01), repair_steps=0)
    assert not milp.solve(p, adaptive_penalty=False, **kw).feasible
    r = milp.solve(p, adaptive_penalty=True, **kw)
    assert r.feasible and milp.check_solution(p, r.x).feasible


def test_learned_components_need_integer_columns_and_exclude_each_other():
    from flax import nnx

    lp = milp.make_milp([-1.0, -2.0], [[1.0, 1.0]], None, [1.5], 0.0, 1.0)
    net = milp.BipartiteGNN(4, 1, rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match="no integer columns; a learned model needs some"):
        milp.solve(lp, model=net)
    with pytest.raises(ValueError, match="no integer columns; a learned proposal needs some"):
        milp.solve(lp, proposal=net)
    p = tiny_milp(0)
    with pytest.raises(ValueError, match="model, proposal"):
        milp.solve(p, model=net, proposal=net)
    with pytest.raises(ValueError, match="metropolis"):
        milp.solve(p, metropolis=True)
    with pytest.raises(TypeError, match="proposal"):
        milp.solve(p, proposal=lambda *a: None)
    with pytest.raises(ValueError, match="repair_steps"):
        milp.solve(p, repair_steps=-1)


@pytest.mark.parametrize("metropolis", [False, True])
def test_learned_proposal_runs_the_learned_sampler(metropolis):
    proposal_mod = pytest.importorskip("jaxlib_ext.samplers.milp.proposal")
    from flax import nnx

    p = milp.set_cover(2, n_rows=15, n_cols=30)
    net = proposal_mod.LearnedProposal(8, 1, rngs=nnx.Rngs(0))
    r = milp.solve(p, proposal=net, metropolis=metropolis, time_limit=60.0, num_chains=4,
                   max_rounds=1, steps_per_round=25)
    assert r.rule == ("langevin-learned-mh" if metropolis else "langevin-learned")
    assert r.feasible and milp.check_solution(p, r.x).feasible
