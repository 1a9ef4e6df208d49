"""models.diffusion: the schedules, Tweedie's estimate, DDIM against the ancestral step and
against a Gaussian oracle, the DDIM timesteps, bad input."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxlib_ext.models import diffusion as df

# --------------------------------------------------------------------------- schedules


@pytest.mark.parametrize("kind", df.SCHEDULES)
def test_schedule_properties(kind):
    s = df.make_schedule(1000, kind)
    b, a, abar = (np.asarray(v, np.float64) for v in s)
    assert b.shape == a.shape == abar.shape == (1000,)
    assert np.all(b > 0) and np.all(b <= 0.999 + 1e-6)
    np.testing.assert_allclose(a, 1 - b, atol=1e-7)
    np.testing.assert_allclose(abar, np.cumprod(a), rtol=1e-4)
    assert np.all(np.diff(abar) < 0)
    assert abar[0] > 0.999 and abar[-1] < 1e-4
    if kind == "linear":
        np.testing.assert_allclose(b[[0, -1]], [1e-4, 0.02], rtol=1e-5)
    else:  # arXiv 2102.09672 Eq. 17: abar_t = f(t) / f(0)
        f = lambda u: np.cos((u + 0.008) / 1.008 * np.pi / 2) ** 2
        t = np.array([1, 250, 500, 750])
        np.testing.assert_allclose(abar[t - 1], f(t / 1000) / f(0), rtol=1e-4)


def test_linear_schedule_is_ddpms_and_make_schedule_scales_it_with_t():
    """At T = 1000 both linear schedules are Ho et al.'s betas 1e-4 ... 0.02; for another T
    make_schedule scales both ends by 1000 / T and linear_schedule keeps them."""
    for a, b in zip(df.linear_schedule(1000), df.make_schedule(1000, "linear")):
        np.testing.assert_array_equal(a, b)
    plain, scaled = df.linear_schedule(200), df.make_schedule(200, "linear")
    np.testing.assert_allclose(np.asarray(plain.betas)[[0, -1]], [1e-4, 0.02], rtol=1e-6)
    np.testing.assert_allclose(np.asarray(scaled.betas)[[0, -1]], [5e-4, 0.1], rtol=1e-6)
    betas = np.linspace(1e-4, 2e-2, 200)
    np.testing.assert_array_equal(plain.alphas_cumprod,
                                  np.cumprod(1.0 - betas).astype(np.float32))
    assert df.linear_schedule(1).betas.shape == (1,)


def test_alpha_bar_indexes_the_schedule_with_one_for_the_clean_latent():
    s = df.make_schedule(50, "cosine")
    t = jnp.array([[0, 49], [-1, 10]])
    a = df.alpha_bar(s, t)
    assert a.shape == (2, 2)
    np.testing.assert_array_equal(a, [[s.alphas_cumprod[0], s.alphas_cumprod[49]],
                                      [1.0, s.alphas_cumprod[10]]])


def test_q_sample_and_predict_z0_invert_each_other():
    s = df.make_schedule(50, "cosine")
    k1, k2 = jax.random.split(jax.random.key(0))
    z0, eps = jax.random.normal(k1, (4, 3, 3, 2)), jax.random.normal(k2, (4, 3, 3, 2))
    a = df.alpha_bar(s, jnp.array([0, 10, 30, 40])).reshape(-1, 1, 1, 1)
    zt = df.q_sample(z0, eps, a)
    np.testing.assert_allclose(df.predict_z0(zt, eps, a), z0, atol=1e-4)


# --------------------------------------------------------------------------- steps


def test_ddim_with_eta_one_is_the_ancestral_step():
    with jax.enable_x64(True):
        b = df.make_schedule(30, "linear").betas.astype(jnp.float64)
        s = df.Schedule(b, 1 - b, jnp.cumprod(1 - b))  # consistent to float64 precision
        keys = jax.random.split(jax.random.key(1), 3)
        z, eps, noise = (jax.random.normal(k, (5, 4, 4, 2), jnp.float64) for k in keys)
        for t in (29, 12, 1, 0):
            a_t, a_p = df.alpha_bar(s, t), df.alpha_bar(s, t - 1)
            z0 = df.predict_z0(z, eps, a_t)
            anc, mean = df.ancestral_step(s, z, eps, t, noise)
            np.testing.assert_allclose(df.ddim_step(z0, eps, a_t, a_p, 1.0, noise), anc,
                                       atol=1e-12)
            # the same posterior mean (noise off in both)
            np.testing.assert_allclose(df.ddim_step(z0, eps, a_t, a_p, 1.0, jnp.zeros_like(z)),
                                       mean, atol=1e-12)
        # the last step lands on Tweedie's estimate, with no noise
        z0 = df.predict_z0(z, eps, df.alpha_bar(s, 0))
        np.testing.assert_allclose(df.ddim_step(z0, eps, df.alpha_bar(s, 0), 1.0, 0.7, noise), z0,
                                   atol=1e-12)


def test_ddim_sigma_is_eq_16_and_zero_where_the_levels_meet():
    """sigma of Eq. 16 (arXiv 2010.02502) against its single-square-root form in float64, and
    no NaN when round-off puts abar above abar'."""
    with jax.enable_x64(True):
        ab = np.asarray(df.make_schedule(100, "cosine").alphas_cumprod, np.float64)
        z0, eps = jnp.zeros(3, jnp.float64), jnp.zeros(3, jnp.float64)
        noise = jnp.ones(3, jnp.float64)  # the step returns sigma * noise
        for t, tp in ((99, 60), (60, 59), (10, 0)):
            a, ap = ab[t], ab[tp]
            sigma = 0.6 * np.sqrt((1 - ap) / (1 - a) * (1 - a / ap))
            np.testing.assert_allclose(df.ddim_step(z0, eps, a, ap, 0.6, noise), sigma,
                                       rtol=1e-12)
        out = df.ddim_step(z0, eps, 0.5 + 1e-12, 0.5, 1.0, noise)
        np.testing.assert_array_equal(out, 0.0)


@pytest.mark.parametrize("sampler", ["ddim", "ancestral"])
def test_samplers_with_the_exact_noise_model_of_gaussian_data(sampler):
    """z_0 ~ N(0, v I): the exact eps-hat is sqrt(1 - abar) z / (abar v + 1 - abar), every step
    is linear in z, so the variance after each step follows a scalar recursion (float64); the
    sampled variance must match it, and end near v."""
    v, n, d, T = 0.25, 4000, 8, 200
    s = df.make_schedule(T, "cosine")
    if sampler == "ddim":
        ts = df.ddim_timesteps(T, 40)
        tp = np.r_[ts[1:], -1]
    else:
        ts, tp = np.arange(T - 1, -1, -1), np.arange(T - 2, -2, -1)

    abar = np.r_[np.asarray(s.alphas_cumprod, np.float64), 1.0]  # abar[-1] = 1: clean
    var = 1.0
    for t, p in zip(ts, tp):
        a_t, a_p = abar[t], abar[p]
        gain = 1.0 / (a_t * v + 1 - a_t)  # z0_hat = sqrt(a_t) v gain z, eps = sqrt(1-a_t) gain z
        if sampler == "ddim":
            c = (np.sqrt(a_p * a_t) * v + np.sqrt((1 - a_p) * (1 - a_t))) * gain
            var = c**2 * var
        else:
            beta, alpha = 1 - a_t / a_p, a_t / a_p
            c = (1 - beta / np.sqrt(1 - a_t) * np.sqrt(1 - a_t) * gain) / np.sqrt(alpha)
            var = c**2 * var + (1 - a_p) / (1 - a_t) * beta

    def run(key):
        k0, kloop = jax.random.split(key)
        z = jax.random.normal(k0, (n, 1, 1, d))

        def body(z, inp):
            t, t_prev, k = inp
            a = df.alpha_bar(s, t)
            eps = jnp.sqrt(1 - a) * z / (a * v + 1 - a)
            noise = jax.random.normal(k, z.shape)
            if sampler == "ddim":
                z0 = df.predict_z0(z, eps, a)
                return df.ddim_step(z0, eps, a, df.alpha_bar(s, t_prev), 0.0, noise), None
            return df.ancestral_step(s, z, eps, t, noise)[0], None

        keys = jax.random.split(kloop, len(ts))
        return jax.lax.scan(body, z, (jnp.asarray(ts), jnp.asarray(tp), keys))[0]

    z = jax.jit(run)(jax.random.key(2))
    assert abs(float(jnp.var(z)) / var - 1) < 0.04, (float(jnp.var(z)), var)
    assert abs(var / v - 1) < 0.15  # DDIM's deterministic steps shrink the variance a little
    assert abs(float(jnp.mean(z))) < 0.02


def test_clip_eps_bounds_tweedies_estimate():
    s = df.make_schedule(1000, "cosine")
    k1, k2 = jax.random.split(jax.random.key(4))
    z, eps = jax.random.normal(k1, (3, 2, 2, 1)), jax.random.normal(k2, (3, 2, 2, 1))
    a = df.alpha_bar(s, jnp.array([999, 500, 10])).reshape(-1, 1, 1, 1)
    np.testing.assert_array_equal(df.clip_eps(z, eps, a, None), eps)
    clipped = df.clip_eps(z, eps, a, 4.0)
    z0 = df.predict_z0(z, clipped, a)
    assert float(jnp.abs(z0).max()) <= 4.0 + 1e-2
    # inside the bound nothing changes
    inside = df.clip_eps(z, eps, a, 1e6)
    np.testing.assert_allclose(inside[1:], eps[1:], atol=1e-4)


# --------------------------------------------------------------------------- timesteps


def test_ddim_timesteps():
    np.testing.assert_array_equal(df.ddim_timesteps(10, 10), np.arange(9, -1, -1))
    ts = df.ddim_timesteps(1000, 50)
    assert len(ts) == 50 and ts[0] == 999 and ts[-1] == 0 and np.all(np.diff(ts) < 0)
    assert ts.dtype == np.int32
    np.testing.assert_array_equal(df.ddim_timesteps(1000, 5, t_max=600), [600, 450, 300, 150, 0])
    # one step starts at the noisiest level, where z ~ N(0, I) is the law
    np.testing.assert_array_equal(df.ddim_timesteps(20, 1), [19])
    np.testing.assert_array_equal(df.ddim_timesteps(20, 1, t_max=7), [7])
    for bad in (0, 11, 2.0):
        with pytest.raises(ValueError, match="num_steps"):
            df.ddim_timesteps(10, bad)
    for bad in (-1, 10, 3.0):
        with pytest.raises(ValueError, match="t_max"):
            df.ddim_timesteps(10, 2, t_max=bad)
    with pytest.raises(ValueError, match="num_steps"):
        df.ddim_timesteps(10, 5, t_max=3)


def test_ddim_timesteps_is_the_descending_linspace_on_a_grid():
    """round(linspace(t_max, 0, n)), distinct and descending, for every n <= t_max + 1; it
    differs from reversing the ascending linspace only where n = 1 or at exact half-integer
    spacings (float round-off on either side of the tie)."""
    from fractions import Fraction

    for T in (2, 7, 26, 30, 50, 101):
        for t_max in sorted({T - 1, T // 2, 1}):
            for n in range(1, t_max + 2):
                ts = df.ddim_timesteps(T, n, t_max=t_max)
                np.testing.assert_array_equal(ts, np.round(np.linspace(t_max, 0, n)))
                assert ts[0] == t_max and ts[-1] == (0 if n > 1 else t_max)
                assert np.all(np.diff(ts) < 0)
                ascending = np.round(np.linspace(0, t_max, n))[::-1]
                for i in np.nonzero(ts != ascending)[0]:
                    assert n == 1 or Fraction(t_max * (n - 1 - int(i)), n - 1).denominator == 2


def test_bad_schedule_arguments():
    with pytest.raises(ValueError, match="kind"):
        df.make_schedule(10, "sigmoid")
    with pytest.raises(ValueError, match="timesteps"):
        df.make_schedule(1)
    with pytest.raises(ValueError, match="timesteps"):
        df.make_schedule(20, "linear")  # its last beta would be 1
    with pytest.raises(ValueError, match="timesteps"):
        df.linear_schedule(0)
    with pytest.raises(ValueError, match="beta_min, beta_max"):
        df.linear_schedule(10, 0.02, 0.01)
