"""Discrete Langevin samplers: exact invariance of the MH version, proposal formulas, general
integers, batching under jit/vmap."""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxlib_ext.samplers import milp
from tests.samplers._markov import assert_boltzmann_invariant


def _small_binary(n=7, seed=0):
    rng = np.random.default_rng(seed)
    A = rng.integers(-1, 3, size=(3, n)).astype(float)
    return milp.make_milp(rng.normal(size=n), A, row_upper=np.full(3, 2.0), upper=1.0,
                          integrality=np.ones(n, bool))


@pytest.mark.parametrize("n, window, bounds", [
    (7, 1, (0, 1)), pytest.param(4, 2, (0, 2), marks=pytest.mark.slow)])
def test_dmala_leaves_target_invariant(n, window, bounds):
    """pi K = pi for the full transition matrix of DLP + MH (D.1, D.2), to 1e-10."""
    with jax.enable_x64(True):
        lo, hi = bounds
        rng = np.random.default_rng(1)
        p = milp.make_milp(rng.normal(size=n), rng.integers(-1, 3, size=(2, n)).astype(float),
                           row_upper=[2.0, 3.0], lower=lo, upper=hi,
                           integrality=np.ones(n, bool))
        d = milp.energy_data(p, dtype=jnp.float64)
        tau, alpha, lam = 0.7, 0.6, 1.3
        states = jnp.asarray(list(itertools.product(range(lo, hi + 1), repeat=n)), jnp.float64)
        e_fn = lambda z: milp.energy(d, z, penalty=lam)  # noqa: E731
        E = jax.vmap(e_fn)(states)
        G = jax.vmap(jax.grad(e_fn))(states)

        def row(z, g, ez):
            def to(z2, g2, ez2):
                fwd = milp.proposal_log_prob(d, z, z2, g, tau, alpha, window)
                rev = milp.proposal_log_prob(d, z2, z, g2, tau, alpha, window)
                log_a = jnp.minimum(0.0, -(ez2 - ez) / tau + rev - fwd)
                return jnp.where(jnp.isfinite(fwd), jnp.exp(fwd + log_a), 0.0)
            return jax.vmap(to)(states, G, E)

        assert_boltzmann_invariant(jax.vmap(row)(states, G, E), E, tau)
        # the proposal is a proper distribution over the window (rows of q sum to 1)
        q_sum = jax.vmap(lambda z, g: jnp.sum(jnp.exp(jax.vmap(
            lambda z2: milp.proposal_log_prob(d, z, z2, g, tau, alpha, window))(states))))(
            states[:5], G[:5])
        np.testing.assert_allclose(np.asarray(q_sum), 1.0, atol=1e-12)


def test_dlp_binary_flip_probability_formula():
    p = _small_binary()
    d = milp.energy_data(p)
    z = jnp.asarray([0, 1, 0, 1, 1, 0, 0], jnp.float32)
    g = jnp.linspace(-2.0, 2.0, 7)
    tau, alpha = 0.5, 0.4
    logp = jax.nn.log_softmax(milp.dlp_logits(d, z, g, tau, alpha), -1)
    flip = jnp.where(z == 0, jnp.exp(logp[:, 2]), jnp.exp(logp[:, 0]))
    expect = jax.nn.sigmoid(-(g / (2 * tau)) * (1 - 2 * z) - 1 / (2 * alpha))
    np.testing.assert_allclose(np.asarray(flip), np.asarray(expect), rtol=1e-5)


def test_flip_rule_moves_about_k_at_low_temperature():
    p = milp.set_cover(0, n_rows=20, n_cols=40)
    d = milp.energy_data(p)
    z = jnp.zeros(40)
    g = jax.grad(lambda z: milp.energy(d, z, penalty=5.0))(z)
    gains = milp.coordinate_gains(d, z, penalty=5.0)
    logits, direction = milp.flip_logits(d, z, g, 1e-4, 3, gains)
    probs = np.asarray(jax.nn.sigmoid(logits))
    assert 3 <= (probs >= 0.5).sum() <= 8  # ties at the k-th gain may add a few
    assert (probs > 0.01).sum() <= 8
    assert np.all(np.asarray(direction) == 1.0)  # from all-zeros only upward moves exist


@pytest.mark.parametrize("rule", ["rld", pytest.param("dlp", marks=pytest.mark.slow), "dmala"])
def test_run_langevin_general_integers_stay_in_box(rule):
    p = milp.make_milp([1.0, -2.0, 0.5, -1.0], [[1.0, 1.0, 1.0, 1.0]], row_upper=[7.0],
                       lower=[-2, 0, 1, 0], upper=[3, 4, 5, 2], integrality=np.ones(4, bool))
    d = milp.energy_data(p)
    temps, pens = milp.annealing_schedule(60, (1.0, 0.05), (1.0, 5.0))
    z0 = jnp.tile(d.lower, (5, 1))
    state, info = milp.run_langevin(jax.random.key(0), d, z0, temperatures=temps,
                                    penalties=pens, rule=rule, window=2, step_size=0.5)
    z = np.asarray(state.z)
    assert z.shape == (5, 4) and info.energy.shape == (5, 60)
    assert np.all(z == np.round(z))
    assert np.all(z >= np.asarray(d.lower)) and np.all(z <= np.asarray(d.upper))
    assert np.isfinite(np.asarray(state.best_objective)).any()
    assert np.all(np.asarray(info.accepted) <= 1.0)


def test_dmala_reaches_low_energy_and_rld_finds_optimum_tiny():
    p = _small_binary(n=8, seed=3)
    opt = milp.solve_highs(p).objective
    d = milp.energy_data(p)
    temps, pens = milp.annealing_schedule(300, (0.5, 0.01), (1.0, 10.0))
    state, _ = milp.run_langevin(jax.random.key(1), d, jnp.zeros((8, 8)), temperatures=temps,
                                 penalties=pens, rule="rld", num_flips=2)
    best = float(np.min(np.asarray(state.best_objective))) * float(d.obj_scale)
    assert best == pytest.approx(opt, abs=1e-4)


def test_kernel_and_schedule_argument_checks():
    with pytest.raises(ValueError, match="rule"):
        milp.build_kernel("gibbs")
    with pytest.raises(ValueError, match="step_size"):
        milp.build_kernel("dlp", step_size=0.0)
    with pytest.raises(ValueError, match="bias_fn"):
        milp.build_kernel("dlp", bias_fn=lambda *a: 0.0)
    with pytest.raises(ValueError, match="num_steps"):
        milp.annealing_schedule(0)
    with pytest.raises(ValueError, match="temperature"):
        milp.annealing_schedule(5, temperature=(1.0, -1.0))
    d = milp.energy_data(_small_binary())
    t, pn = milp.annealing_schedule(5)
    with pytest.raises(ValueError, match="z0"):
        milp.run_langevin(jax.random.key(0), d, jnp.zeros((2, 3)), temperatures=t, penalties=pn)
    with pytest.raises(ValueError, match="cost"):
        milp.run_langevin(jax.random.key(0), d, jnp.zeros((2, 7)), temperatures=t, penalties=pn,
                          cost=jnp.zeros((3, 7)))


def test_kernel_is_jittable_step():
    p = _small_binary()
    d = milp.energy_data(p)
    kernel = jax.jit(milp.build_kernel("dmala", step_size=0.5))
    state = milp.init(d, jnp.zeros(7))
    for k in jax.random.split(jax.random.key(0), 5):
        state, info = kernel(k, state, d, 0.0, 0.0, 0.5, 2.0)
    assert state.z.shape == (7,) and info.accepted.shape == ()


@pytest.mark.slow
def test_dmala_visit_frequencies_match_target():
    """Empirical visit frequencies of DMALA chains match pi (TV < 0.02 after 1e5 steps)."""
    p = _small_binary(n=5, seed=4)
    d = milp.energy_data(p)
    tau, lam, steps, chains = 0.8, 1.5, 25_000, 4
    kernel = milp.build_kernel("dmala", step_size=0.8)

    def chain(key):
        def body(state, k):
            state, _ = kernel(k, state, d, 0.0, 0.0, tau, lam)
            return state, state.z
        state = milp.init(d, jnp.zeros(5), penalty=lam)
        return jax.lax.scan(body, state, jax.random.split(key, steps))[1]

    zs = np.asarray(jax.jit(jax.vmap(chain))(jax.random.split(jax.random.key(0), chains)))
    codes = (zs.reshape(-1, 5) @ (2 ** np.arange(5))).astype(int)
    freq = np.bincount(codes, minlength=32) / codes.size
    states = jnp.asarray([[(c >> i) & 1 for i in range(5)] for c in range(32)], jnp.float32)
    E = np.asarray(jax.vmap(lambda z: milp.energy(d, z, penalty=lam))(states), np.float64)
    pi = np.exp(-(E - E.min()) / tau)
    pi /= pi.sum()
    assert 0.5 * np.abs(freq - pi).sum() < 0.02
