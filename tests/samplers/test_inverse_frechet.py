"""The Fréchet distance between feature sets against its closed forms and scipy's matrix square
root, its invariances and its input checks."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxlib_ext.samplers.inverse import (
    frechet_distance,
    frechet_distance_from_statistics,
    gaussian_statistics,
)


def _features(seed, n=400, f=12, shift=0.0):
    """Correlated features: Gaussian rows through a random mixing matrix, plus ``shift``."""
    rng = np.random.default_rng(seed)
    mix = rng.normal(size=(f, f)) / np.sqrt(f)
    return (rng.normal(size=(n, f)) @ mix + shift).astype(np.float32)


def test_statistics_are_the_mean_and_unbiased_covariance():
    x = _features(0, n=50, f=5).astype(np.float64)
    mean, cov = gaussian_statistics(x)
    np.testing.assert_allclose(mean, x.mean(0), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(cov, np.cov(x, rowvar=False), rtol=1e-4, atol=1e-6)
    assert mean.shape == (5,) and cov.shape == (5, 5)


def test_zero_on_identical_sets_and_symmetric():
    a, b = _features(1), _features(2, n=300, shift=0.5)
    scale = float(np.trace(np.cov(a, rowvar=False)))
    assert abs(float(frechet_distance(a, a))) <= 1e-5 * scale
    d_ab, d_ba = float(frechet_distance(a, b)), float(frechet_distance(b, a))
    assert d_ab > 0.1
    np.testing.assert_allclose(d_ab, d_ba, rtol=1e-4)


def test_closed_form_of_diagonal_gaussians():
    """``sum (mu_a - mu_b)^2 + sum (sqrt(a) - sqrt(b))^2`` for diagonal covariances ``a, b``,
    given as statistics and as feature sets with exactly those statistics."""
    rng = np.random.default_rng(3)
    f = 6
    mu_a, mu_b = rng.normal(size=f), rng.normal(size=f)
    var_a, var_b = rng.uniform(0.1, 3.0, f), rng.uniform(0.1, 3.0, f)
    want = np.sum((mu_a - mu_b) ** 2) + np.sum((np.sqrt(var_a) - np.sqrt(var_b)) ** 2)
    got = frechet_distance_from_statistics(mu_a, np.diag(var_a), mu_b, np.diag(var_b))
    np.testing.assert_allclose(float(got), want, rtol=1e-5)

    # 2f rows +-sqrt(f var) e_i: mean 0, covariance exactly var (unbiased: 2f - 1 below)
    def rows(mu, var):
        e = np.diag(np.sqrt(var * (2 * f - 1) / 2))
        return np.concatenate([e, -e]) + mu

    got = frechet_distance(rows(mu_a, var_a), rows(mu_b, var_b))
    np.testing.assert_allclose(float(got), want, rtol=1e-5)


def test_matches_scipy_sqrtm_on_full_covariances():
    linalg = pytest.importorskip("scipy.linalg")
    a, b = _features(4, n=500, f=16), _features(5, n=350, f=16, shift=0.2)
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    ca, cb = np.cov(a64, rowvar=False), np.cov(b64, rowvar=False)
    want = (np.sum((a64.mean(0) - b64.mean(0)) ** 2) + np.trace(ca) + np.trace(cb)
            - 2 * np.trace(linalg.sqrtm(ca @ cb).real))
    np.testing.assert_allclose(float(frechet_distance(a, b)), want, rtol=1e-4)
    np.testing.assert_allclose(float(jax.jit(frechet_distance)(a, b)), want, rtol=1e-4)


def test_float64_when_enabled():
    a, b = _features(6, f=8).astype(np.float64), _features(7, f=8).astype(np.float64)
    with jax.enable_x64(True):
        d = frechet_distance(a, b)
        assert d.dtype == jnp.float64
        assert abs(float(frechet_distance(a, a))) < 1e-10
    assert frechet_distance(a.astype(np.float32), b.astype(np.float32)).dtype == jnp.float32


def test_a_translation_adds_its_squared_norm():
    """Between sets of one mean a shift ``s`` of one set adds ``||s||^2``; a shift of both
    changes nothing (up to float32 rounding of the traces)."""
    a, b = _features(8), _features(9, n=300)
    b = b - b.mean(0) + a.mean(0)
    shift = np.linspace(-1.0, 1.0, a.shape[1]).astype(np.float32)
    tol = dict(rtol=1e-4, atol=2e-4 * float(np.trace(np.cov(a, rowvar=False))))
    base = float(frechet_distance(a, b))
    np.testing.assert_allclose(float(frechet_distance(a, b + shift)) - base,
                               float(np.sum(shift ** 2)), **tol)
    np.testing.assert_allclose(float(frechet_distance(a, a + shift)), float(np.sum(shift ** 2)),
                               **tol)
    np.testing.assert_allclose(float(frechet_distance(a + shift, b + shift)), base, **tol)


@pytest.mark.parametrize("a_shape,b_shape,name", [
    ((10,), (10, 4), "features_a"),
    ((10, 4), (3, 4, 1), "features_b"),
    ((1, 4), (10, 4), "features_a"),
    ((10, 4), (1, 4), "features_b"),
    ((10, 4), (10, 5), "features_b"),
])
def test_bad_feature_sets_are_named(a_shape, b_shape, name):
    with pytest.raises(ValueError, match=f"^{name}:"):
        frechet_distance(np.zeros(a_shape), np.zeros(b_shape))


def test_bad_statistics_are_named():
    with pytest.raises(ValueError, match="^features:"):
        gaussian_statistics(np.zeros((1, 3)))
    m, c = np.zeros(3), np.eye(3)
    with pytest.raises(ValueError, match="^cov_a:"):
        frechet_distance_from_statistics(m, np.eye(2), m, c)
    with pytest.raises(ValueError, match="^mean_b:"):
        frechet_distance_from_statistics(m, c, np.zeros(2), np.eye(2))
    with pytest.raises(ValueError, match="^mean_a:"):
        frechet_distance_from_statistics(np.zeros((3, 1)), c, m, c)
