"""The penalty energy (E.1)/(E.2) and the LP completion."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxlib_ext.samplers import milp


def _mixed(seed=0, n_int=6, n_cont=2, m=5):
    rng = np.random.default_rng(seed)
    A = rng.integers(-2, 4, size=(m, n_int + n_cont)).astype(float)
    c = rng.integers(-5, 6, size=n_int + n_cont).astype(float)
    integ = np.r_[np.ones(n_int, bool), np.zeros(n_cont, bool)]
    return milp.make_milp(c, A, row_lower=-rng.integers(1, 4, m), row_upper=rng.integers(2, 6, m),
                          lower=0.0, upper=np.r_[np.ones(n_int), np.full(n_cont, 3.0)],
                          integrality=integ)


def test_energy_equals_objective_on_feasible_points():
    with jax.enable_x64(True):
        for seed in range(4):
            p = _mixed(seed)
            d = milp.energy_data(p, normalize=False, dtype=jnp.float64)
            Z = np.array(list(np.ndindex(*(2,) * 6)), float)
            comp = milp.complete(p, Z)
            assert comp.feasible.any()
            for i in np.flatnonzero(comp.feasible):
                shift, const = milp.continuous_shift(p, comp.x[i, p.continuous_index])
                e = milp.energy(d, jnp.asarray(Z[i]), shift, const, penalty=7.0)
                assert float(e) == pytest.approx(p.objective(comp.x[i]), abs=1e-8)


def test_penalty_positive_exactly_on_violated_rows():
    p = milp.set_cover(0, n_rows=12, n_cols=20)
    d = milp.energy_data(p, normalize=True)
    rng = np.random.default_rng(0)
    for _ in range(20):
        z = (rng.random(20) < 0.2).astype(np.float32)
        v = np.asarray(milp.violation(d, jnp.asarray(z)))
        ax = p.A @ z
        violated = (ax < p.row_lower - 1e-9) | (ax > p.row_upper + 1e-9)
        assert np.array_equal(v > 0, violated)
        _, pen = milp.energy_terms(d, jnp.asarray(z))
        assert (float(pen) > 0) == violated.any()


@pytest.mark.parametrize("power", [1, 2])
def test_energy_gradient_matches_finite_differences(power):
    with jax.enable_x64(True):
        p = _mixed(3)
        d = milp.energy_data(p, dtype=jnp.float64)
        rng = np.random.default_rng(1)
        shift = rng.normal(size=p.num_rows)
        f = lambda z: milp.energy(d, z, shift, 0.3, penalty=2.5, power=power)  # noqa: E731
        for _ in range(5):
            z = jnp.asarray(rng.random(6))  # a point of the relaxation, off the kinks a.s.
            g = np.asarray(jax.grad(f)(z))
            eps = 1e-6
            fd = [(f(z + eps * e) - f(z - eps * e)) / (2 * eps) for e in np.eye(6)]
            np.testing.assert_allclose(g, np.asarray(fd), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("with_cuts", [False, True])
def test_coordinate_gains_are_exact_differences(with_cuts):
    with jax.enable_x64(True):
        p = milp.read_mps(milp.miplib_path("p0033"))
        d = milp.energy_data(p, dtype=jnp.float64)
        if with_cuts:  # the cut model of (E.2): max_k (a_k + h_k^T z)
            rng = np.random.default_rng(5)
            d = milp.with_cuts(d, rng.normal(size=(6, 33)) * 50, rng.normal(size=6) * 100)
            assert float(milp.cut_value(d, jnp.zeros(33))) == pytest.approx(
                float(jnp.max(d.cut_a)))
        z = jnp.asarray((np.random.default_rng(2).random(33) < 0.5).astype(float))
        up, down = milp.coordinate_gains(d, z, penalty=3.0)
        e0 = milp.energy(d, z, penalty=3.0)
        for j in range(33):
            ej = jnp.zeros(33).at[j].set(1.0)
            assert float(up[j]) == pytest.approx(float(e0 - milp.energy(d, z + ej, penalty=3.0)))
            assert float(down[j]) == pytest.approx(float(e0 - milp.energy(d, z - ej, penalty=3.0)))


def test_lp_completion_exact_and_elastic():
    p = milp.capacitated_facility_location(1, n_customers=6, n_facilities=4)
    opt = milp.solve_highs(p)
    Z = np.stack([opt.x[:4], np.zeros(4), np.ones(4), opt.x[:4]])
    comp = milp.complete(p, Z)
    assert comp.feasible.tolist() == [True, False, True, True]
    assert comp.objective[0] == pytest.approx(opt.objective, rel=1e-9)
    assert np.isnan(comp.objective[1]) and comp.status[1] == "infeasible"
    for i in np.flatnonzero(comp.feasible):
        assert milp.check_solution(p, comp.x[i]).feasible
    el = milp.complete(p, Z, penalty=5.0)
    assert all(s == "optimal" for s in el.status)  # the elastic LP is always solvable
    assert el.value[0] == pytest.approx(opt.objective, rel=1e-9)
    assert el.value[1] > el.value[0]
    with pytest.raises(ValueError, match="Z: expected shape"):
        milp.complete(p, np.zeros((2, 5)))
    with pytest.raises(ValueError, match="penalty"):
        milp.complete(p, Z, penalty=0.0)


def test_lp_value_subgradient_inequality():
    # the elastic LP value is convex in z; h = -A_z^T pi is a subgradient:
    # v(z1) >= v(z0) + h(z0)^T (z1 - z0) for every pair of assignments
    p = milp.capacitated_facility_location(1, n_customers=6, n_facilities=3, ratio=1.2)
    Z = np.array(list(np.ndindex(2, 2, 2)), float)
    comp = milp.complete(p, Z, penalty=10.0)
    cz = p.c[p.integer_index]
    lp = comp.value - Z @ cz
    for a in range(len(Z)):
        for b in range(len(Z)):
            bound = lp[a] + comp.value_grad[a] @ (Z[b] - Z[a])
            assert lp[b] >= bound - 1e-7 * max(1.0, abs(lp[b]))
    assert np.abs(comp.value_grad).max() > 0


def test_energy_data_rejects_unbounded_integers_and_pure_lp():
    lp = milp.make_milp([1.0], [[1.0]], row_lower=[1.0])
    with pytest.raises(ValueError, match="no integer columns"):
        milp.energy_data(lp)
    unb = milp.make_milp([1.0], [[1.0]], row_lower=[1.0], integrality=[True])
    with pytest.raises(ValueError, match="finite bounds"):
        milp.energy_data(unb)
    d = milp.energy_data(milp.set_cover(0, n_rows=5, n_cols=8))
    with pytest.raises(ValueError, match="cut_h"):
        milp.with_cuts(d, np.zeros((2, 9)), np.zeros(2))
