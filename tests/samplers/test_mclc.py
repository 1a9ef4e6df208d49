"""MCLC (arXiv 2601.04791) and the latent solvers on the linear-Gaussian latent model, whose
posterior is closed-form: invariance of the posterior (moment errors shrink with the step),
KL reduction from a perturbed ensemble, a non-increasing residual per corrector step, the
solvers under jit/vmap (with the image operators of ``samplers.inverse``), bad inputs."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxlib_ext.samplers import inverse
from jaxlib_ext.samplers import mclc as M

D, N_PIX, K_MEAS = 4, 6, 2


@pytest.fixture(scope="module")
def gauss():
    """Model, measurement and its problem (orthonormal pullback: ``A W`` has orthonormal
    rows)."""
    model = M.linear_gaussian_model(jax.random.key(0), D, N_PIX, K_MEAS, 0.1)
    _, _, y = model.sample_measurement(jax.random.key(100))
    return model, y, model.problem(y)


def _whitened_error(samples, mean, cov):
    """``||L^-1 (m - mean)|| + ||L^-1 C L^-T - I||_F`` with ``cov = L L^T``."""
    m, c = samples.mean(0), jnp.cov(samples.T)
    li = jnp.linalg.inv(jnp.linalg.cholesky(cov))
    return float(jnp.linalg.norm(li @ (m - mean)) + jnp.linalg.norm(li @ c @ li.T - jnp.eye(D)))


def _draw(key, mean, cov, n):
    return mean + jax.random.normal(key, (n, mean.shape[0])) @ jnp.linalg.cholesky(cov).T


def _ensemble_kl(samples, mean, cov):
    return M.gaussian_kl(samples.mean(0), jnp.cov(samples.T), mean, cov)


def test_corrector_leaves_posterior_invariant_error_shrinks_with_step(gauss):
    """8000 exact draws of the level-0 posterior, corrected for a time of 3 (``K eta = 3``,
    about two relaxation times) with the retraction option (``constraint="tangent"``): the
    whitened moment error shrinks with the step, toward 0.08 for the exact draws themselves
    (Monte Carlo). The published projection alone does not keep the posterior (see the KL
    test): its second-order rise of the residual accumulates."""
    model, y, prob = gauss
    mean, cov = model.posterior(y, 0)
    zs = _draw(jax.random.key(2), mean, cov, 8000)
    keys = jax.random.split(jax.random.key(3), zs.shape[0])
    errs = {}
    for eta in (0.1, 0.01):
        k = int(round(3 / eta))
        run = jax.jit(jax.vmap(lambda key, z, k=k, eta=eta: M.mclc_correct(
            key, z, 0, prob, num_steps=k, step_size=eta, constraint="tangent")))
        out, info = run(keys, zs)
        assert out.shape == zs.shape and info.residual.shape == (zs.shape[0], k)
        errs[eta] = _whitened_error(out, mean, cov)
    assert errs[0.01] < 0.2, errs
    assert errs[0.1] > 2 * errs[0.01], errs


def test_corrector_reduces_kl_from_perturbed_ensemble(gauss):
    """Exact draws moved within the level sets of the residual (the null space of ``A W``:
    shifted by 1.5 and spread by 3x there) return to the posterior with the retraction option
    (``constraint="tangent"``, the SNR rule with the norms averaged over the chains); plain
    Langevin (``constraint="none"``) drifts to the prior, and so does the published projection
    alone: each step raises the residual to second order and nothing brings it back."""
    model, y, prob = gauss
    mean, cov = model.posterior(y, 0)
    zs = _draw(jax.random.key(4), mean, cov, 4000)
    _, _, vt = np.linalg.svd(np.asarray(model.operator_matrix @ model.decoder_matrix))
    null = jnp.asarray(vt[K_MEAS:].T @ vt[K_MEAS:], jnp.float32)  # projector on ker(A W)
    shift = null @ jnp.full((D,), 1.5)
    pert = zs + 2.0 * (zs - mean) @ null + shift
    kl0 = _ensemble_kl(pert, mean, cov)
    keys = jax.random.split(jax.random.key(5), pert.shape[0])
    out = {}
    for c in ("tangent", "projection", "none"):
        run = jax.jit(jax.vmap(lambda key, z, c=c: M.mclc_correct(
            key, z, 0, prob, num_steps=300, step_rule="snr", snr=0.16, constraint=c,
            axis_name="chains")[0], axis_name="chains"))
        out[c] = _ensemble_kl(run(keys, pert), mean, cov)
    assert kl0 > 2.0, kl0
    assert out["tangent"] < 0.05 * kl0, (kl0, out)
    assert out["none"] > 5 * out["tangent"], (kl0, out)
    assert out["projection"] > kl0, (kl0, out)


@pytest.mark.parametrize("constraint", ["tangent", "compensate"])
@pytest.mark.parametrize("t", [0, pytest.param(400, marks=pytest.mark.slow)])  # a level sweep
def test_residual_non_increasing_per_corrector_step(constraint, t):
    """Every corrector step, every chain: ``r_{k+1} <= r_k`` up to float32 round-off (the
    Gauss-Newton model is exact for this affine model); plain Langevin raises it by O(1)."""
    model = M.linear_gaussian_model(jax.random.key(1), D, N_PIX, 3, 0.05,
                                    orthonormal_pullback=False)
    _, _, y = model.sample_measurement(jax.random.key(7))
    prob = model.problem(y)
    zs = jax.random.normal(jax.random.key(8), (300, D))
    res = jax.jit(jax.vmap(lambda z: M.measurement_residual(prob, z, t)))

    def steps(c):
        def one(z, key):
            z = jax.vmap(lambda k, zz: M.mclc_correct(k, zz, t, prob, constraint=c,
                                                      step_rule="snr")[0])(
                jax.random.split(key, z.shape[0]), z)
            return z, res(z)

        _, rs = jax.lax.scan(one, zs, jax.random.split(jax.random.key(9), 25))
        return jnp.concatenate([res(zs)[None], rs])

    rs = jax.jit(steps, static_argnums=0)(constraint)
    tol = 1e-4 * (1.0 + float(jnp.linalg.norm(y)))
    assert float(jnp.max(rs[1:] - rs[:-1])) <= tol
    free = jax.jit(steps, static_argnums=0)("none")
    assert float(jnp.max(free[1:] - free[:-1])) > 100 * tol
    if constraint == "compensate":  # keeps the steps that lower the residual
        assert float(jnp.mean(rs[-1] - rs[0])) < -tol


def test_projection_raises_the_residual_only_to_second_order():
    """The published projection removes the residual's first-order change: for this affine
    model ``r^2`` grows by exactly ``||J u||^2 >= 0`` per step, so the increase is positive and
    shrinks like the squared step (4x smaller at a 4x smaller ``eta``)."""
    model = M.linear_gaussian_model(jax.random.key(1), D, N_PIX, 3, 0.05,
                                    orthonormal_pullback=False)
    _, _, y = model.sample_measurement(jax.random.key(7))
    prob = model.problem(y)
    zs = jax.random.normal(jax.random.key(8), (2000, D))
    keys = jax.random.split(jax.random.key(9), zs.shape[0])
    res = jax.vmap(lambda z: M.measurement_residual(prob, z, 0))
    rise = {}
    for eta in (4e-3, 1e-3):
        out, info = jax.jit(jax.vmap(lambda k, z, eta=eta: M.mclc_correct(
            k, z, 0, prob, step_size=eta)))(keys, zs)
        up = res(out) - res(zs)
        assert float(jnp.min(up)) > -1e-4, eta
        assert not bool(jnp.any(info.rejected))
        np.testing.assert_allclose(info.squared_step[:, 0],
                                   jnp.sum((out - zs) ** 2, axis=1), rtol=1e-4)
        rise[eta] = float(jnp.mean(up))
    assert 3.0 < rise[4e-3] / rise[1e-3] < 5.0, rise


def test_default_step_follows_the_variance_rule_and_the_bound_warns(gauss):
    model, y, prob = gauss
    z = jnp.zeros(D)
    t = 10
    info = M.mclc_correct(jax.random.key(0), z, t, prob, num_steps=2)[1]
    np.testing.assert_allclose(info.step_size, (1 - prob.alpha_bars[t]) / (4 * D), rtol=1e-5)
    info = M.mclc_correct(jax.random.key(0), z, t, prob, step_scale=0.01)[1]
    np.testing.assert_allclose(info.step_size, 0.01 * (1 - prob.alpha_bars[t]), rtol=1e-5)
    sched = jnp.linspace(1e-3, 2e-3, prob.alpha_bars.shape[0])
    info = M.mclc_correct(jax.random.key(0), z, t, prob, step_size=sched)[1]
    np.testing.assert_allclose(info.step_size, sched[t], rtol=1e-6)
    with pytest.warns(M.StepBoundWarning, match="consistency bound"):
        M.mclc_correct(jax.random.key(0), z, t, prob, step_scale=1.0)
    with pytest.raises(ValueError, match="step_size: a schedule"):
        M.mclc_correct(jax.random.key(0), z, t, prob, step_size=jnp.full((3,), 1e-3))
    d, one_minus = 196, 0.5
    assert M.expected_squared_step(2 * 0.16 ** 2 * one_minus, one_minus, d) > 1.0


def test_corrector_info_and_custom_constraint(gauss):
    model, y, prob = gauss
    z = jnp.zeros(D)
    calls = []

    def keep(delta, lin):
        calls.append(1)
        return M.no_constraint(delta, lin)

    z1, info = M.mclc_correct(jax.random.key(0), z, 10, prob, num_steps=3, constraint=keep)
    z2, _ = M.mclc_correct(jax.random.key(0), z, 10, prob, num_steps=3, constraint="none")
    assert calls and np.allclose(z1, z2)
    assert info.residual.shape == info.step_size.shape == info.rejected.shape == (3,)
    assert info.squared_step.shape == (3,)
    assert bool(jnp.all(info.step_size > 0))
    with pytest.warns(M.StepBoundWarning):  # a fixed eta is past the bound at low noise
        fixed = M.mclc_correct(jax.random.key(0), z, 10, prob, num_steps=2, step_size=0.05)[1]
    np.testing.assert_allclose(fixed.step_size, 0.05)


def _solver_fn(solver, prob, corrector, num_steps=12):
    """One compiled program per (solver, corrector): ``(keys, step_size) -> SolverResult``."""
    fn = M.latent_dps if solver == "dps" else M.psld
    return jax.jit(jax.vmap(lambda k, step: fn(k, prob, num_steps=num_steps, step_size=step,
                                               corrector=corrector), in_axes=(0, None)))


# PSLD runs by default in test_image_latents_with_degradation_operators: here a solver sweep
@pytest.mark.parametrize("solver", ["dps", pytest.param("psld", marks=pytest.mark.slow)])
def test_solvers_jit_vmap_nfe_and_guidance(gauss, solver):
    model, y, prob = gauss
    keys = jax.random.split(jax.random.key(11), 64)
    corrected = _solver_fn(solver, prob, M.mclc(2))
    out = corrected(keys, 0.5)
    assert out.z0.shape == (64, D) and out.x0.shape == (64, N_PIX)
    assert out.info.residual.shape == (64, 12) and out.info.timesteps.shape == (64, 12)
    assert int(out.info.nfe[0]) == 12 + 2 * 11
    assert out.info.corrector.residual.shape == (64, 11, 2)
    assert bool(jnp.all(jnp.isfinite(out.z0)))
    again = corrected(keys, 0.5)
    np.testing.assert_array_equal(np.asarray(again.z0), np.asarray(out.z0))
    uncorrected = _solver_fn(solver, prob, None)
    plain, weak = uncorrected(keys, 0.5), uncorrected(keys, 1e-6)
    assert plain.info.corrector is None and int(plain.info.nfe[0]) == 12
    # guidance pulls the reconstructions toward the measurement
    assert float(plain.info.final_residual.mean()) < 0.5 * float(weak.info.final_residual.mean())


def test_solver_z_init_and_deterministic_ddim(gauss):
    model, y, prob = gauss
    z_init = jnp.ones(D)
    a = M.latent_dps(jax.random.key(0), prob, num_steps=5, ddim_eta=0.0, z_init=z_init)
    b = M.latent_dps(jax.random.key(1), prob, num_steps=5, ddim_eta=0.0, z_init=z_init)
    np.testing.assert_allclose(a.z0, b.z0, rtol=1e-6)
    c = M.latent_dps(jax.random.key(0), prob, num_steps=5, t_max=600)
    np.testing.assert_array_equal(c.info.timesteps, [600, 450, 300, 150, 0])


def test_image_latents_with_degradation_operators():
    """An image-shaped latent, a linear (transposed-convolution-like) decoder to 8x8 images and
    the box-inpainting operator of ``samplers.inverse``; the Gaussian prior ``N(0, I)``
    (``eps*(z, t) = sqrt(1 - abar_t) z``). Adjoint check, both solvers, the corrector."""
    latent = (4, 4, 2)
    w = jax.random.normal(jax.random.key(0), (2, 2, 2, 1)) * 0.5

    def decoder(z):  # 2x upsampling: each latent pixel -> a 2x2 block
        x = jnp.einsum("hwc,ijco->hiwjo", z, w)
        return x.reshape(8, 8, 1)

    def encoder(x):  # the adjoint of the decoder, up to scale
        blocks = x.reshape(4, 2, 4, 2, 1)
        return jnp.einsum("hiwjo,ijco->hwc", blocks, w)

    ab = inverse.linear_schedule(200).alphas_cumprod

    def eps_model(z, t):
        return jnp.sqrt(1.0 - ab[t]) * z

    op = inverse.box_inpainting((8, 8, 1), 4)
    x_true = decoder(jax.random.normal(jax.random.key(1), latent))
    y = inverse.measure(jax.random.key(2), op, x_true, 0.05)
    prob = M.latent_inverse_problem(eps_model, decoder, op, y, ab, latent_shape=latent,
                                    encoder=encoder)
    for fn in (M.latent_dps, M.psld):
        out = jax.jit(jax.vmap(lambda k, fn=fn: fn(k, prob, num_steps=6, step_size=0.3,
                                                   corrector=M.mclc(1))))(
            jax.random.split(jax.random.key(3), 3))
        assert out.x0.shape == (3, 8, 8, 1) and bool(jnp.all(jnp.isfinite(out.x0)))
        assert int(out.info.nfe[0]) == 6 + 5


# --------------------------------------------------------------------------- bad input


def test_bad_measurement_shape(gauss):
    model, y, prob = gauss
    with pytest.raises(ValueError, match="measurement: expected shape"):
        model.problem(jnp.zeros(K_MEAS + 1))
    with pytest.raises(ValueError, match="measurement"):
        M.latent_dps(jax.random.key(0), prob._replace(measurement=jnp.zeros((K_MEAS, 1))))


def test_inconsistent_adjoint_is_rejected(gauss):
    model, y, _ = gauss
    a = model.operator_matrix
    args = (model.eps_model, model.decoder)
    with pytest.raises(ValueError, match="operator: the adjoint is inconsistent"):
        M.latent_inverse_problem(*args, (lambda x: a @ x, lambda u: 2.0 * a.T @ u), y,
                                 model.alpha_bars, latent_shape=(D,))
    with pytest.raises(ValueError, match="operator: adjoint maps"):
        M.latent_inverse_problem(*args, (lambda x: a @ x, lambda u: u), y, model.alpha_bars,
                                 latent_shape=(D,))
    with pytest.raises(TypeError, match="operator"):
        M.latent_inverse_problem(*args, a, y, model.alpha_bars, latent_shape=(D,))
    # the real operators pass
    inverse.check_adjoint(inverse.gaussian_blur((8, 8, 1), 1.0), (8, 8, 1))


@pytest.mark.parametrize("kw,match", [
    (dict(snr=0.0), "snr"), (dict(snr=-1.0), "snr"), (dict(snr=float("nan")), "snr"),
    (dict(step_size=0.0), "step_size"), (dict(step_size=-0.1), "step_size"),
    (dict(num_steps=0), "num_steps"), (dict(constraint="sideways"), "constraint"),
    (dict(step_scale=0.0), "step_scale"), (dict(step_scale=-1.0), "step_scale"),
    (dict(step_rule="adam"), "step_rule"), (dict(step_size=jnp.ones((2, 2))), "step_size"),
])
def test_bad_corrector_arguments(gauss, kw, match):
    _, _, prob = gauss
    with pytest.raises(ValueError, match=match):
        M.mclc(**kw)
    with pytest.raises(ValueError, match=match):
        M.mclc_correct(jax.random.key(0), jnp.zeros(D), 3, prob, **kw)


def test_bad_problem_and_solver_arguments(gauss):
    model, y, prob = gauss
    base = (model.eps_model, model.decoder, model.operator, y)
    with pytest.raises(ValueError, match="alpha_bars"):
        M.latent_inverse_problem(*base, jnp.linspace(0.1, 0.9, 10), latent_shape=(D,))
    with pytest.raises(ValueError, match="alpha_bars"):
        M.latent_inverse_problem(*base, jnp.linspace(1.5, 0.1, 10), latent_shape=(D,))
    with pytest.raises(ValueError, match="eps_model"):
        M.latent_inverse_problem(lambda z, t: z[:2], *base[1:], model.alpha_bars,
                                 latent_shape=(D,))
    with pytest.raises(ValueError, match="z: expected shape"):
        M.mclc_correct(jax.random.key(0), jnp.zeros(D + 1), 3, prob)
    with pytest.raises(ValueError, match="problem: psld needs an encoder"):
        M.psld(jax.random.key(0), prob._replace(encoder=None))
    with pytest.raises(ValueError, match="num_steps"):
        M.latent_dps(jax.random.key(0), prob, num_steps=10_000)
    with pytest.raises(ValueError, match="step_size"):
        M.latent_dps(jax.random.key(0), prob, step_size=0.0)
    with pytest.raises(ValueError, match="t_max"):
        M.psld(jax.random.key(0), prob, t_max=1000)
    with pytest.raises(ValueError, match="num_steps"):
        M.psld(jax.random.key(0), prob, num_steps=20, t_max=10)
    with pytest.raises(ValueError, match="ddim_eta"):
        M.psld(jax.random.key(0), prob, ddim_eta=1.5)
    with pytest.raises(ValueError, match="z_init"):
        M.latent_dps(jax.random.key(0), prob, z_init=jnp.zeros(D + 2))
    with pytest.raises(TypeError, match="corrector"):
        M.latent_dps(jax.random.key(0), prob, corrector="mclc")
    with pytest.raises(TypeError, match="problem"):
        M.latent_dps(jax.random.key(0), (prob,))


def test_pca_latent_prior_denoiser_is_exact_and_round_trips():
    """On digits: the decoder inverts the encoder on the span; the denoiser is the exact
    ``E[eps | z_t]`` (checked against (G.1) with the diagonal prior covariance); bad ``dim``."""
    ims = np.asarray(jax.random.uniform(jax.random.key(0), (40, 6, 6, 1)))
    p = M.pca_latent_prior(ims, 5, 100)
    z = jnp.arange(5.0) / 5
    np.testing.assert_allclose(p.encoder(p.decoder(z)), z, atol=1e-5)
    model = M.LinearGaussianLatentModel(
        jnp.zeros(5), jnp.diag(p.variances), p.basis, p.mean.reshape(-1), jnp.eye(36)[:2],
        0.1, p.alpha_bars, p.variances, jnp.eye(5))
    for t in (0, 50, 99):
        np.testing.assert_allclose(p.eps_model(z, t), model.eps_model(z, t), rtol=1e-5,
                                   atol=1e-6)
    with pytest.raises(ValueError, match="dim"):
        M.pca_latent_prior(ims, 40)
    with pytest.raises(ValueError, match="images"):
        M.pca_latent_prior(ims[..., 0], 3)
