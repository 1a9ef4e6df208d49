"""MCLC's kernels (arXiv 2601.04791): the solvers' and the corrector's ``init``/``build_kernel``
and their sampling algorithms on the linear-Gaussian latent toy. Own loops over the kernels
match the drivers, the last solver step runs no corrector, bad inputs.

The factories ``*_case`` are the MCLC lines of ``tests/samplers/test_kernels.py``: each returns
``(algorithm, initial_state)``.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxlib_ext.samplers import inverse
from jaxlib_ext.samplers import mclc as M
from jaxlib_ext.samplers.mclc import corrector, solvers

D = 4  # latent dimension of the toy


def _problem():
    model = M.linear_gaussian_model(jax.random.key(0), D, 6, 2, 0.1)
    _, _, y = model.sample_measurement(jax.random.key(100))
    return model.problem(y)


def _random_latent(algorithm):
    def initial_state(rng_key):
        return algorithm.init(jax.random.normal(rng_key, (D,)))

    return algorithm, initial_state


def latent_dps_case():
    """Latent DPS, 5 ancestral DDIM steps, one MCLC step after each but the last."""
    return _random_latent(M.latent_dps_sampler(_problem(), num_steps=5, step_size=0.5,
                                               corrector=M.mclc(1)))


def psld_case():
    """PSLD, 5 ancestral DDIM steps, no corrector."""
    return _random_latent(M.psld_sampler(_problem(), num_steps=5, step_size=0.5,
                                         gluing_weight=0.1))


def corrector_case():
    """The published corrector (C.2)-(C.3) at level 10."""
    return _random_latent(M.mclc_sampler(_problem(), 10))


@pytest.fixture(scope="module")
def prob():
    return _problem()


@pytest.mark.parametrize("solver, corrected", [
    ("latent_dps", True), ("psld", False), pytest.param("psld", True, marks=pytest.mark.slow)])
def test_own_loop_over_the_sampler_matches_the_driver(prob, solver, corrected):
    """``N`` steps of ``algorithm.step`` under ``lax.scan`` with the driver's keys give the
    driver's latent, residuals and corrector trace (to float32 round-off: the driver compiles
    its last step apart, with its index known)."""
    kw = dict(num_steps=6, step_size=0.5, corrector=M.mclc(2) if corrected else None)
    driver = getattr(M, solver)
    algorithm = getattr(M, f"{solver}_sampler")(prob, **kw)
    key = jax.random.key(3)

    @jax.jit
    def own_loop(key):
        k_init, k_steps, k_last = jax.random.split(key, 3)
        keys = jnp.concatenate([jax.random.split(k_steps, 5), k_last[None]])
        state = algorithm.init(jax.random.normal(k_init, (D,)))

        def body(state, k):
            return algorithm.step(k, state)

        return jax.lax.scan(body, state, keys)

    out = jax.jit(lambda k: driver(k, prob, **kw))(key)
    state, infos = own_loop(key)
    assert int(state.step) == 6
    np.testing.assert_allclose(state.z, out.z0, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(infos.residual, out.info.residual, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(infos.timestep, out.info.timesteps)
    if corrected:
        assert infos.corrector.residual.shape == (6, 2)
        np.testing.assert_allclose(infos.corrector.residual[:-1], out.info.corrector.residual,
                                   rtol=1e-5, atol=1e-6)
        # the last step runs no corrector: its info is zeros
        assert not np.any(np.asarray(infos.corrector.step_size[-1]))
    else:
        assert infos.corrector is None and out.info.corrector is None


def test_kernel_at_the_last_step_goes_to_the_clean_latent(prob):
    """At ``i = N - 1`` the kernel takes ``abar' = 1``: with ``ddim_eta = 0`` and no guidance
    to speak of it returns Tweedie's ``zhat_0`` (P.3), and the corrector does not run."""
    ts = inverse.ddim_timesteps(prob.alpha_bars.shape[0], 3)
    kernel = M.build_latent_dps_kernel(ts, step_size=1e-12, ddim_eta=0.0, corrector=M.mclc(1))
    z = jnp.linspace(-1.0, 1.0, D)
    state = solvers.init(z)._replace(step=jnp.asarray(2, jnp.int32))
    new, info = jax.jit(lambda k, s: kernel(k, s, prob))(jax.random.key(0), state)
    _, z0 = M.denoise(prob, z, int(ts[-1]))
    np.testing.assert_allclose(new.z, z0, rtol=1e-5, atol=1e-6)
    assert int(new.step) == 3 and int(info.timestep) == int(ts[-1])
    assert not np.any(np.asarray(info.corrector.step_size))


def test_corrector_sampler_matches_mclc_correct(prob):
    """``K`` steps of :func:`mclc_sampler`'s ``step`` with ``mclc_correct``'s keys give its
    latent and its per-step info; ``corrector.build_kernel`` is the same step."""
    z = jnp.linspace(-1.0, 1.0, D)
    keys = jax.random.split(jax.random.key(5), 3)
    algorithm = M.mclc_sampler(prob, 10, constraint="tangent")
    kernel = corrector.build_kernel(constraint="tangent")

    @jax.jit
    def own_loop(z):
        def body(state, k):
            return algorithm.step(k, state)

        return jax.lax.scan(body, algorithm.init(z), keys)

    z_ref, info_ref = jax.jit(lambda z: M.mclc_correct(jax.random.key(5), z, 10, prob,
                                                       num_steps=3, constraint="tangent"))(z)
    state, infos = own_loop(z)
    np.testing.assert_allclose(state.z, z_ref, rtol=1e-5, atol=1e-6)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6),
                 infos, info_ref)
    one, _ = jax.jit(lambda k, s: kernel(k, s, prob, 10))(keys[0], corrector.init(z))
    np.testing.assert_allclose(one.z, jax.jit(algorithm.step)(keys[0], algorithm.init(z))[0].z,
                               rtol=1e-6, atol=1e-7)


def test_bad_kernel_and_sampler_arguments(prob):
    ts = inverse.ddim_timesteps(prob.alpha_bars.shape[0], 4)
    with pytest.raises(ValueError, match="timesteps"):
        M.build_latent_dps_kernel(ts[::-1])
    with pytest.raises(ValueError, match="timesteps"):
        M.build_psld_kernel(np.zeros((2, 2), np.int32))
    with pytest.raises(ValueError, match="step_size"):
        M.build_latent_dps_kernel(ts, step_size=-1.0)
    with pytest.raises(ValueError, match="gluing_weight"):
        M.build_psld_kernel(ts, gluing_weight=-1.0)
    with pytest.raises(ValueError, match="ddim_eta"):
        M.build_psld_kernel(ts, ddim_eta=2.0)
    with pytest.raises(TypeError, match="corrector"):
        M.build_latent_dps_kernel(ts, corrector="mclc")
    with pytest.raises(ValueError, match="problem: psld needs an encoder"):
        M.psld_sampler(prob._replace(encoder=None))
    with pytest.raises(ValueError, match="position"):
        M.latent_dps_sampler(prob, num_steps=3).init(jnp.zeros(D + 1))
    with pytest.raises(ValueError, match="t: expected"):
        M.mclc_sampler(prob, prob.alpha_bars.shape[0])
    with pytest.raises(TypeError, match="problem"):
        M.mclc_sampler((prob,), 3)
    with pytest.raises(ValueError, match="constraint"):
        corrector.build_kernel(constraint="sideways")
    with pytest.raises(ValueError, match="z: expected shape"):
        M.mclc_sampler(prob, 3).init(jnp.zeros(D + 1))
