"""SOSMC and its baselines: the frozen-parameter oracles of both variants, the MMLE toy, vmap
over seeds, the problems' exact losses, bad arguments and the NaN stop."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from jaxlib_ext.samplers import smc
from jaxlib_ext.samplers.base import SamplingAlgorithm
from jaxlib_ext.samplers.smc.sosmc import build_kernel
from jaxlib_ext.samplers.smc.sosmc import init as sosmc_init


def _std_normal(theta, x):
    return 0.5 * jnp.sum(x ** 2) + 0.0 * theta


# the increment vanishes whatever the move: MALA (the default) is the representative
@pytest.mark.parametrize(
    "move", ["mala", *(pytest.param(m, marks=pytest.mark.slow) for m in ("rwm", "hmc"))]
)
def test_frozen_params_invariant_variant_keeps_weights_exactly_uniform(move):
    """lr = 0: the increment (W.3) is exactly 0, so the weights never move and never
    trigger a resampling."""
    p = smc.gaussian_mmle()
    n = 64
    alg = smc.sosmc(p.potential, optax.sgd(0.0), num_particles=n, move=move)
    state = alg.init((p.params0, p.sample_initial(jax.random.key(0), n)), jax.random.key(1))
    final, infos, _, _ = smc.run(jax.random.key(2), alg, state, 25)
    lw = final.log_weights
    assert bool(jnp.all(lw == lw[0]))
    w = jax.nn.softmax(lw)
    assert bool(jnp.all(w == w[0]))
    assert not bool(infos.resampled.any())
    assert float(final.params) == float(p.params0)
    assert int(final.step) == 25


def test_frozen_params_ula_variant_oracle():
    """N(0, I) in d=2, h=0.5, 20000 particles from exact draws, lr=0, no resampling
    (threshold 1e-6). ULA's invariant law is N(0, 1/(1 - h/2)) = N(0, 4/3): after 40 steps the
    unweighted variance is within 0.05 of 4/3 (MC std about 0.013), while the weights of (W.4)
    keep the weighted mean within 0.03 of 0 and the weighted variance within 0.05 of 1 (after
    one step and after 40; effective sample size about 17000, MC std about 0.008 and 0.011)."""
    n, h = 20000, 0.5
    x0 = jax.random.normal(jax.random.key(0), (n, 2))
    alg = smc.sosmc(_std_normal, optax.sgd(0.0), num_particles=n, variant="ula", step_size=h,
                    resample_threshold=1e-6)
    state = alg.init((jnp.zeros(()), x0))

    def moments(st):
        w = jax.nn.softmax(st.log_weights)
        m = w @ st.particles
        return m, w @ (st.particles - m) ** 2

    one, _ = alg.step(jax.random.key(1), state)
    final, infos, _, _ = smc.run(jax.random.key(2), alg, state, 40)
    for st in (one, final):
        m, v = moments(st)
        np.testing.assert_allclose(np.asarray(m), 0.0, atol=0.03)
        np.testing.assert_allclose(np.asarray(v), 1.0, atol=0.05)
    np.testing.assert_allclose(np.asarray(final.particles.var(0)), 1 / (1 - h / 2), atol=0.05)
    assert not bool(infos.resampled.any())
    assert float(infos.step_size[-1]) == h  # adapt_factor defaults to 1 for ULA


# the ULA variant has its own oracle above: here a method sweep
@pytest.mark.parametrize("variant", ["invariant", pytest.param("ula", marks=pytest.mark.slow)])
def test_mmle_toy_converges_to_mean_of_y(variant):
    """theta -> theta* = mean(y) within 1e-2 (fixed seeds; 500 particles, h = 0.1 fixed, SGD
    with the learning rate decaying linearly 0.01 -> 0.001 over 1500 steps; over 4 seeds the
    final error was at most 0.006)."""
    p = smc.gaussian_mmle()
    n = 500
    lr = optax.linear_schedule(0.01, 0.001, 1500)
    alg = smc.sosmc(p.potential, optax.sgd(lr), num_particles=n, variant=variant,
                    adapt_factor=1.0)
    state = alg.init((p.params0, p.sample_initial(jax.random.key(1), n)))
    final, infos, params, _ = jax.jit(lambda k, s: smc.run(k, alg, s, 1500))(
        jax.random.key(10), state)
    star = float(p.extra["theta_star"])
    assert abs(float(final.params) - star) < 1e-2
    assert abs(float(params[-300:].mean()) - star) < 1e-2
    assert bool(infos.finite.all())
    assert 0 < float(infos.ess.min()) <= n


@pytest.mark.parametrize("make", ["impdiff", "soul"])
def test_baselines_run_in_the_same_api(make):
    p = smc.gaussian_mmle()
    n = 100
    if make == "impdiff":
        alg = smc.impdiff(p.potential, optax.sgd(0.01), num_particles=n, step_size=0.1)
        steps = 1500
    else:
        alg = smc.soul(p.potential, optax.sgd(0.01), num_chains=n, step_size=0.1,
                       num_inner_steps=10)
        steps = 300
    state = alg.init((p.params0, p.sample_initial(jax.random.key(1), n)))
    final, infos, _, _ = smc.run(jax.random.key(2), alg, state, steps)
    assert isinstance(infos, smc.SOSMCInfo) and infos.ess.shape == (steps,)
    # ULA's bias at h=0.1 shifts the optimum slightly; tolerance 0.05
    assert abs(float(final.params) - float(p.extra["theta_star"])) < 0.05
    assert bool(jnp.all(final.log_weights == final.log_weights[0]))


def test_vmap_over_seeds_matches_single_runs():
    p = smc.gaussian_mmle()
    n = 32
    alg = smc.sosmc(p.potential, optax.adam(0.05), num_particles=n)

    def one(key):
        k0, k1 = jax.random.split(key)
        st = alg.init((p.params0, p.sample_initial(k0, n)))
        out = smc.run(k1, alg, st, 50, objective_fn=lambda th, x, w: p.loss(th))
        return out.state.params, out.objective

    keys = jax.random.split(jax.random.key(0), 3)
    th, obj = jax.jit(jax.vmap(one))(keys)
    assert th.shape == (3,) and obj.shape == (3, 50)
    th1, obj1 = one(keys[1])
    np.testing.assert_allclose(float(th[1]), float(th1), rtol=1e-5)
    np.testing.assert_allclose(np.asarray(obj[1]), np.asarray(obj1), rtol=1e-5)


def test_ppca_loss_optimum_and_fisher_identity():
    """The closed-form PPCA optimum equals the loss at Tipping & Bishop's W*, psi*; and the
    default gradient (G.1) from 2000 exact posterior draws matches n * grad loss (Fisher's
    identity) to within 5% of its norm."""
    p = smc.ppca_mmle()
    y = np.asarray(p.extra["y"], np.float64)
    n, d = y.shape
    ev, evec = np.linalg.eigh(np.cov(y.T, bias=True))
    ev, evec = ev[::-1], evec[:, ::-1]
    psi = p.extra["psi_star"]
    w_star = evec[:, :2] * np.sqrt(ev[:2] - psi)
    star = {"W": jnp.asarray(w_star, jnp.float32), "mu": jnp.zeros(d),
            "log_psi": jnp.asarray(np.log(psi), jnp.float32)}
    assert float(p.loss(star)) == pytest.approx(p.optimum, abs=1e-3)
    assert float(p.loss(p.params0)) > p.optimum + 0.5
    z = p.sample_initial(jax.random.key(0), 2000)
    g = smc.weighted_potential_grad(p.potential)(p.params0, z, jnp.full(2000, 1 / 2000), None)
    g_true = jax.grad(p.loss)(p.params0)
    gv = jnp.concatenate([a.ravel() for a in jax.tree.leaves(g)]) / n
    tv = jnp.concatenate([a.ravel() for a in jax.tree.leaves(g_true)])
    assert float(jnp.linalg.norm(gv - tv)) < 0.05 * float(jnp.linalg.norm(tv))


def test_mixture_reward_problem_improves():
    """SOSMC on the 2-D mixture with the hard reward raises J = E[r] - lam KL (loss = -J)."""
    p = smc.mixture2d_reward("hard")
    n = 256
    alg = smc.sosmc(p.potential, optax.adam(0.03), num_particles=n, step_size=p.step_size,
                    step_size_bounds=p.step_size_bounds, objective_grad=p.objective_grad)
    state = alg.init((p.params0, p.sample_initial(jax.random.key(0), n)))
    final, infos, _, _ = smc.run(jax.random.key(1), alg, state, 200)
    assert float(p.loss(final.params)) < float(p.loss(p.params0)) - 0.05
    assert bool(infos.finite.all())


def test_module_level_init_and_kernel_make_the_algorithm():
    """``sosmc`` is ``SamplingAlgorithm(init, build_kernel(...))``: the same state and the same
    step; the info holds diagnostics only."""
    p = smc.gaussian_mmle()
    n, opt, kw = 16, optax.adam(0.05), dict(move="rwm", resampling="systematic")
    alg = smc.sosmc(p.potential, opt, num_particles=n, **kw)
    assert isinstance(alg, SamplingAlgorithm)
    x0 = p.sample_initial(jax.random.key(0), n)
    state = alg.init((p.params0, x0))
    chex.assert_trees_all_equal(sosmc_init((p.params0, x0), opt, 0.1), state)
    kernel = build_kernel(p.potential, opt, **kw)
    chex.assert_trees_all_equal(kernel(jax.random.key(1), state),
                                alg.step(jax.random.key(1), state))
    assert smc.SOSMCInfo._fields == ("ess", "step_size", "resampled", "acceptance_rate",
                                     "log_z_increment", "finite")


# --------------------------------------------------------------------------- bad inputs


@pytest.mark.parametrize("name", ["resample_threshold", "adapt_threshold"])
@pytest.mark.parametrize("value", [0.0, -0.1, 1.5])
def test_thresholds_outside_unit_interval_raise(name, value):
    with pytest.raises(ValueError, match=name):
        smc.sosmc(_std_normal, optax.sgd(0.1), num_particles=8, **{name: value})


def test_bad_arguments_raise():
    opt = optax.sgd(0.1)
    for n in (1, 0):
        with pytest.raises(ValueError, match="num_particles"):
            smc.sosmc(_std_normal, opt, num_particles=n)
    with pytest.raises(TypeError, match="num_particles"):
        smc.sosmc(_std_normal, opt, num_particles=4.0)
    with pytest.raises(ValueError, match="num_particles"):
        smc.impdiff(_std_normal, opt, num_particles=1)
    with pytest.raises(ValueError, match="variant"):
        smc.sosmc(_std_normal, opt, num_particles=4, variant="mcmc")
    with pytest.raises(ValueError, match="move"):
        smc.sosmc(_std_normal, opt, num_particles=4, move="ula")
    with pytest.raises(ValueError, match="step_size"):
        smc.sosmc(_std_normal, opt, num_particles=4, step_size=2.0)
    with pytest.raises(ValueError, match="adapt_factor"):
        smc.sosmc(_std_normal, opt, num_particles=4, adapt_factor=0.5)
    with pytest.raises(ValueError, match="resampling"):
        smc.sosmc(_std_normal, opt, num_particles=4, resampling="residual")
    with pytest.raises(TypeError, match="optimizer"):
        smc.sosmc(_std_normal, "adam", num_particles=4)
    with pytest.raises(ValueError, match="num_inner_steps"):
        smc.soul(_std_normal, opt, num_inner_steps=0)
    alg = smc.sosmc(_std_normal, opt, num_particles=4)
    with pytest.raises(ValueError, match="particles"):
        alg.init((jnp.zeros(()), jnp.zeros((5, 2))))
    with pytest.raises(ValueError, match="particles"):
        alg.init((jnp.zeros(()), jnp.full((4, 2), jnp.nan)))
    with pytest.raises(TypeError, match="position"):
        alg.init(jnp.zeros(()), jnp.zeros((4, 2)))
    state = alg.init((jnp.zeros(()), jnp.zeros((4, 2))))
    with pytest.raises(ValueError, match="num_steps"):
        smc.run(jax.random.key(0), alg, state, 0)
    with pytest.raises(ValueError, match="log_weights"):
        smc.run(jax.random.key(0), alg, state._replace(log_weights=jnp.full(4, jnp.nan)), 3)
    with pytest.raises(TypeError, match="state"):
        smc.run(jax.random.key(0), alg, jnp.zeros(3), 3)


def test_run_stops_at_the_first_non_finite_step():
    """SGD with lr 3 on the toy (curvature n/2 = 10) diverges geometrically to inf/NaN: run
    raises NonFiniteError with the step number, keeps the last finite state, and under jit the
    same step is the first ``finite == False`` of the infos."""
    p = smc.gaussian_mmle()
    alg = smc.sosmc(p.potential, optax.sgd(3.0), num_particles=16)
    state = alg.init((p.params0, p.sample_initial(jax.random.key(0), 16)))
    with pytest.raises(smc.NonFiniteError, match="outer step") as err:
        smc.run(jax.random.key(1), alg, state, 200)
    e = err.value
    assert 0 < e.step < 200
    assert bool(jnp.isfinite(e.state.params)) and int(e.state.step) == e.step
    assert not bool(e.infos.finite[e.step]) and bool(e.infos.finite[: e.step].all())
    assert f"step {e.step}" in str(e)
    final, infos, params, _ = jax.jit(lambda k, s: smc.run(k, alg, s, 200))(
        jax.random.key(1), state)
    assert int(jnp.argmin(infos.finite)) == e.step
    assert float(final.params) == float(e.state.params) and int(final.step) == e.step
    assert bool(jnp.all(params[e.step:] == final.params))
