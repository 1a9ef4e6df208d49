"""SMC weight and resampling functions under ``jit`` with the weights closed over as
constants: the same numbers as eager, the value checks still run on the known values, and
only the shape checks on traced arguments."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxlib_ext.samplers.smc import resampling, weights

LOG_W = jnp.log(jnp.array([0.1, 0.2, 0.3, 0.4]))


@pytest.mark.parametrize("fn", [weights.normalize, weights.weights, weights.ess,
                                weights.check_log_weights])
def test_weight_functions_take_closed_over_constants_under_jit(fn):
    np.testing.assert_allclose(jax.jit(lambda: fn(LOG_W))(), fn(LOG_W), rtol=1e-6)
    np.testing.assert_allclose(jax.jit(fn)(LOG_W), fn(LOG_W), rtol=1e-6)  # traced


@pytest.mark.parametrize("scheme", sorted(resampling.SCHEMES))
def test_resampling_takes_closed_over_constants_under_jit(scheme):
    key, w = jax.random.key(0), jax.nn.softmax(LOG_W)
    eager = resampling.SCHEMES[scheme](key, w, 4)
    np.testing.assert_array_equal(jax.jit(lambda: resampling.SCHEMES[scheme](key, w, 4))(),
                                  eager)
    particles = jnp.arange(8.0).reshape(4, 2)
    new, lw, idx = jax.jit(lambda: resampling.resample(key, particles, LOG_W, scheme))()
    ref = resampling.resample(key, particles, LOG_W, scheme)
    np.testing.assert_array_equal(idx, ref[2])
    np.testing.assert_array_equal(new, ref[0])
    np.testing.assert_allclose(lw, np.full(4, -np.log(4)), rtol=1e-6)


def test_known_bad_values_still_raise_under_jit():
    bad_log_w = jnp.array([0.0, jnp.nan, -1.0])
    with pytest.raises(ValueError, match="log_weights: non-finite"):
        jax.jit(lambda: weights.ess(bad_log_w))()
    bad_w = jnp.array([0.5, 0.6])
    with pytest.raises(ValueError, match="weights: must sum to 1"):
        jax.jit(lambda: resampling.systematic(jax.random.key(0), bad_w, 2))()
    # traced: the values are unknown, only the shape is checked
    assert np.isnan(jax.jit(weights.ess)(bad_log_w))
    with pytest.raises(ValueError, match="log_weights: expected shape"):
        jax.jit(weights.ess)(jnp.zeros((2, 2)))


def test_sosmc_particle_check_takes_closed_over_constants_under_jit():
    from jaxlib_ext.samplers.smc.sosmc import check_particles

    particles = jnp.arange(8.0).reshape(4, 2)
    np.testing.assert_array_equal(jax.jit(lambda: check_particles(particles, 4))(), particles)
    bad = particles.at[0, 0].set(jnp.nan)
    with pytest.raises(ValueError, match="particles: non-finite"):
        jax.jit(lambda: check_particles(bad, 4))()
