"""MILP type, validation, MPS reading and the instance generators."""

import numpy as np
import pytest
import scipy.sparse as sp

from jaxlib_ext.samplers import milp


def test_make_milp_defaults_and_objective():
    p = milp.make_milp([1.0, -2.0], [[1.0, 1.0]], row_upper=[1.0], upper=1.0,
                       integrality=[True, False], offset=3.0)
    assert p.num_vars == 2 and p.num_rows == 1
    assert np.all(p.lower == 0) and np.isneginf(p.row_lower[0])
    assert p.objective([1.0, 0.5]) == pytest.approx(1.0 - 1.0 + 3.0)
    assert p.integer_index.tolist() == [0] and p.continuous_index.tolist() == [1]


@pytest.mark.parametrize("kwargs, match", [
    (dict(c=[1.0, 2.0], A=[[1.0, 1.0, 1.0]]), "A: expected 2 columns"),
    (dict(c=[[1.0]], A=[[1.0]]), "c: expected a 1-D"),
    (dict(c=[], A=np.zeros((0, 0))), "empty problem"),
    (dict(c=[np.inf], A=[[1.0]]), "c: objective coefficients must be finite"),
    (dict(c=[1.0], A=[[np.nan]]), "A: coefficients must be finite"),
    (dict(c=[1.0], A=[[1.0]], row_lower=[2.0], row_upper=[1.0]), "row_lower > row_upper"),
    (dict(c=[1.0], A=[[1.0]], lower=[2.0], upper=[1.0]), "lower > upper"),
    (dict(c=[1.0], A=[[1.0]], row_upper=[1.0, 2.0]), r"row_upper: expected shape \(1,\)"),
    (dict(c=[1.0], A=[[1.0]], lower=0.2, upper=0.8, integrality=[True]), "no integer value"),
    (dict(c=[1.0], A=[[1.0]], upper=[np.nan]), "upper: contains NaN"),
    (dict(c=[1.0], A=[[1.0]], integrality=[True, False]), "integrality: expected shape"),
])
def test_make_milp_rejects_bad_input(kwargs, match):
    with pytest.raises(ValueError, match=match):
        milp.make_milp(**kwargs)


def test_make_milp_sense_check():
    with pytest.raises(ValueError, match="sense"):
        milp.make_milp([1.0], [[1.0]], sense=0)


def test_check_solution_measures_rows_bounds_integrality():
    p = milp.make_milp([1.0, 1.0], sp.csr_array([[1.0, 1.0]]), row_lower=[1.0], upper=1.0,
                       integrality=[True, False])
    assert milp.check_solution(p, [1.0, 0.0]).feasible
    chk = milp.check_solution(p, [0.0, 0.5])
    assert not chk.feasible and chk.max_violation == pytest.approx(0.5)
    chk = milp.check_solution(p, [0.5, 0.5])
    assert not chk.feasible and chk.integrality_violation == pytest.approx(0.5)
    assert not milp.check_solution(p, [1.0, 1.5]).feasible  # bound
    assert not milp.check_solution(p, [np.nan, 0.0]).feasible


def test_read_mps_bundled_instances():
    p = milp.read_mps(milp.miplib_path("p0033"))
    assert (p.num_vars, p.num_rows, int(p.integrality.sum())) == (33, 16, 33)
    assert p.sense == 1 and np.all(p.upper == 1) and np.all(p.lower == 0)
    q = milp.read_mps(milp.miplib_path("p0201"))
    assert (q.num_vars, q.num_rows) == (201, 133)
    with pytest.raises(ValueError, match="no bundled MIPLIB"):
        milp.miplib_path("p9999")


def test_read_mps_round_trip_with_highs_optimum():
    r = milp.solve_highs(milp.read_mps(milp.miplib_path("p0033")), time_limit=30)
    assert r.status == "optimal" and r.objective == pytest.approx(3089.0)


def test_read_mps_bad_files(tmp_path):
    with pytest.raises(FileNotFoundError, match="no such file"):
        milp.read_mps(tmp_path / "missing.mps")
    bad = tmp_path / "bad.mps"
    bad.write_text("this is not\nan mps file at all\n")
    with pytest.raises(ValueError, match="malformed"):
        milp.read_mps(bad)
    empty = tmp_path / "empty.mps"
    empty.write_text("NAME empty\nROWS\n N obj\nCOLUMNS\nRHS\nBOUNDS\nENDATA\n")
    with pytest.raises(ValueError, match="no columns"):
        milp.read_mps(empty)


def test_read_mps_maximisation_sense(tmp_path):
    f = tmp_path / "max.lp"
    f.write_text("Maximize\n obj: 3 x + 2 y\nSubject To\n c1: x + y <= 4.5\nBounds\n"
                 " 0 <= x <= 3\n 0 <= y <= 10\nGeneral\n x\nEnd\n")
    p = milp.read_mps(f)
    assert p.sense == -1 and p.integrality.tolist() == [True, False]
    r = milp.solve(p, time_limit=20, max_rounds=3)
    assert r.feasible and r.objective == pytest.approx(3 * 3 + 2 * 1.5)


@pytest.mark.parametrize("name, kwargs", [
    ("setcover", dict(n_rows=30, n_cols=60)),
    ("cauction", dict(n_items=15, n_bids=40)),
    ("facility", dict(n_customers=8, n_facilities=5)),
    ("indset", dict(n_nodes=40)),
])
def test_generators_seeded_reproducible_and_solvable(name, kwargs):
    gen = milp.FAMILIES[name]
    a, b, c = gen(3, **kwargs), gen(3, **kwargs), gen(4, **kwargs)
    assert np.array_equal(a.c, b.c) and (a.A != b.A).nnz == 0
    assert a.A.shape != c.A.shape or not np.array_equal(a.c, c.c) or (a.A != c.A).nnz > 0
    r = milp.solve_highs(a, time_limit=30)
    assert r.status == "optimal" and milp.check_solution(a, r.x).feasible


def test_generator_structure():
    sc = milp.set_cover(0, n_rows=20, n_cols=40)
    assert np.all(sc.A.sum(axis=1) >= 2) and np.all(sc.A.sum(axis=0) >= 1)
    fl = milp.capacitated_facility_location(0, n_customers=6, n_facilities=4)
    assert fl.num_vars == 4 + 24 and int(fl.integrality.sum()) == 4
    ind = milp.independent_set(0, n_nodes=30, affinity=3)
    assert ind.sense == -1 and np.all(ind.row_upper == 1)
    with pytest.raises(ValueError, match="n_rows"):
        milp.set_cover(0, n_rows=0)
    with pytest.raises(ValueError, match="affinity"):
        milp.independent_set(0, n_nodes=4, affinity=4)
