"""Latent DAPS (arXiv 2407.01521), the third base solver of ``samplers.mclc``, on the
linear-Gaussian latent model, whose posterior is closed-form: the posterior's moments, the
law of the scheme itself (Gaussian here, propagated in closed form), the ODE estimate against
the exact probability-flow map, jit/vmap, nfe with and without the MCLC corrector, guidance, a
hand-written loop over the sampler against the driver, bad inputs."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxlib_ext.models.diffusion import ddim_timesteps
from jaxlib_ext.samplers import mclc as M
from jaxlib_ext.samplers.mclc import solvers

D, N_PIX, K_MEAS, NOISE = 4, 6, 2, 0.1


@pytest.fixture(scope="module")
def gauss():
    """Model, measurement and its problem (orthonormal pullback: ``A W`` has orthonormal
    rows), as in ``test_mclc.py``."""
    model = M.linear_gaussian_model(jax.random.key(0), D, N_PIX, K_MEAS, NOISE)
    _, _, y = model.sample_measurement(jax.random.key(100))
    return model, y, model.problem(y)


def _whitened_errors(mean0, cov0, mean, cov):
    """``(||L^-1 (m0 - m)||, ||L^-1 C0 L^-T - I||_F)`` with ``cov = L L^T``."""
    li = np.linalg.inv(np.linalg.cholesky(np.asarray(cov, np.float64)))
    m0, c0 = np.asarray(mean0, np.float64), np.asarray(cov0, np.float64)
    return (float(np.linalg.norm(li @ (m0 - np.asarray(mean, np.float64)))),
            float(np.linalg.norm(li @ c0 @ li.T - np.eye(D))))


def _daps_law(model, y, timesteps, langevin_steps, step_size, prior_std, min_step_ratio=0.01):
    """The law of the output of ``latent_daps(..., ode_steps=1)`` from ``z_{t_0} ~ N(0, I)``:
    every map of (L.2)-(L.6) is affine here (Tweedie (G.2), the Langevin steps (L.3) on the
    affine residual), so the law stays Gaussian; float64 ``(mean, cov)``."""
    f = lambda a: np.asarray(a, np.float64)
    m, s, ab = f(model.prior_mean), f(model.prior_cov), f(model.alpha_bars)
    h = f(model.operator_matrix @ model.decoder_matrix)
    yc = f(y) - f(model.operator_matrix @ model.decoder_bias)
    eye, n = np.eye(D), len(timesteps)
    mu, cov = np.zeros(D), eye
    for i, t in enumerate(timesteps):
        a = ab[t]
        gain = np.sqrt(a) * s @ np.linalg.inv(a * s + (1 - a) * eye)  # K_t of (G.2)
        r2 = (1 - a) / a if prior_std == "sigma" else 1 - a  # (L.4)
        eta = step_size * (1 - (1 - min_step_ratio) * i / (n + 1))  # (L.5)
        # u = F z + c + noise of covariance q, from u_0 = zhat_0 = gain z + m - gain sqrt(a) m
        contract = eye - eta * (eye / r2 + h.T @ h / NOISE ** 2)
        zhat = (gain, m - gain @ (np.sqrt(a) * m))
        fm, c, q = zhat[0], zhat[1], np.zeros((D, D))
        for _ in range(langevin_steps):  # (L.3)
            fm = contract @ fm + eta * zhat[0] / r2
            c = contract @ c + eta * (zhat[1] / r2 + h.T @ yc / NOISE ** 2)
            q = contract @ q @ contract.T + 2 * eta * eye
        mu, cov = fm @ mu + c, fm @ cov @ fm.T + q
        if i < n - 1:  # (L.6)
            a_next = ab[timesteps[i + 1]]
            mu, cov = np.sqrt(a_next) * mu, a_next * cov + (1 - a_next) * eye
    return mu, cov


@pytest.mark.parametrize("prior_std", ["sigma", pytest.param("unit_prior",
                                                             marks=pytest.mark.slow)])
def test_many_steps_approach_the_closed_form_posterior(gauss, prior_std):
    """2000 chains of 100 annealing steps from ``t = 300`` (``sigma = 1.25``, above the
    prior's spread), 30 Langevin steps each at ``eta = 5e-3`` with the authors' decay, the
    likelihood at the model's noise. (i) The sample moments match the scheme's own law
    (:func:`_daps_law`) within Monte Carlo: at 2000 draws the whitened errors of exact draws are
    about 0.05 (mean) and 0.10 (covariance); bounds 0.15 and 0.3. (ii) That law is close to the
    posterior (its bias here: 0.07 and 0.17), and so are the samples: bounds 0.2 and 0.45 (bias
    plus Monte Carlo). (iii) A tenth of the Langevin steps leaves the law far from it."""
    model, y, prob = gauss
    kw = dict(num_steps=100, langevin_steps=30, step_size=5e-3, ode_steps=1, noise_std=NOISE,
              t_max=300, prior_std=prior_std)
    run = jax.jit(jax.vmap(lambda k: M.latent_daps(k, prob, **kw).z0))
    zs = np.asarray(run(jax.random.split(jax.random.key(1), 2000)), np.float64)
    assert np.all(np.isfinite(zs))
    m_hat, c_hat = zs.mean(0), np.cov(zs.T)
    ts = ddim_timesteps(prob.alpha_bars.shape[0], 100, 300)
    law = _daps_law(model, y, ts, 30, 5e-3, prior_std)
    post = model.posterior(y)
    e_law = _whitened_errors(m_hat, c_hat, *law)
    assert e_law[0] < 0.15 and e_law[1] < 0.3, e_law
    bias = _whitened_errors(*law, *post)
    assert bias[0] < 0.1 and bias[1] < 0.2, bias
    e_post = _whitened_errors(m_hat, c_hat, *post)
    assert e_post[0] < 0.2 and e_post[1] < 0.45, e_post
    short = _whitened_errors(*_daps_law(model, y, ts, 3, 5e-3, prior_std), *post)
    assert sum(short) > 5 * sum(bias), (short, bias)


@pytest.fixture(scope="module")
def runs(gauss):
    """One compiled program each, without and with MCLC (``M.mclc(1)``), over 64 keys: ``N =
    5`` steps from ``T - 1``, ``ode_steps = 2``, 20 Langevin steps; ``noise_std`` is traced
    (``1e3`` switches the likelihood off)."""
    _, _, prob = gauss
    kw = dict(num_steps=5, langevin_steps=20, step_size=2e-4, ode_steps=2)
    keys = jax.random.split(jax.random.key(11), 64)

    def program(corrector):
        return jax.jit(jax.vmap(lambda k, s: M.latent_daps(k, prob, noise_std=s,
                                                           corrector=corrector, **kw),
                                in_axes=(0, None)))

    plain, corrected = program(None), program(M.mclc(1))
    return kw, keys, plain, corrected, corrected(keys, 0.05)


def test_jit_vmap_nfe_and_guidance(gauss, runs):
    """Shapes and finiteness under jit/vmap, the same draws on a second call, ``nfe = N
    ode_steps`` alone and ``N ode_steps + K (N - 1)`` with a ``K``-step corrector, and the
    Langevin guidance pulling the reconstructions to the measurement against the unguided
    run (the likelihood switched off)."""
    _, _, prob = gauss
    kw, keys, plain, corrected, out = runs
    assert out.z0.shape == (64, D) and out.x0.shape == (64, N_PIX)
    assert out.info.residual.shape == (64, 5) and out.info.timesteps.shape == (64, 5)
    np.testing.assert_array_equal(out.info.timesteps[0],
                                  ddim_timesteps(prob.alpha_bars.shape[0], 5))
    assert bool(jnp.all(jnp.isfinite(out.z0)))
    assert int(out.info.nfe[0]) == 5 * 2 + 1 * 4
    assert out.info.corrector.residual.shape == (64, 4, 1)
    again = corrected(keys, 0.05)
    np.testing.assert_array_equal(np.asarray(again.z0), np.asarray(out.z0))
    guided, free = plain(keys, 0.05), plain(keys, 1e3)
    assert guided.info.corrector is None and int(guided.info.nfe[0]) == 5 * 2
    assert float(guided.info.final_residual.mean()) < 0.5 * float(free.info.final_residual.mean())


def test_own_loop_over_the_sampler_matches_the_driver(gauss, runs):
    """``N`` steps of ``latent_daps_sampler(...).step`` under ``lax.scan`` with the driver's
    keys give the driver's latents, residuals and corrector trace; the last step runs no
    corrector (its info is zeros)."""
    _, _, prob = gauss
    kw, keys, _, _, out = runs
    algorithm = M.latent_daps_sampler(prob, noise_std=0.05, corrector=M.mclc(1), **kw)

    @jax.jit
    @jax.vmap
    def own_loop(key):
        k_init, k_steps, k_last = jax.random.split(key, 3)
        step_keys = jnp.concatenate([jax.random.split(k_steps, 4), k_last[None]])
        state = algorithm.init(jax.random.normal(k_init, (D,)))
        return jax.lax.scan(lambda s, k: algorithm.step(k, s), state, step_keys)

    state, infos = own_loop(keys)
    assert np.all(np.asarray(state.step) == 5)
    np.testing.assert_allclose(state.z, out.z0, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(infos.residual, out.info.residual, rtol=1e-4, atol=1e-5)
    np.testing.assert_array_equal(infos.timestep, out.info.timesteps)
    np.testing.assert_allclose(infos.corrector.residual[:, :-1], out.info.corrector.residual,
                               rtol=1e-4, atol=1e-5)
    assert not np.any(np.asarray(infos.corrector.step_size[:, -1]))


def test_ode_estimate_is_tweedie_at_one_step_and_converges_to_the_flow(gauss):
    """One kernel step at ``t = 300`` (the last, so it returns ``u_L``) with no Langevin step
    returns the ODE estimate (L.2): Tweedie's (P.3) at ``ode_steps = 1``; with more steps the
    Euler error against the exact probability-flow map of the Gaussian prior, ``z_0 = m + Q
    diag(sqrt(l / (l + sigma^2))) Q^T (x_t - m)``, halves with each doubling. The reported
    residual is (P.5) at ``(z, t)`` whatever ``ode_steps``."""
    model, _, prob = gauss
    z, t = jnp.array([0.8, -1.2, 0.4, 2.0]), 300
    ab = model.alpha_bars[t]
    lam, q, m = model.prior_eigvals, model.prior_eigvecs, model.prior_mean
    flow = m + (q * jnp.sqrt(lam / (lam + (1 - ab) / ab))) @ q.T @ (z / jnp.sqrt(ab) - m)
    errs = {}
    for k in (1, 4, 8):
        kernel = M.build_latent_daps_kernel(np.array([t], np.int32), langevin_steps=0,
                                            ode_steps=k)
        new, info = kernel(jax.random.key(0), solvers.init(z), prob)
        assert int(new.step) == 1 and int(info.timestep) == t
        np.testing.assert_allclose(info.residual, M.measurement_residual(prob, z, t), rtol=1e-5)
        if k == 1:
            np.testing.assert_allclose(new.z, M.denoise(prob, z, t)[1], rtol=1e-5, atol=1e-6)
        errs[k] = float(jnp.linalg.norm(new.z - flow))
    assert errs[8] < 0.25 and 1.6 < errs[4] / errs[8] < 2.4, errs
    assert errs[1] > 4 * errs[8], errs


def test_one_langevin_step_and_the_gradient_clip(gauss):
    """With one Langevin step the prior term of (L.3) vanishes (``u_0 = zhat_0``): the
    clipped and the unclipped runs of the same key differ by exactly ``eta_0 / (2 beta_y^2)
    (g - clip(g))``, ``g = grad ||y - A D(u)||^2`` at Tweedie's estimate; a clip above ``|g|``
    changes nothing."""
    model, y, prob = gauss
    z, t, eta, beta = jnp.array([0.3, -0.5, 0.9, 0.1]), 200, 1e-3, 0.2
    zhat = M.denoise(prob, z, t)[1]
    g = jax.grad(lambda u: jnp.sum((y - prob.operator.apply(prob.decoder(u))) ** 2))(zhat)
    clip = 0.5 * float(jnp.max(jnp.abs(g)))

    def one(grad_clip):
        kernel = M.build_latent_daps_kernel(np.array([t], np.int32), step_size=eta,
                                            langevin_steps=1, ode_steps=1, noise_std=beta,
                                            grad_clip=grad_clip)
        return kernel(jax.random.key(4), solvers.init(z), prob)[0].z

    free, clipped = one(None), one(clip)
    np.testing.assert_allclose(free - clipped,
                               -eta / (2 * beta ** 2) * (g - jnp.clip(g, -clip, clip)),
                               rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(one(1e6), free, rtol=1e-6, atol=1e-7)


# --------------------------------------------------------------------------- bad input


@pytest.mark.parametrize("kw,error,match", [
    (dict(step_size=0.0), ValueError, "step_size"),
    (dict(step_size=-1e-4), ValueError, "step_size"),
    (dict(langevin_steps=-1), ValueError, "langevin_steps"),
    (dict(langevin_steps=2.5), TypeError, "langevin_steps"),
    (dict(ode_steps=0), ValueError, "ode_steps"),
    (dict(ode_steps=True), TypeError, "ode_steps"),
    (dict(noise_std=0.0), ValueError, "noise_std"),
    (dict(noise_std=float("nan")), ValueError, "noise_std"),
    (dict(min_step_ratio=0.0), ValueError, "min_step_ratio"),
    (dict(min_step_ratio=1.5), ValueError, "min_step_ratio"),
    (dict(prior_std="exact"), ValueError, "prior_std"),
    (dict(grad_clip=0.0), ValueError, "grad_clip"),
    (dict(corrector="mclc"), TypeError, "corrector"),
    (dict(num_steps=10_000), ValueError, "num_steps"),
    (dict(t_max=1000), ValueError, "t_max"),
    (dict(z_init=jnp.zeros(D + 1)), ValueError, "z_init"),
])
def test_bad_arguments_name_the_argument(gauss, kw, error, match):
    _, _, prob = gauss
    with pytest.raises(error, match=match):
        M.latent_daps(jax.random.key(0), prob, **kw)
    if "z_init" in kw:  # the driver's only
        return
    with pytest.raises(error, match=match):
        M.latent_daps_sampler(prob, **kw)
    if not {"num_steps", "t_max"} & set(kw):  # the sampler's and the driver's only
        with pytest.raises(error, match=match):
            M.build_latent_daps_kernel(ddim_timesteps(prob.alpha_bars.shape[0], 4), **kw)


def test_bad_problem_timesteps_and_position(gauss):
    _, _, prob = gauss
    with pytest.raises(TypeError, match="problem"):
        M.latent_daps(jax.random.key(0), (prob,))
    with pytest.raises(ValueError, match="measurement"):
        M.latent_daps(jax.random.key(0), prob._replace(measurement=jnp.zeros((K_MEAS, 1))))
    with pytest.raises(ValueError, match="timesteps"):
        M.build_latent_daps_kernel(np.array([0, 10], np.int32))
    with pytest.raises(TypeError, match="num_steps"):
        M.latent_daps_sampler(prob, num_steps=5.0)
    with pytest.raises(ValueError, match="position"):
        M.latent_daps_sampler(prob, num_steps=3).init(jnp.zeros(D + 1))
