"""End-to-end: the tiny-MILP oracle (enumeration + LP completion = scipy.optimize.milp = solve),
certified solutions, bad input."""

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


@pytest.mark.parametrize("method, name", [  # instances beyond the first two are sweeps
    ("rld", "p0033"), pytest.param("rld", "facility", marks=pytest.mark.slow), ("rld", "setcover"),
    pytest.param("dlp", "facility", marks=pytest.mark.slow),
    pytest.param("dmala", "setcover", marks=pytest.mark.slow)])
def test_every_returned_solution_is_certified(method, name):
    for p in [CERTIFY[name]()]:
        r = milp.solve(p, time_limit=60.0, num_chains=4, max_rounds=2, method=method,
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
    assert r.feasible and r.status == "optimal" and r.method == "highs-lp"
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
    with pytest.raises(ValueError, match="method"):
        milp.solve(p, method="sa")


def test_p0033_reaches_optimum_within_budget():
    p = milp.read_mps(milp.miplib_path("p0033"))
    r = milp.solve(p, time_limit=120.0, num_chains=16, max_rounds=6, seed=0)
    assert r.feasible and r.objective == pytest.approx(3089.0)
