"""The energy prior's kernels (arXiv 2605.15487) as BlackJAX-style samplers: the factories of
the shared kernel test (``tests/samplers/test_kernels.py``), MALA's exact invariance on a
Gaussian, the shared MALA step (:mod:`jaxlib_ext.samplers.mala`) against the formulas and
against SMC's MALA move, and the drivers against stepping the algorithms by hand."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxlib_ext.samplers import energy as en
from jaxlib_ext.samplers import mala as shared
from jaxlib_ext.samplers.base import scan_kernel
from jaxlib_ext.samplers.energy import adaptive, dps, langevin, levels, pc
from jaxlib_ext.samplers.smc import moves

# ----------------------------------------------------------------------------- tiny targets

D, CHAINS = 5, 3  # one chain's state of the shared test: a batch of CHAINS rows
MASK = jnp.array([1.0, 1.0, 0.0, 1.0, 0.0])


def _gaussian():
    k1, k2 = jax.random.split(jax.random.key(0))
    a = jax.random.normal(k1, (D, D))
    return 0.5 + 0.3 * jax.random.normal(k2, (D,)), a @ a.T / D + 0.1 * jnp.eye(D)


def _problem():
    """A masked measurement of a 5-d Gaussian prior, ``CHAINS`` rows."""
    mu, c = _gaussian()
    y = MASK * (mu + 0.1 * jax.random.normal(jax.random.key(1), (CHAINS, D)))
    return en.gaussian_energy(mu, c), en.diagonal_problem(y, MASK, basis="pixel",
                                                          noise_std=0.1)


def _mala_target():
    """``E(x) = U*(x, 0.1 I)`` of the Gaussian prior, with a preconditioner that freezes one
    coordinate."""
    mu, c = _gaussian()
    u = en.gaussian_energy(mu, c)
    cov = en.Covariance(jnp.full((CHAINS, D), 0.1))

    def target_fn(x):
        e, g, _ = en.energy_and_grads(u, x, cov)
        return e, g

    precond = en.Covariance(jnp.broadcast_to(jnp.array([1.0, 0.5, 2.0, 0.0, 0.7]), (CHAINS, D)))
    return mu, target_fn, precond


def _mala_case(metropolis, **step):
    mu, target_fn, precond = _mala_target()
    algorithm = langevin.mala(target_fn, precond, metropolis=metropolis, **step)
    return algorithm, lambda k: algorithm.init(mu + jax.random.normal(k, (CHAINS, D)))


def _problem_case(make):
    u, prob = _problem()
    algorithm = make(u, prob)
    return algorithm, lambda k: algorithm.init(levels.initial_position(k, prob))


def mala_case():
    """MALA with MH, the state-dependent step (M.4)."""
    return _mala_case(True, snr=0.3)


def ula_case():
    """The unadjusted move, a fixed step."""
    return _mala_case(False, step_size=0.05)


def pc_mala_case():
    """PC-MALA, predictor first (the authors' order)."""
    return _problem_case(lambda u, p: pc.predictor_corrector(
        u, p, num_levels=4, corrector_steps=2, snr=0.2, metropolis=True))


def pc_corrector_first_case():
    """PC, corrector first (ours), clipped levels."""
    return _problem_case(lambda u, p: pc.predictor_corrector(
        u, p, num_levels=4, snr=0.2, order="corrector_first", levels="clipped"))


def adaptive_per_entry_case():
    return _problem_case(lambda u, p: adaptive.per_entry(u, p, inner_steps=2))


def adaptive_per_level_case():
    return _problem_case(lambda u, p: adaptive.per_level(u, p, num_steps=5))


def dps_case():
    mu, c = _gaussian()
    y = MASK * (mu + 0.1 * jax.random.normal(jax.random.key(1), (CHAINS, D)))
    algorithm = dps.diffusion_posterior_sampling(en.gaussian_energy(mu, c), lambda x: MASK * x,
                                                 y, image_shape=(D,), num_steps=4, zeta=0.3)
    return algorithm, lambda k: algorithm.init(dps.initial_position(k, (CHAINS, D)))


# ----------------------------------------------------------------------------- invariance


def test_mala_with_mh_keeps_a_gaussian_invariant_where_ula_is_biased():
    """Chains started at exact draws of ``N(m, C)`` stay distributed as ``N(m, C)`` under MALA
    with MH, at a step where ULA inflates the variance; fixed and state-dependent steps, one
    coordinate frozen by the preconditioner."""
    n, steps = 20000, 8
    m = jnp.array([0.3, -0.5, 1.0])
    c = jnp.array([[1.0, 0.6, 0.2], [0.6, 0.8, 0.1], [0.2, 0.1, 0.5]])
    prec = jnp.linalg.inv(c)

    def target_fn(x):
        r = x - m
        return 0.5 * jnp.sum(r * (r @ prec), axis=1), r @ prec

    precond = en.Covariance(jnp.broadcast_to(jnp.array([1.0, 0.5, 0.0]), (n, 3)))
    x0 = m + jax.random.normal(jax.random.key(0), (n, 3)) @ jnp.linalg.cholesky(c).T
    se_mean = jnp.sqrt(jnp.diag(c) / n)

    def run(metropolis, **step):
        algorithm = langevin.mala(target_fn, precond, metropolis=metropolis, **step)
        state, info = jax.jit(lambda k: scan_kernel(algorithm.step, k, algorithm.init(x0),
                                                    steps))(jax.random.key(1))
        return state.position, float(info.acceptance_rate.mean())

    for step in ({"step_size": 0.6}, {"snr": 0.5}):
        x, acc = run(True, **step)
        assert 0.3 < acc < 0.95, (step, acc)
        np.testing.assert_array_equal(x[:, 2], x0[:, 2])  # p = 0: frozen
        assert float(jnp.max(jnp.abs(x.mean(0) - m) / se_mean)) < 5.0, step
        # variances within ~5 standard errors (sqrt(2 / n) relative)
        ratio = jnp.var(x, axis=0) / jnp.diag(c)
        assert float(jnp.max(jnp.abs(ratio - 1.0))) < 5.0 * np.sqrt(2.0 / n), (step, ratio)
    xu, _ = run(False, step_size=0.6)
    assert float(jnp.max(jnp.var(xu, axis=0)[:2] / jnp.diag(c)[:2])) > 1.15


# ----------------------------------------------------------------------------- the shared step


def _formulas_kernel(key, state, target_fn, precond, h_of, temperature):
    """(M.1)-(M.3) of ``energy.langevin`` written out, with (M.2)'s NaN counted as -inf."""
    x, e0, g0 = state
    k_xi, k_u = jax.random.split(key)
    h = h_of(g0)
    hb = h[:, None, None, None]
    xi = jax.random.normal(k_xi, x.shape, x.dtype)
    prop = x - hb * precond.apply(g0) + jnp.sqrt(2.0 * temperature * hb) * precond.apply(xi, 0.5)
    e1, g1 = target_fn(prop)
    h1 = h_of(g1)
    p = precond.diag
    inv = jnp.where(p > 0, 1.0 / jnp.where(p > 0, p, 1.0), 0.0)
    r = jnp.sum(p > 0, axis=(1, 2, 3)).astype(x.dtype)

    def log_q(to, frm, g, hh):
        mean = frm - hh[:, None, None, None] * precond.apply(g)
        return -precond.quad(to - mean, inv) / (4.0 * temperature * hh) - 0.5 * r * jnp.log(hh)

    log_a = (e0 - e1) / temperature + log_q(x, prop, g1, h1) - log_q(prop, x, g0, h)
    log_a = jnp.where(jnp.isnan(log_a), -jnp.inf, log_a)
    acc = jnp.log(jax.random.uniform(k_u, (x.shape[0],), x.dtype)) < log_a
    a = acc[:, None, None, None]
    return (jnp.where(a, prop, x), jnp.where(acc, e1, e0), jnp.where(a, g1, g0)), acc


@pytest.mark.parametrize("basis", ["pixel", "fourier"])
def test_energy_mala_kernel_equals_the_formulas_bit_for_bit(basis):
    mu, c = jnp.full((3, 5, 1), 0.5), 0.05 * jnp.eye(15) + 0.02
    u = en.gaussian_energy(mu, c)
    cov = en.random_covariance(jax.random.key(0), (4, 3, 5, 1), sigma_min=0.1, sigma_max=2.0,
                               basis=basis, isotropic_prob=0.0)

    def target_fn(x):
        e, g, _ = en.energy_and_grads(u, x, cov)
        return e, g

    precond = cov.replace(jnp.where(cov.diag > 0.5, 0.0, cov.diag))  # some frozen entries
    x = mu + jax.random.normal(jax.random.key(1), (4, 3, 5, 1))
    state = langevin.init(x, target_fn)
    kernel = langevin.build_kernel(metropolis=True)
    for step, t in (({"snr": 0.4}, 0.7), ({"step_size": jnp.linspace(0.05, 0.4, 4)}, 1.0)):
        new, info = jax.jit(lambda k, s, step=step, t=t: kernel(
            k, s, target_fn, precond, temperature=t, **step))(jax.random.key(2), state)

        def h_of(g, step=step):
            if "snr" in step:
                return langevin.snr_step_size(g, precond, step["snr"])
            return step["step_size"]

        ref, acc = jax.jit(lambda k, s, h_of=h_of, t=t: _formulas_kernel(
            k, s, target_fn, precond, h_of, t))(jax.random.key(2), state)
        for a, b in zip(new, ref, strict=True):
            np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(info.is_accepted, acc)


def test_shared_pieces_reproduce_smc_mala_bit_for_bit():
    """SMC's MALA move (unpreconditioned, one particle) from the shared pieces."""
    def potential(theta, x):
        return 0.5 * jnp.sum((x - theta) ** 2 / jnp.array([1.0, 0.3, 2.0, 0.7])) + 0.1 * x[0] ** 4

    theta = jnp.array([0.2, -0.1, 0.5, 1.0])

    def from_pieces(key, x, h):
        k_prop, k_acc = jax.random.split(key)
        u = lambda v: potential(theta, v)
        u0, g0 = jax.value_and_grad(u)(x)
        prop = shared.langevin_proposal(k_prop, x, g0, h)
        u1, g1 = jax.value_and_grad(u)(prop)
        log_ratio = (u0 - u1 + shared.log_proposal_density(x, prop, g1, h, normalized=False)
                     - shared.log_proposal_density(prop, x, g0, h, normalized=False))
        new, accept, prob = shared.mh_accept(k_acc, log_ratio, x, prop)
        return new, moves.MoveInfo(prob, accept)

    xs = jax.random.normal(jax.random.key(3), (64, 4))
    keys = jax.random.split(jax.random.key(4), 64)
    for h in (0.05, 0.8):
        ref = jax.jit(jax.vmap(lambda k, x, h=h: moves.mala(k, potential, theta, x, h)))(
            keys, xs)
        out = jax.jit(jax.vmap(lambda k, x, h=h: from_pieces(k, x, h)))(keys, xs)
        jax.tree.map(np.testing.assert_array_equal, out, ref)
        assert 0 < int(ref[1].is_accepted.sum()) < 64


def test_shared_pieces_batch_over_chains():
    """A batch of chains (``step_size`` of the batch shape) equals the chains one by one."""
    x = jax.random.normal(jax.random.key(5), (6, 2, 3))
    g = jax.random.normal(jax.random.key(6), (6, 2, 3))
    h = jnp.linspace(0.1, 0.6, 6)
    key = jax.random.key(7)
    prop = shared.langevin_proposal(key, x, g, h, temperature=0.5)
    lq = shared.log_proposal_density(x, prop, g, h, temperature=0.5)
    xi = jax.random.normal(key, x.shape)
    for i in range(6):
        np.testing.assert_allclose(prop[i], x[i] - h[i] * g[i] + jnp.sqrt(h[i]) * xi[i],
                                   rtol=1e-6)
        one = shared.log_proposal_density(x[i], prop[i], g[i], h[i], temperature=0.5)
        np.testing.assert_allclose(lq[i], one, rtol=1e-6)
    # NaN is a rejection; the pytree of the state is selected leaf by leaf
    state, acc, prob = shared.mh_accept(key, jnp.array([0.0, jnp.nan, -jnp.inf]),
                                        (jnp.zeros((3, 2)), jnp.zeros(3)),
                                        (jnp.ones((3, 2)), jnp.ones(3)))
    np.testing.assert_array_equal(acc, [True, False, False])
    np.testing.assert_array_equal(prob, [1.0, 0.0, 0.0])
    np.testing.assert_array_equal(state[0][:, 0], [1.0, 0.0, 0.0])


# ----------------------------------------------------------------------------- drivers


def _by_hand(algorithm, state, keys):
    infos = []
    for k in keys:
        state, info = algorithm.step(k, state)
        infos.append(info)
    return state, jax.tree.map(lambda *a: jnp.stack(a), *infos)


@pytest.mark.parametrize("order,metropolis", [("predictor_first", True),
                                              ("corrector_first", False)])
def test_pc_sample_is_its_algorithm_stepped_by_hand(order, metropolis):
    u, prob = _problem()
    opts = dict(num_levels=3, corrector_steps=1, snr=0.2, metropolis=metropolis, order=order)
    res = jax.jit(lambda k: pc.sample(k, u, prob, **opts))(jax.random.key(8))
    algorithm = pc.predictor_corrector(u, prob, **opts)
    k0, key = jax.random.split(jax.random.key(8))
    keys = jax.random.split(key, 3)
    state = algorithm.init(levels.initial_position(k0, prob))
    last, infos = _by_hand(algorithm, state, keys if order == "predictor_first" else keys[:-1])
    if order == "corrector_first":
        _, info_last = algorithm.step(keys[-1], last)
        infos = jax.tree.map(lambda a, b: jnp.concatenate([a, b[None]]), infos, info_last)
    close = dict(rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(res.last, last.position, **close)
    np.testing.assert_allclose(res.denoised, infos.denoised[-1], **close)
    np.testing.assert_allclose(res.info.sigma, infos.sigma, **close)
    sigmas = pc.level_schedule(prob, num_levels=3, order=order)
    np.testing.assert_allclose(res.info.sigma, sigmas[1:] if order == "predictor_first"
                               else sigmas, rtol=1e-6)
    assert res.nfe == 3 * 2 + (order == "predictor_first")


@pytest.mark.parametrize("order", pc.ORDERS)
def test_pc_steps_past_the_last_level_stay_at_sigma_end(order):
    u, prob = _problem()
    algorithm = pc.predictor_corrector(u, prob, num_levels=2, sigma_end=0.05, snr=0.2,
                                       metropolis=True, order=order)
    state = algorithm.init(levels.initial_position(jax.random.key(9), prob))
    _, infos = _by_hand(algorithm, state, jax.random.split(jax.random.key(10), 5))
    np.testing.assert_allclose(infos.sigma[2:], 0.05, rtol=1e-6)
    assert jnp.all(jnp.isfinite(infos.denoised))


def test_adaptive_and_dps_samples_are_their_algorithms_stepped_by_hand():
    u, prob = _problem()
    k0, key = jax.random.split(jax.random.key(11))
    x0 = levels.initial_position(k0, prob)
    res = adaptive.sample_per_entry(jax.random.key(11), u, prob, num_updates=3, inner_steps=1)
    algorithm = adaptive.per_entry(u, prob, inner_steps=1)
    last, infos = _by_hand(algorithm, algorithm.init(x0), jax.random.split(key, 3))
    np.testing.assert_allclose(res.last.position, last.position, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(res.denoised, infos.denoised[-1], rtol=1e-5, atol=1e-6)

    res = adaptive.sample(jax.random.key(11), u, prob, num_steps=4)
    algorithm = adaptive.per_level(u, prob, num_steps=4)
    keys = jax.random.split(key, 4)
    last, _ = _by_hand(algorithm, algorithm.init(x0), keys[:-1])
    _, info_last = algorithm.step(keys[-1], last)
    np.testing.assert_allclose(res.last.sigma2, last.sigma2, rtol=1e-6)
    np.testing.assert_allclose(res.denoised, info_last.denoised, rtol=1e-5, atol=1e-6)

    mu, c = _gaussian()
    y = MASK * (mu + 0.1 * jax.random.normal(jax.random.key(1), (CHAINS, D)))
    uu = en.gaussian_energy(mu, c)
    res = dps.sample(jax.random.key(12), uu, lambda x: MASK * x, y, image_shape=(D,),
                     num_steps=3, zeta=0.3)
    algorithm = dps.diffusion_posterior_sampling(uu, lambda x: MASK * x, y, image_shape=(D,),
                                                 num_steps=3, zeta=0.3)
    k0, key = jax.random.split(jax.random.key(12))
    _, infos = _by_hand(algorithm, algorithm.init(dps.initial_position(k0, (CHAINS, D))),
                        jax.random.split(key, 3))
    np.testing.assert_allclose(res.denoised, infos.denoised[-1], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(res.residual, infos.residual, rtol=1e-5, atol=1e-6)
    assert res.residual.shape == (3, CHAINS)


def test_constructors_reject_bad_arguments():
    u, prob = _problem()
    _, target_fn, precond = _mala_target()
    with pytest.raises(ValueError, match="step_size, snr"):
        langevin.mala(target_fn, precond)
    with pytest.raises(ValueError, match="snr"):
        langevin.mala(target_fn, precond, snr=-1.0)
    with pytest.raises(ValueError, match="temperature"):
        langevin.mala(target_fn, precond, step_size=0.1, temperature=0.0)
    with pytest.raises(TypeError, match="precond"):
        langevin.mala(target_fn, jnp.ones((CHAINS, D)), step_size=0.1)
    with pytest.raises(ValueError, match="sigma_end"):
        pc.predictor_corrector(u, prob, sigma_end=50.0)
    with pytest.raises(ValueError, match="corrector_steps"):
        pc.predictor_corrector(u, prob, corrector_steps=-1)
    with pytest.raises(ValueError, match="snr"):
        pc.predictor_corrector(u, prob, snr=0.0)
    with pytest.raises(ValueError, match="num_steps"):
        adaptive.per_level(u, prob, num_steps=1)
    with pytest.raises(ValueError, match="sigma_end"):
        adaptive.sample(jax.random.key(0), u, prob, sigma_end=0.0)
    y = jnp.zeros((CHAINS, D))
    with pytest.raises(ValueError, match="num_steps"):
        dps.diffusion_posterior_sampling(u, lambda x: x, y, image_shape=(D,), num_steps=1)
    with pytest.raises(ValueError, match="sigma_max, sigma_end"):
        dps.sample(jax.random.key(0), u, lambda x: x, y, image_shape=(D,), sigma_end=30.0)
    with pytest.raises(ValueError, match="zeta"):
        dps.sample(jax.random.key(0), u, lambda x: x, y, image_shape=(D,), zeta=-1.0)
    with pytest.raises(ValueError, match="y: expected a batch"):
        dps.sample(jax.random.key(0), u, lambda x: x, jnp.zeros(D), image_shape=(D,))


def test_drivers_take_a_traced_hyper_parameter():
    """Each driver jitted with its one hyper-parameter traced, as the benchmark sweeps them."""
    u, prob = _problem()
    mu, c = _gaussian()
    y = MASK * (mu + 0.1 * jax.random.normal(jax.random.key(1), (CHAINS, D)))
    runs = {
        "PC-MALA": lambda k, hp: pc.sample(k, u, prob, num_levels=2, snr=hp, metropolis=True),
        "PC/ours": lambda k, hp: pc.sample(k, u, prob, num_levels=2, snr=hp,
                                           order="corrector_first", levels="clipped"),
        "adaptive": lambda k, hp: adaptive.sample_per_entry(k, u, prob, num_updates=2,
                                                            inner_steps=1, step_cov=hp),
        "adaptive/ours": lambda k, hp: adaptive.sample(k, u, prob, num_steps=3, eta=hp),
        "DPS": lambda k, hp: dps.sample(k, u, lambda x: MASK * x, y, image_shape=(D,),
                                        num_steps=3, sigma_max=prob.sigma_max, zeta=hp),
    }
    for name, run in runs.items():
        out = jax.jit(lambda k, hp, run=run: run(k, hp).denoised)(jax.random.key(13),
                                                                  jnp.float32(0.3))
        assert out.shape == (CHAINS, D) and bool(jnp.all(jnp.isfinite(out))), name
