"""Normalized energy prior (arXiv 2605.15487) against the Gaussian closed form, operators,
samplers on the closed form, blind estimation and bad input."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxlib_ext.samplers import energy as en
from jaxlib_ext.samplers import inverse
from jaxlib_ext.samplers.energy import adaptive, blind, dps, langevin, levels, pc

# ----------------------------------------------------------------------------- fixtures


def _gaussian(d, seed=0, shape=None):
    k1, k2 = jax.random.split(jax.random.key(seed))
    a = jax.random.normal(k1, (d, d))
    c = a @ a.T / d + 0.05 * jnp.eye(d)
    mu = 0.5 + 0.3 * jax.random.normal(k2, (d,))
    shape = (d,) if shape is None else shape
    return mu.reshape(shape), c


def _dense_sigma(cov, i=0):
    return jax.vmap(lambda e: cov.replace(cov.diag[i:i + 1]).apply(e[None])[0])(
        jnp.eye(cov.diag[0].size).reshape((-1, *cov.diag.shape[1:]))).reshape(
        cov.diag[0].size, -1)


# one shape per basis by default (odd, non-square images for Fourier); the rest are sweeps
CASES = [pytest.param((2,), "pixel", marks=pytest.mark.slow), ((16,), "pixel"),
         pytest.param((4, 4, 1), "fourier", marks=pytest.mark.slow), ((3, 5, 1), "fourier")]


def _cov(shape, basis, b, seed=1):
    return en.random_covariance(jax.random.key(seed), (b, *shape), sigma_min=0.05,
                                sigma_max=3.0, basis=basis, isotropic_prob=0.0)


# ----------------------------------------------------------------------------- Gaussian oracle


@pytest.mark.parametrize("shape,basis", CASES)
def test_tweedie_identity_gaussian(shape, basis):
    d = int(np.prod(shape))
    mu, c = _gaussian(d, shape=shape)
    u = en.gaussian_energy(mu, c)
    cov = _cov(shape, basis, 3)
    y = jax.random.normal(jax.random.key(2), (3, *shape)) + mu
    xh = en.tweedie_denoiser(u, y, cov)
    for i in range(3):
        s = _dense_sigma(cov, i)
        ref = mu.reshape(-1) + c @ jnp.linalg.solve(c + s, (y[i] - mu).reshape(-1))
        np.testing.assert_allclose(xh[i].reshape(-1), ref, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("shape,basis", [((5,), "pixel"), ((4, 4, 1), "fourier")])
def test_noise_score_is_conditional_expectation_of_target(shape, basis):
    d = int(np.prod(shape))
    mu, c = _gaussian(d, seed=3, shape=shape)
    u = en.gaussian_energy(mu, c)
    cov = _cov(shape, basis, 1, seed=4)
    y = mu[None] + 0.7 * jax.random.normal(jax.random.key(5), (1, *shape))
    s = _dense_sigma(cov)
    # exact posterior x | y
    k = c + s
    mean = mu.reshape(-1) + c @ jnp.linalg.solve(k, (y[0] - mu).reshape(-1))
    post = c - c @ jnp.linalg.solve(k, c)
    n = 200_000

    @jax.jit  # the Monte Carlo estimate as one program (eager: a program per op)
    def monte_carlo(mean, post, y, cov):
        xs = mean + jax.random.normal(jax.random.key(6), (n, d)) @ jnp.linalg.cholesky(
            post + 1e-9 * jnp.eye(d)).T
        cov_n = cov.replace(jnp.broadcast_to(cov.diag, (n, *shape)))
        t = en.covariance_score_target(jnp.broadcast_to(y, (n, *shape)), xs.reshape(n, *shape),
                                       cov_n)
        return t.mean(0), t.std(0) / np.sqrt(n)

    mc, se = monte_carlo(mean, post, y, cov)
    ns = en.noise_score(u, y, cov)[0]
    assert jnp.all(jnp.abs(ns - mc) < 5 * se + 1e-3), (ns, mc, se)


def test_loss_at_the_authors_scaling_equals_a_hand_computation():
    """(L.1)-(L.4) by hand for a diagonal Gaussian, whose energy is closed form per entry:
    U = sum_i (y_i - m_i)^2 / (2 (c_i + s_i)) + 1/2 log 2 pi (c_i + s_i)."""
    d, b = 5, 64
    m = jnp.linspace(-0.5, 0.5, d)
    c = jnp.linspace(0.2, 1.0, d)
    x = m + jnp.sqrt(c) * jax.random.normal(jax.random.key(30), (b, d))
    cov = _cov((d,), "pixel", b, seed=31)
    key = jax.random.key(32)
    loss, parts = en.acsm_loss(en.gaussian_energy(m, jnp.diag(c)), x, cov, key, cov_weight=0.7)
    y, eps = en.add_noise(key, x, cov)
    xn, yn, en_, s = (np.asarray(a, np.float64) for a in (x, y, eps, cov.diag))
    v = np.asarray(c, np.float64) + s
    grad_y = (yn - np.asarray(m)) / v
    du_ds = 0.5 / v - 0.5 * (yn - np.asarray(m)) ** 2 / v ** 2
    dsm = np.mean((en_ - np.sqrt(s) * grad_y) ** 2, axis=1)
    cov_term = np.sum((s * du_ds - 0.5 * (1 - (yn - xn) ** 2 / s)) ** 2, axis=1) / d ** 2
    np.testing.assert_allclose(parts["dsm"], dsm.mean(), rtol=1e-4)
    np.testing.assert_allclose(parts["cov"], cov_term.mean(), rtol=1e-4)
    np.testing.assert_allclose(loss, np.mean(dsm + 0.7 * cov_term), rtol=1e-4)
    # ours averages once: the same term d times larger, so lambda there is d lambda here
    loss_mean, parts_mean = en.acsm_loss(en.gaussian_energy(m, jnp.diag(c)), x, cov, key,
                                         cov_weight=0.7 / d, cov_reduction="mean")
    np.testing.assert_allclose(parts_mean["cov"], d * cov_term.mean(), rtol=1e-4)
    np.testing.assert_allclose(loss_mean, loss, rtol=1e-5)


# the pixel basis by default (the Fourier target of the covariance term is checked in
# test_noise_score_is_conditional_expectation_of_target): a basis sweep
@pytest.mark.parametrize("shape,basis", [
    ((6,), "pixel"), pytest.param((4, 4, 1), "fourier", marks=pytest.mark.slow)])
def test_loss_is_lowest_at_true_energy(shape, basis):
    d = int(np.prod(shape))
    mu, c = _gaussian(d, seed=7, shape=shape)
    x = mu + (jax.random.normal(jax.random.key(8), (2048, d)) @ jnp.linalg.cholesky(c).T
              ).reshape(2048, *shape)
    cov = _cov(shape, basis, 2048, seed=9)
    u_star = en.gaussian_energy(mu, c)
    rest = tuple(range(1, len(shape) + 1))
    perturbed = {
        "wider": en.gaussian_energy(mu, 1.3 * c),
        "shifted": en.gaussian_energy(mu + 0.2, c),
        # changes only U's dependence on Sigma: the covariance term alone sees it
        "sigma-only": lambda y, cv: u_star(y, cv) + 0.3 * jnp.sum(jnp.log(cv.diag), axis=rest),
    }
    key = jax.random.key(10)
    l_star, parts_star = en.acsm_loss(u_star, x, cov, key)
    for name, u in perturbed.items():
        loss, parts = en.acsm_loss(u, x, cov, key)
        assert loss > l_star + 1e-3, name
    # the sigma-only perturbation leaves the denoising term unchanged
    _, parts = en.acsm_loss(perturbed["sigma-only"], x, cov, key)
    np.testing.assert_allclose(parts["dsm"], parts_star["dsm"], rtol=1e-5)
    assert parts["cov"] > parts_star["cov"] + 1e-3


def _posterior(mu, c, op, y, sn):
    d = c.shape[0]
    shape = mu.shape
    a = jax.vmap(lambda e: op.apply(e.reshape(shape)).reshape(-1))(jnp.eye(d)).T
    p = jnp.linalg.inv(jnp.linalg.inv(c) + a.T @ a / sn ** 2)
    m = p @ (jnp.linalg.solve(c, mu.reshape(-1)) + a.T @ y.reshape(-1) / sn ** 2)
    return m, p


# the authors' order and levels by default; ours (corrector first, clipped levels) in the sweep
@pytest.mark.parametrize("kind,order,shape_of_levels", [
    ("pixel", "predictor_first", "scaled"),
    pytest.param("pixel", "corrector_first", "clipped", marks=pytest.mark.slow),
    pytest.param("fourier", "predictor_first", "scaled", marks=pytest.mark.slow),
    pytest.param("fourier", "corrector_first", "clipped", marks=pytest.mark.slow)])
def test_pc_mala_reproduces_gaussian_posterior(kind, order, shape_of_levels):
    shape = (4, 4, 1)
    mu, c = _gaussian(16, seed=11, shape=shape)
    u = en.gaussian_energy(mu, c)
    x = mu + (jnp.linalg.cholesky(c) @ jax.random.normal(jax.random.key(12), (16,))).reshape(
        shape)
    op = (inverse.box_inpainting(shape, 2) if kind == "pixel"
          else inverse.gaussian_blur(shape, 0.7))
    sn = 0.1
    y = inverse.measure(jax.random.key(13), op, x[None], sn)
    prob = en.from_operator(y, op, sn, sigma_max=20.0)
    n = 1024
    res = jax.jit(lambda p, k: pc.sample(k, u, p, num_levels=40, sigma_end=0.01,
                                         corrector_steps=2, snr=0.3, metropolis=True,
                                         order=order, levels=shape_of_levels))(
        pc.repeat(prob, n), jax.random.key(14))
    m, p = _posterior(mu, c, op, y, sn)
    s = res.last.reshape(n, -1)
    sd = jnp.sqrt(jnp.diag(p))
    # at sigma_end = 0.01 the samples carry 0.01 extra noise; tolerances: ~4 standard errors
    assert float(jnp.max(jnp.abs(s.mean(0) - m) / sd)) < 4.5 / np.sqrt(n) * 3
    assert float(jnp.max(jnp.abs(s.std(0) / jnp.sqrt(sd ** 2 + 1e-4) - 1))) < 0.15
    acc = res.info.acceptance_rate[1:].mean()
    assert 0.2 < float(acc) <= 1.0
    assert res.nfe == 40 * 3 + (order == "predictor_first")


def _box_problem(seed, measure_seed, noise, chains):
    """A 4x4 Gaussian prior's energy and its 2x2-box inpainting of the prior mean, ``chains``
    copies."""
    mu, c = _gaussian(16, seed=seed, shape=(4, 4, 1))
    op = inverse.box_inpainting((4, 4, 1), 2)
    y = inverse.measure(jax.random.key(measure_seed), op, mu[None], noise)
    return en.gaussian_energy(mu, c), pc.repeat(en.from_operator(y, op, noise), chains)


def test_mala_acceptance_tends_to_one_as_step_shrinks():
    u, prob = _box_problem(15, 16, 0.1, 256)
    lev = levels.level(prob, jnp.full((256,), 0.3 ** 2))

    def target(x):
        ev = levels.evaluate(u, prob, lev, x)
        return ev.energy, ev.grad

    kernel = langevin.build_kernel(metropolis=True)
    x0 = levels.initial_position(jax.random.key(17), prob)
    state = langevin.init(prob.z + 0.3 * (x0 - prob.z) / 20.0, target)
    rates = []
    for h in (0.3, 0.03, 0.003, 0.0003):
        _, info = kernel(jax.random.key(18), state, target, lev.precond, step_size=h)
        rates.append(float(info.acceptance_rate.mean()))
    assert all(a <= b + 1e-3 for a, b in zip(rates, rates[1:])), rates
    assert rates[-1] > 0.99, rates


@pytest.mark.parametrize("kind", ["pixel", pytest.param("fourier", marks=pytest.mark.slow)])
def test_pc_and_adaptive_and_dps_run_and_denoise_gaussian(kind):
    shape = (4, 4, 1)
    mu, c = _gaussian(16, seed=19, shape=shape)
    u = en.gaussian_energy(mu, c)
    op = inverse.box_inpainting(shape, 2) if kind == "pixel" else inverse.gaussian_blur(shape, 0.7)
    x = mu + (jnp.linalg.cholesky(c) @ jax.random.normal(jax.random.key(20), (16,))).reshape(
        shape)
    y = inverse.measure(jax.random.key(21), op, x[None], 0.05)
    m, _ = _posterior(mu, c, op, y, 0.05)
    prob = pc.repeat(en.from_operator(y, op, 0.05), 128)
    # each sampler jitted: one program apiece (eager, every op around their loops compiles)
    outs = {
        "pc": jax.jit(lambda p, k: pc.sample(k, u, p, num_levels=20, corrector_steps=1,
                                             snr=0.1).denoised)(prob, jax.random.key(22)),
        "adaptive": jax.jit(lambda p, k: adaptive.sample(k, u, p, num_steps=40).denoised)(
            prob, jax.random.key(23)),
        "adaptive_per_entry": jax.jit(lambda p, k: adaptive.sample_per_entry(
            k, u, p, num_updates=20, inner_steps=1).denoised)(prob, jax.random.key(23)),
        "dps": jax.jit(lambda yy, k: dps.sample(k, u, op.apply, yy, image_shape=shape,
                                                num_steps=40, zeta=0.3).denoised)(
            jnp.repeat(y, 128, 0), jax.random.key(24)),
    }
    prior_err = float(jnp.linalg.norm(mu.reshape(-1) - m))
    # DPS is the approximate baseline: a looser bound
    for name, out in outs.items():
        assert jnp.all(jnp.isfinite(out)), name
        err = float(jnp.linalg.norm(out.reshape(128, -1).mean(0) - m))
        assert err < (0.75 if name == "dps" else 0.5) * prior_err, (name, err, prior_err)


def test_adaptive_schedule_steps_stay_within_their_bounds():
    u, prob = _box_problem(25, 26, 0.05, 8)
    k, end = 30, 0.01
    res = adaptive.sample(jax.random.key(27), u, prob, num_steps=k, sigma_end=end)
    gamma = (end / 20.0) ** (2.0 / (k - 1))
    ratio = (res.info.sigma[1:] / res.info.sigma[:-1]) ** 2
    floor = res.info.sigma[1:] <= end * (1 + 1e-4)
    assert jnp.all(floor | (ratio <= gamma ** 0.5 * (1 + 1e-4)))
    assert jnp.all(floor | (ratio >= gamma ** 2 * (1 - 1e-4)))
    assert jnp.all(jnp.isfinite(res.info.noise_score)) and jnp.all(jnp.isfinite(res.denoised))
    assert res.nfe == k


def test_per_entry_schedule_keeps_covariances_positive_and_decreasing():
    """The authors' schedule (E.1)-(E.2): every entry of Sigma_t stays positive and never
    grows, the missing entries shrink; inside jit, with the authors' defaults."""
    u, prob = _box_problem(25, 26, 0.05, 8)
    kernel = adaptive.build_per_entry_kernel(u, inner_steps=1)

    @jax.jit
    def run(key):
        def body(st, k):
            st2, _ = kernel(k, st, prob)
            return st2, st2.cov.diag
        state = adaptive.init_per_entry(levels.initial_position(jax.random.key(0), prob), prob)
        return jax.lax.scan(body, state, jax.random.split(key, 30))

    last, covs = run(jax.random.key(27))
    covs = jnp.concatenate([prob.cov.diag[None], covs])
    assert jnp.all(covs > 0) and jnp.all(jnp.isfinite(covs))
    assert jnp.all(covs[1:] <= covs[:-1])
    missing = ~prob.observed
    assert jnp.all(jnp.where(missing, covs[-1] < covs[0], True))
    assert jnp.all(jnp.isfinite(last.position))
    res = adaptive.sample_per_entry(jax.random.key(27), u, prob, num_updates=3,
                                   inner_steps=2)
    assert res.nfe == 3 * 3 and res.info.energy.shape == (3, 8)


def _mirror(d):
    return jnp.roll(jnp.flip(d, axis=(-3, -2)), 1, axis=(-3, -2))


def test_symmetrize_projects_onto_hermitian_spectra():
    d = jax.random.normal(jax.random.key(3), (2, 3, 4, 1))
    sym = en.Covariance(jnp.ones_like(d), "fourier").symmetrize(d)
    np.testing.assert_allclose(sym, _mirror(sym), atol=1e-7)
    np.testing.assert_allclose(en.Covariance(jnp.ones_like(d), "fourier").symmetrize(sym), sym,
                               atol=1e-7)
    np.testing.assert_array_equal(en.Covariance(jnp.ones_like(d)).symmetrize(d), d)


def test_per_entry_schedule_keeps_fourier_spectra_hermitian():
    """A network reads the spectrum, so its dU/ds need not be Hermitian-symmetric; the
    per-entry updates (E.1)-(E.2) on a deblurring problem keep Sigma_t a covariance of real
    images (its spectrum equal to its mirror) and the chains finite."""
    shape = (5, 6, 1)
    mu, c = _gaussian(30, seed=5, shape=shape)
    gauss = en.gaussian_energy(mu, c)
    w = jax.random.uniform(jax.random.key(6), shape, minval=-5.0, maxval=5.0)

    def u(y, cov):  # an energy whose noise score is not mirror-symmetric
        return gauss(y, cov) + jnp.sum(w * jnp.sqrt(cov.diag), axis=(1, 2, 3))

    op = inverse.gaussian_blur(shape, 1.0)
    y = inverse.measure(jax.random.key(7), op, mu[None], 0.05)
    prob = pc.repeat(en.from_operator(y, op, 0.05, sigma_max=3.0), 2)
    lev = levels.covariance_level(prob, prob.cov.diag)
    score = levels.evaluate(u, prob, lev, levels.initial_position(jax.random.key(8), prob))
    assert float(jnp.max(jnp.abs(score.noise_score - _mirror(score.noise_score)))) > 1e-2
    res = adaptive.sample_per_entry(jax.random.key(9), u, prob, num_updates=6, step_cov=0.3)
    diag = res.last.cov.diag
    np.testing.assert_allclose(diag, _mirror(diag), rtol=1e-6)
    assert float(jnp.min(diag / prob.cov.diag)) < 0.99  # the schedule moved
    assert jnp.all(jnp.isfinite(res.denoised))


def test_blind_argmin_recovers_true_scale_and_box():
    shape = (4, 4, 1)
    mu, c = _gaussian(16, seed=28, shape=shape)
    mu = mu + 1.5  # pixels far from 0, so a missing pixel is told from an observed one
    u = en.gaussian_energy(mu, c)
    sizes, noises = (1, 2, 3), jnp.array([0.03, 0.1, 0.3, 1.0])
    ops = jnp.stack([inverse.box_inpainting(shape, s).diagonal for s in sizes])
    hits = 0
    for trial, (bi, ni) in enumerate([(0, 1), (1, 0), (2, 2), (1, 3), (2, 1), (0, 2)]):
        k1, k2 = jax.random.split(jax.random.key(100 + trial))
        x = mu + (jnp.linalg.cholesky(c) @ jax.random.normal(k1, (16,))).reshape(shape)
        y = inverse.measure(k2, inverse.box_inpainting(shape, sizes[bi]), x[None], noises[ni])
        r = blind.blind_posterior(u, y, ops, noises, basis="pixel")
        hits += int(r.operator_index[0] == bi) * int(r.noise_index[0] == ni)
        np.testing.assert_allclose(r.posterior.sum(), 1.0, rtol=1e-5)
    assert hits >= 5


def test_blind_posterior_under_jit_equals_eager():
    u = en.gaussian_energy(jnp.full((4, 4, 1), 0.5), 0.05 * jnp.eye(16) + 0.02)
    op = inverse.box_inpainting((4, 4, 1), 2)
    y = inverse.measure(jax.random.key(0), op, jnp.full((1, 4, 4, 1), 0.5), 0.05)
    ops, ns = jnp.stack([op.diagonal] * 2), jnp.array([0.05, 0.1])
    eager = blind.blind_posterior(u, y, ops, ns, basis="pixel").posterior
    jitted = jax.jit(lambda yy, s: blind.blind_posterior(u, yy, ops, s, basis="pixel")
                     .posterior)(y, ns)
    np.testing.assert_allclose(jitted, eager, rtol=1e-6)


def test_blind_evidence_matches_gaussian_marginal_likelihood():
    """(P.2) with U* is the exact log p(y | A, sigma_n) of the linear-Gaussian model."""
    shape = (4, 4, 1)
    mu, c = _gaussian(16, seed=29, shape=shape)
    u = en.gaussian_energy(mu, c)
    for op in (inverse.box_inpainting(shape, 2), inverse.gaussian_blur(shape, 0.6)):
        sn = 0.1
        y = inverse.measure(jax.random.key(30), op, mu[None], sn)
        a = jax.vmap(lambda e, o=op: o.apply(e.reshape(shape)).reshape(-1))(jnp.eye(16)).T
        k = a @ c @ a.T + sn ** 2 * jnp.eye(16)
        r = y.reshape(-1) - a @ mu.reshape(-1)
        ref = 0.5 * r @ jnp.linalg.solve(k, r) + 0.5 * jnp.linalg.slogdet(2 * jnp.pi * k)[1]
        nll = blind.neg_log_evidence(u, en.from_operator(y, op, sn, sigma_max=1e3))
        np.testing.assert_allclose(nll[0], ref, rtol=1e-3, atol=0.05)


# ----------------------------------------------------------------------------- operators


@pytest.mark.parametrize("make", [
    lambda s: inverse.box_inpainting(s, 3),
    lambda s: inverse.random_inpainting(jax.random.key(0), s, 0.5),
    lambda s: inverse.gaussian_blur(s, 1.2),
    lambda s: inverse.motion_blur(s, 4.0, 0.3),
])
def test_problem_diagonal_view_reproduces_operator(make):
    shape = (7, 6, 1)
    op = make(shape)
    a, basis = en.problem.operator_diagonal(op)
    x = jax.random.normal(jax.random.key(1), (2, *shape))
    cov = en.Covariance(jnp.ones_like(x), basis)
    ax = cov.from_basis(jnp.broadcast_to(a, x.shape) * cov.to_basis(x))
    np.testing.assert_allclose(ax, op.apply(x), atol=1e-5)
    # adjoint identity <A x, y> = <x, A^T y>
    yv = jax.random.normal(jax.random.key(2), (2, *shape))
    np.testing.assert_allclose(jnp.vdot(op.apply(x), yv), jnp.vdot(x, op.adjoint(yv)),
                               rtol=1e-4)


@pytest.mark.parametrize("basis", ["pixel", "fourier"])
def test_covariance_is_symmetric_positive_and_powers_compose(basis):
    cov = en.random_covariance(jax.random.key(3), (2, 5, 6, 1), basis=basis, isotropic_prob=0.)
    x, y = jax.random.normal(jax.random.key(4), (2, 2, 5, 6, 1))
    np.testing.assert_allclose(jnp.vdot(cov.apply(x), y), jnp.vdot(x, cov.apply(y)), rtol=1e-4)
    assert jnp.all(jnp.sum(x * cov.apply(x), axis=(1, 2, 3)) > 0)
    np.testing.assert_allclose(cov.apply(cov.apply(x, 0.5), 0.5), cov.apply(x), rtol=1e-3,
                               atol=1e-6 * float(cov.diag.max()))
    np.testing.assert_allclose(cov.apply(cov.apply(x, -1.0)), x, rtol=1e-3, atol=1e-3)


def test_random_covariance_levels_are_log_uniform_in_range():
    cov = en.random_covariance(jax.random.key(5), (512, 8, 8, 1), sigma_min=1e-3,
                               sigma_max=20.0, basis="pixel")
    s = jnp.sqrt(cov.diag)
    assert float(s.min()) >= 1e-3 * (1 - 1e-5) and float(s.max()) <= 20.0 * (1 + 1e-5)
    # log-uniform: the median of log10 sigma sits near the middle of the range
    mid = 0.5 * (np.log10(1e-3) + np.log10(20.0))
    assert abs(float(jnp.median(jnp.log10(s.max(axis=(1, 2, 3))))) - mid) < 1.2


# ----------------------------------------------------------------------------- vmap over chains


def test_chains_under_vmap_match_the_batched_run():
    shape = (4, 4, 1)
    mu, c = _gaussian(16, seed=31, shape=shape)
    u = en.gaussian_energy(mu, c)
    op = inverse.box_inpainting(shape, 2)
    y = inverse.measure(jax.random.key(32), op, mu[None], 0.1)
    prob = en.from_operator(y, op, 0.1)
    run = jax.jit(jax.vmap(lambda k: pc.sample(k, u, prob, num_levels=2, metropolis=True,
                                               corrector_steps=1).denoised))
    out = run(jax.random.split(jax.random.key(33), 5))
    assert out.shape == (5, 1, *shape)
    one = jax.jit(lambda k: pc.sample(k, u, prob, num_levels=2, metropolis=True,
                                      corrector_steps=1).denoised)(
        jax.random.split(jax.random.key(33), 5)[2])
    np.testing.assert_allclose(out[2], one, rtol=1e-4, atol=1e-5)


# ----------------------------------------------------------------------------- bad input


def test_bad_input_raises_clear_errors():
    mu, c = _gaussian(16, shape=(4, 4, 1))
    u = en.gaussian_energy(mu, c)
    y = jnp.zeros((2, 4, 4, 1))
    cov = en.Covariance(jnp.ones((2, 4, 4, 1)), "pixel")
    with pytest.raises(ValueError, match="cov.diag: expected shape"):
        en.score(u, jnp.zeros((2, 5, 4, 1)), cov)
    with pytest.raises(ValueError, match="y: expected a batch"):
        en.score(u, jnp.zeros((16,)), en.Covariance(jnp.ones((16,))))
    with pytest.raises(ValueError, match="positive, finite variances"):
        en.tweedie_denoiser(u, y, en.Covariance(jnp.zeros((2, 4, 4, 1)), "pixel"))
    with pytest.raises(ValueError, match="positive, finite variances"):
        en.noise_score(u, y, en.Covariance(-jnp.ones((2, 4, 4, 1)), "pixel"))
    with pytest.raises(ValueError, match="basis"):
        en.score(u, y, en.Covariance(jnp.ones((2, 4, 4, 1)), "wavelet"))
    with pytest.raises(TypeError, match="cov: expected a Covariance"):
        en.score(u, y, jnp.ones((2, 4, 4, 1)))
    with pytest.raises(ValueError, match="a: shape"):  # a mask of the wrong size
        en.diagonal_problem(y, jnp.ones((5, 5, 1)), basis="pixel", noise_std=0.1)
    op = inverse.box_inpainting((4, 4, 1), 2)
    with pytest.raises(ValueError, match="y: expected"):  # images of the wrong shape
        en.from_operator(jnp.zeros((2, 5, 4, 1)), op, 0.1)
    with pytest.raises(ValueError, match="noise_std"):
        en.from_operator(y, op, 0.0)
    with pytest.raises(ValueError, match="not diagonal"):
        en.from_operator(jnp.zeros((2, 2, 2, 1)), inverse.downsampling((4, 4, 1), 2), 0.1)
    with pytest.raises(ValueError, match="at least 2"):  # a grid with one point
        blind.blind_posterior(u, y, op.diagonal[None], jnp.array([0.1]), basis="pixel")
    with pytest.raises(ValueError, match="log_prior"):
        blind.blind_posterior(u, y, jnp.stack([op.diagonal] * 2), jnp.array([0.1]),
                              basis="pixel", log_prior=jnp.zeros((3, 3)))
    prob = en.from_operator(y, op, 0.1)
    with pytest.raises(ValueError, match="num_levels"):
        pc.sample(jax.random.key(0), u, prob, num_levels=0)
    with pytest.raises(ValueError, match="num_levels"):
        pc.sample(jax.random.key(0), u, prob, num_levels=1, order="corrector_first")
    with pytest.raises(ValueError, match="order"):
        pc.sample(jax.random.key(0), u, prob, order="sideways")
    with pytest.raises(ValueError, match="levels"):
        pc.sample(jax.random.key(0), u, prob, levels="stretched")
    with pytest.raises(ValueError, match="step_cov"):
        adaptive.sample_per_entry(jax.random.key(0), u, prob, step_cov=0.0)
    with pytest.raises(ValueError, match="inner_steps"):
        adaptive.sample_per_entry(jax.random.key(0), u, prob, inner_steps=-1)
    with pytest.raises(ValueError, match="num_updates"):
        adaptive.sample_per_entry(jax.random.key(0), u, prob, num_updates=0)
    with pytest.raises(ValueError, match="cov_reduction"):
        en.acsm_loss(u, y, en.Covariance(jnp.ones_like(y)), jax.random.key(0),
                     cov_reduction="sum")
    with pytest.raises(ValueError, match="step_size, snr"):
        langevin.build_kernel()(jax.random.key(0), langevin.MALAState(y, y[:, 0, 0, 0], y),
                                lambda v: (v[:, 0, 0, 0], v), cov)
    with pytest.raises(ValueError, match="basis"):
        en.random_covariance(jax.random.key(0), (2, 4, 4, 1), basis="wavelet")
    with pytest.raises(ValueError, match="sigma_min"):
        en.random_covariance(jax.random.key(0), (2, 4, 4, 1), sigma_min=1.0, sigma_max=0.5)
