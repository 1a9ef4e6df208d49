"""SMC building blocks: log-weights and ESS, unbiased resampling, move kernels, the ULA
forward/backward weight, the reward-tuning gradient, and bad inputs."""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxlib_ext.samplers import smc
from jaxlib_ext.samplers.smc import moves, objectives, resampling, weights


def test_ess_bounds_and_normalisation():
    n = 10
    assert float(weights.ess(jnp.zeros(n))) == pytest.approx(n, rel=1e-6)
    lw = jnp.full(n, -jnp.inf).at[3].set(0.0)
    assert float(weights.ess(lw)) == pytest.approx(1.0, rel=1e-6)
    lw = jax.random.normal(jax.random.key(0), (n,))
    w = weights.weights(lw)
    assert float(weights.ess(lw)) == pytest.approx(float(1 / jnp.sum(w ** 2)), rel=1e-5)
    assert float(jax.nn.logsumexp(weights.normalize(lw + 100.0))) == pytest.approx(0.0, abs=1e-5)


@pytest.mark.parametrize("scheme", ["multinomial", "stratified", "systematic"])
def test_resampling_is_unbiased(scheme):
    """E[copies of i] = M W_i, averaged over 20000 keys: multinomial counts have variance
    M W (1 - W) <= M / 4 = 2, so the mean over 20000 keys has std <= 0.01; tolerance 0.05."""
    n = 8
    w = jax.nn.softmax(jax.random.normal(jax.random.key(1), (n,)) * 1.5)
    fn = resampling.SCHEMES[scheme]
    keys = jax.random.split(jax.random.key(2), 20000)
    idx = jax.vmap(lambda k: fn(k, w, n))(keys)
    counts = jax.vmap(lambda i: jnp.bincount(i, length=n))(idx)
    assert counts.shape == (20000, n) and bool(jnp.all(counts.sum(1) == n))
    np.testing.assert_allclose(np.asarray(counts.mean(0)), np.asarray(n * w), atol=0.05)
    if scheme != "multinomial":  # low-variance schemes: copies within floor/ceil +- 1
        assert bool(jnp.all(jnp.abs(counts - n * w) < 2.0))


def test_resample_pytree_resets_weights():
    n = 6
    parts = {"a": jnp.arange(n, dtype=jnp.float32), "b": jnp.ones((n, 2))}
    lw = jnp.full(n, -jnp.inf).at[2].set(0.0)
    new, lw_new, idx = resampling.resample(jax.random.key(0), parts, lw, "systematic")
    assert bool(jnp.all(idx == 2)) and bool(jnp.all(new["a"] == 2.0))
    assert new["b"].shape == (n, 2)
    np.testing.assert_allclose(np.asarray(lw_new), -np.log(n), rtol=1e-6)


def _gauss(theta, x):
    return 0.5 * jnp.sum((x - theta) ** 2)


@pytest.mark.parametrize("name", ["mala", "rwm", "hmc"])
def test_invariant_moves_keep_gaussian(name):
    """The moves that claim invariance, as chains (``move_algorithm``): 20 steps from exact
    N(0, I) draws (4000 chains, d=2, h=0.3): mean within 0.1 and variance within 0.1 of
    N(0, I) (MC std of both about 0.02)."""
    alg = moves.move_algorithm(name, _gauss, 0.0, 0.3)
    state = jax.vmap(alg.init)(jax.random.normal(jax.random.key(0), (4000, 2)))

    def body(state, k):
        state, info = jax.vmap(alg.step)(jax.random.split(k, 4000), state)
        return state, info.acceptance_prob.mean()

    state, acc = jax.lax.scan(body, state, jax.random.split(jax.random.key(1), 20))
    x = state.position
    np.testing.assert_allclose(np.asarray(x.mean(0)), 0.0, atol=0.1)
    np.testing.assert_allclose(np.asarray(x.var(0)), 1.0, atol=0.1)
    assert 0.3 < float(acc.mean()) <= 1.0


def test_move_algorithm_is_the_move():
    """``move_algorithm(...).step(key, state)`` is ``move(key, potential, params, x, h)``."""
    x = {"u": jnp.ones(3), "v": jnp.zeros((2, 2))}
    pot = lambda th, x: 0.5 * (jnp.sum(x["u"] ** 2) + jnp.sum(x["v"] ** 2)) * th
    for name, kernel in moves.MOVES.items():
        alg = moves.move_algorithm(name, pot, 1.0, 0.1)
        state, info = alg.step(jax.random.key(3), alg.init(x))
        want, want_info = kernel(jax.random.key(3), pot, 1.0, x, 0.1)
        assert isinstance(state, moves.MoveState)
        jax.tree.map(np.testing.assert_array_equal, (state.position, info), (want, want_info))
    with pytest.raises(ValueError, match="move"):
        moves.move_algorithm("nuts", pot, 1.0, 0.1)


def test_moves_accept_pytrees():
    x = {"u": jnp.ones(3), "v": jnp.zeros((2, 2))}
    pot = lambda th, x: 0.5 * (jnp.sum(x["u"] ** 2) + jnp.sum(x["v"] ** 2)) * th
    for kernel in moves.MOVES.values():
        y, info = kernel(jax.random.key(0), pot, 1.0, x, 0.1)
        assert jax.tree.structure(y) == jax.tree.structure(x)
        assert y["v"].shape == (2, 2) and info.acceptance_prob.shape == ()


def test_ula_log_increment_is_the_kernel_density_ratio():
    """(W.4) equals log pi_{k+1}(X') L(X'->X) - log pi_k(X) M(X->X') computed from the two
    Gaussian ULA transition densities, for a non-quadratic potential."""
    pot = lambda th, x: jnp.sum(th * x ** 4 / 4 + 0.5 * x ** 2)
    h = 0.2
    x = jax.random.normal(jax.random.key(0), (5, 3))
    xp, _ = jax.vmap(lambda k, xx: moves.ula(k, pot, 0.3, xx, h))(
        jax.random.split(jax.random.key(1), 5), x)
    got = weights.ula_log_increment(pot, 0.3, 0.5, x, xp, h)

    def log_q(to, frm, th):
        d = to - frm + h * jax.grad(pot, argnums=1)(th, frm)
        return -jnp.sum(d ** 2) / (4 * h)

    want = jax.vmap(lambda a, b: -pot(0.5, b) + log_q(a, b, 0.5) + pot(0.3, a)
                    - log_q(b, a, 0.3))(x, xp)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-4, atol=1e-4)


def test_reward_gradient_covariance_form_equals_autodiff_of_closed_form():
    """pi_theta = N(theta, I), r(x) = -|x - a|^2, p_ref = N(m, I), in d=2:
    J(theta) = -|theta - a|^2 - d - lam |theta - m|^2 / 2. The particles are a tensor Gauss-
    Hermite rule for N(theta, I) (exact for the cubic integrands of (G.2)-(G.3)) and the
    reference draws m +- e_i (exact for linear ones), so the estimator is exact."""
    theta = jnp.array([0.3, -0.7])
    a = jnp.array([1.0, 2.0])
    m = jnp.array([-0.5, 0.25])
    lam = 0.4
    nodes, gw = np.polynomial.hermite_e.hermegauss(5)
    pts = np.array(list(itertools.product(nodes, nodes)))
    w = np.array([p * q for p, q in itertools.product(gw, gw)])
    particles = jnp.asarray(pts, jnp.float32) + theta
    w = jnp.asarray(w / w.sum(), jnp.float32)
    ref = jnp.concatenate([m + jnp.eye(2), m - jnp.eye(2)])
    grad_fn = objectives.reward_tuning_grad(
        _gauss, lambda x: -jnp.sum((x - a) ** 2), kl_weight=lam, reference_sampler=lambda k: ref)
    got = grad_fn(theta, particles, w, jax.random.key(0))
    neg_j = lambda th: jnp.sum((th - a) ** 2) + 2 + lam * jnp.sum((th - m) ** 2) / 2
    np.testing.assert_allclose(np.asarray(got), np.asarray(jax.grad(neg_j)(theta)), rtol=1e-4,
                               atol=1e-4)


# --------------------------------------------------------------------------- bad inputs


@pytest.mark.parametrize("bad", [[0.0, jnp.nan], [0.0, jnp.inf], [-jnp.inf, -jnp.inf]])
def test_non_finite_log_weights_raise(bad):
    lw = jnp.asarray(bad, jnp.float32)
    with pytest.raises(ValueError, match="log_weights"):
        weights.ess(lw)
    with pytest.raises(ValueError, match="log_weights"):
        resampling.resample(jax.random.key(0), jnp.zeros((2, 1)), lw)


def test_bad_shapes_and_names_raise():
    with pytest.raises(ValueError, match="log_weights"):
        weights.ess(jnp.zeros(1))
    with pytest.raises(TypeError, match="log_weights"):
        weights.ess(jnp.zeros(3, jnp.int32))
    with pytest.raises(ValueError, match="weights"):
        resampling.systematic(jax.random.key(0), jnp.array([0.5, 0.6]), 2)
    with pytest.raises(ValueError, match="num_samples"):
        resampling.multinomial(jax.random.key(0), jnp.array([0.5, 0.5]), 0)
    with pytest.raises(ValueError, match="scheme"):
        resampling.resample(jax.random.key(0), jnp.zeros((2, 1)), jnp.zeros(2), "residual")
    with pytest.raises(ValueError, match="num_integration_steps"):
        moves.hmc(jax.random.key(0), _gauss, 0.0, jnp.zeros(2), 0.1, num_integration_steps=0)
    with pytest.raises(ValueError, match="reference_sampler"):
        objectives.reward_tuning_grad(_gauss, lambda x: x[0], kl_weight=1.0)
    with pytest.raises(ValueError, match="kl_weight"):
        smc.mixture2d_reward(kl_weight=-1.0)
    with pytest.raises(ValueError, match="reward"):
        smc.mixture2d_reward("bumpy")
