"""The SOSMC baselines (arXiv 2601.22003) against hand-written loops on the Gaussian MMLE toy:
SOUL with one chain (the authors' form) and ImpDiff in the authors' order (move, then the
gradient at the moved particles); the named options and bad arguments."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from jaxlib_ext.samplers import smc
from jaxlib_ext.samplers.smc import baselines

LR, H = 0.05, 0.1


def _toy():
    p = smc.gaussian_mmle()
    y = p.extra["y"]
    # U(theta, x) = 1/2 |x - theta|^2 + 1/2 |y - x|^2
    grad_x = lambda theta, x: (x - theta) - (y - x)  # noqa: E731
    grad_theta = lambda theta, x: jnp.sum(theta - x, axis=-1)  # noqa: E731
    return p, grad_x, grad_theta


def _ula(key, grad_x, theta, x):
    return x - H * grad_x(theta, x) + jnp.sqrt(2.0 * H) * jax.random.normal(key, x.shape)


@pytest.mark.parametrize("burn_in", [0, 3])
def test_soul_single_chain_matches_a_hand_written_loop(burn_in):
    """One chain, M ULA steps at theta_k per outer step, the gradient the mean of
    grad_theta U over the path after the burn-in, then SGD: same keys, float32 round-off."""
    p, grad_x, grad_theta = _toy()
    m, steps = 8, 12
    alg = smc.soul(p.potential, optax.sgd(LR), num_inner_steps=m, burn_in=burn_in, step_size=H)
    x0 = p.sample_initial(jax.random.key(0), 1)
    final, infos, params, _ = smc.run(jax.random.key(1), alg, alg.init((p.params0, x0)), steps)

    theta, x, thetas = p.params0, x0[0], []
    for key in jax.random.split(jax.random.key(1), steps):
        k_inner, _ = jax.random.split(key)
        path = []
        for k in jax.random.split(k_inner, m):
            x = _ula(jax.random.split(k, 1)[0], grad_x, theta, x)
            path.append(x)
        g = jnp.mean(jnp.stack([grad_theta(theta, xj) for xj in path[burn_in:]]))
        theta = theta - LR * g
        thetas.append(theta)
    np.testing.assert_allclose(np.asarray(params), np.asarray(thetas), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.asarray(final.particles[0]), np.asarray(x), rtol=1e-5,
                               atol=1e-5)
    assert final.particles.shape == x0.shape and bool(jnp.all(infos.ess == 1))


@pytest.mark.parametrize("order", ["move_first", "grad_first"])
def test_impdiff_order_matches_a_hand_written_loop(order):
    """``move_first`` (the authors'): X' = ULA_{theta_k}(X), g = mean grad_theta U_{theta_k}(X'),
    theta_{k+1} = theta_k - lr g. ``grad_first`` (ours): g at X, then the same move."""
    p, grad_x, grad_theta = _toy()
    n, steps = 16, 10
    alg = smc.impdiff(p.potential, optax.sgd(LR), num_particles=n, step_size=H, order=order)
    x0 = p.sample_initial(jax.random.key(3), n)
    final, _, params, _ = smc.run(jax.random.key(4), alg, alg.init((p.params0, x0)), steps)

    theta, x, thetas = p.params0, x0, []
    for key in jax.random.split(jax.random.key(4), steps):
        k_move, _ = jax.random.split(key)
        keys = jax.random.split(k_move, n)
        moved = jnp.stack([_ula(k, grad_x, theta, xi) for k, xi in zip(keys, x)])
        g = jnp.mean(grad_theta(theta, moved if order == "move_first" else x))
        theta, x = theta - LR * g, moved
        thetas.append(theta)
    np.testing.assert_allclose(np.asarray(params), np.asarray(thetas), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.asarray(final.particles), np.asarray(x), rtol=1e-5,
                               atol=1e-5)


def test_impdiff_orders_differ():
    """The two orders give different parameters from the first step on (same keys)."""
    p = smc.gaussian_mmle()
    x0 = p.sample_initial(jax.random.key(0), 8)
    out = {}
    for order in ("move_first", "grad_first"):
        alg = smc.impdiff(p.potential, optax.sgd(LR), num_particles=8, order=order)
        out[order] = float(alg.step(jax.random.key(1), alg.init((p.params0, x0)))[0].params)
    assert out["move_first"] != out["grad_first"]


def test_soul_persistent_chains_use_every_chain():
    """``num_chains=C`` (ours): C chains, the gradient over (M - b) C path points; with one
    inner step and no burn-in it is ImpDiff's ``move_first`` step."""
    p = smc.gaussian_mmle()
    n = 8
    x0 = p.sample_initial(jax.random.key(0), n)
    soul = smc.soul(p.potential, optax.sgd(LR), num_inner_steps=1, num_chains=n)
    imp = smc.impdiff(p.potential, optax.sgd(LR), num_particles=n)
    key = jax.random.key(5)
    a, _ = soul.step(key, soul.init((p.params0, x0)))
    # soul splits the step key into (k_inner, k_grad) and k_inner into M = 1 keys
    k_inner, _ = jax.random.split(key)
    b_state = imp.init((p.params0, x0))
    moved = jax.vmap(lambda k, x: smc.ula(k, p.potential, p.params0, x, 0.1)[0])(
        jax.random.split(jax.random.split(k_inner, 1)[0], n), x0)
    np.testing.assert_allclose(np.asarray(a.particles), np.asarray(moved), rtol=1e-6)
    g = jnp.mean(jax.vmap(jax.grad(p.potential), (None, 0))(p.params0, moved))
    np.testing.assert_allclose(float(a.params), float(p.params0 - LR * g), rtol=1e-5)
    assert b_state.particles.shape == a.particles.shape == x0.shape


def test_baselines_are_their_module_level_kernels():
    p = smc.gaussian_mmle()
    x0 = p.sample_initial(jax.random.key(0), 8)
    opt = optax.sgd(LR)
    for alg, kernel in (
            (smc.impdiff(p.potential, opt, num_particles=8, order="grad_first"),
             baselines.build_impdiff_kernel(p.potential, opt, order="grad_first")),
            (smc.soul(p.potential, opt, num_inner_steps=3, num_chains=8, burn_in=1),
             baselines.build_soul_kernel(p.potential, opt, num_inner_steps=3, burn_in=1))):
        state = alg.init((p.params0, x0))
        chex.assert_trees_all_equal(kernel(jax.random.key(1), state),
                                    alg.step(jax.random.key(1), state))


def test_baseline_bad_arguments_name_the_argument():
    opt = optax.sgd(0.1)
    pot = smc.gaussian_mmle().potential
    for kw, name in (({"num_chains": 0}, "num_chains"), ({"num_inner_steps": 0},
                     "num_inner_steps"), ({"burn_in": -1}, "burn_in"),
                     ({"num_inner_steps": 4, "burn_in": 4}, "burn_in"),
                     ({"num_chains": 2.0}, "num_chains")):
        with pytest.raises(ValueError, match=name):
            smc.soul(pot, opt, **kw)
    with pytest.raises(ValueError, match="step_size"):
        smc.soul(pot, opt, step_size=-1.0)
    with pytest.raises(ValueError, match="order"):
        smc.impdiff(pot, opt, num_particles=4, order="both")
    alg = smc.soul(pot, opt)
    with pytest.raises(ValueError, match="particles"):
        alg.init((jnp.zeros(()), jnp.zeros((2, 20))))  # one chain: leading axis 1
