"""Pseudo-Mallows (arXiv 2205.13911): exactness by enumeration at n <= 6, KL, order search."""

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import pytest
from scipy import stats

from jaxlib_ext.samplers import pseudo_mallows as pm
from jaxlib_ext.samplers import rankings as rk


@pytest.fixture
def x64():
    old = jax.config.jax_enable_x64
    jax.config.update("jax_enable_x64", True)
    yield
    jax.config.update("jax_enable_x64", old)


def _data(n, N=5, seed=0):
    rng = np.random.default_rng(seed)
    base = rng.permutation(n) + 1
    R = []
    for _ in range(N):  # noisy copies of a consensus, so the posterior is not flat
        r = base.copy()
        i, j = rng.choice(n, 2, replace=False)
        r[i], r[j] = r[j], r[i]
        R.append(r)
    return np.stack(R)


def _exact_posterior(alpha, D, perms):
    n = D.shape[0]
    e = -(alpha / n) * np.asarray(D)[np.arange(n), perms - 1].sum(-1)
    return e - np.logaddexp.reduce(e)


# n = 5: tests/samplers/test_distributions.py; n = 3 is a size sweep
@pytest.mark.parametrize("n", [pytest.param(3, marks=pytest.mark.slow), 6])
def test_log_prob_normalised(x64, n):
    D = rk.footrule_data_matrix(_data(n))
    perms = rk.all_permutations(n)
    rng = np.random.default_rng(n)
    for order in (pm.v_order(D[:, 0]), rng.permutation(n)):
        d = pm.PseudoMallows(2.5, D, order)
        total = jnp.exp(d.log_prob(perms)).sum()
        assert abs(float(total) - 1.0) < 1e-6
        assert bool(jnp.all(d.support(perms)))


def test_sample_frequencies_chi_square():
    """Pearson chi-square at a fixed seed. Under H0 the test rejects with probability 1e-3
    (the documented false-alarm rate); cells with expected count < 5 are pooled."""
    n, m = 5, 40_000
    D = rk.footrule_data_matrix(_data(n))
    d = pm.PseudoMallows(3.0, D, pm.v_order(D[:, 0]))
    perms = rk.all_permutations(n)
    q = np.exp(np.asarray(d.log_prob(perms), np.float64))
    q /= q.sum()
    s = np.asarray(jax.jit(lambda k: d.sample(k, (m,)))(jax.random.key(0)))
    codes = ((s - 1) * (n ** np.arange(n)[::-1])).sum(-1)
    pcodes = ((perms - 1) * (n ** np.arange(n)[::-1])).sum(-1)
    counts = np.array([(codes == c).sum() for c in pcodes])
    assert counts.sum() == m  # every draw is a permutation
    exp = q * m
    big = exp >= 5
    obs = np.append(counts[big], counts[~big].sum())
    ex = np.append(exp[big], exp[~big].sum())
    chi2 = ((obs - ex) ** 2 / ex).sum()
    p = stats.chi2.sf(chi2, len(obs) - 1)
    assert p > 1e-3, (chi2, p)


def test_kl_mc_and_dp_match_enumeration(x64):
    n, alpha = 5, 4.0
    D = rk.footrule_data_matrix(_data(n, seed=2))
    perms = rk.all_permutations(n)
    lp = _exact_posterior(alpha, D, perms)
    assert abs(pm.log_posterior_normaliser(alpha, D) - (
        np.logaddexp.reduce(-(alpha / n) * np.asarray(D)[np.arange(n), perms - 1].sum(-1))
    )) < 1e-9
    for order in (pm.v_order(D[:, 0]), np.array([4, 3, 2, 1, 0])):
        lq = np.asarray(pm.PseudoMallows(alpha, D, order).log_prob(perms))
        kl = float(np.sum(np.exp(lq) * (lq - lp)))
        assert abs(pm.exact_kl(alpha, D, order) - kl) < 1e-8
        est, se = pm.kl_estimate(jax.random.key(1), alpha, D, order, num_samples=20_000)
        assert abs(float(est) - kl) < 4 * float(se) + 1e-3, (est, se, kl)


def test_exact_marginals_match_enumeration(x64):
    n, alpha = 6, 3.0
    D = rk.footrule_data_matrix(_data(n, seed=3))
    perms = rk.all_permutations(n)
    p = np.exp(_exact_posterior(alpha, D, perms))
    want = np.zeros((n, n))
    for r, w in zip(perms, p):
        want[np.arange(n), r - 1] += w
    got = pm.exact_posterior_marginals(alpha, D)
    assert np.linalg.norm(got - want) / np.linalg.norm(want) < 1e-10


def test_alpha_to_zero_gives_uniform(x64):
    n = 5
    D = rk.footrule_data_matrix(_data(n))
    perms = rk.all_permutations(n)
    order = pm.v_order(D[:, 0])
    kls = [pm.exact_kl(a, D, order) for a in (2.0, 0.2, 0.02, 0.0)]
    assert kls[0] > kls[1] > kls[2] > -1e-12 and abs(kls[3]) < 1e-12
    q = np.exp(np.asarray(pm.PseudoMallows(1e-4, D, order).log_prob(perms)))
    assert np.abs(q * 120 - 1).max() < 1e-3


def test_order_search(x64):
    n, alpha = 6, 6.0
    D = rk.footrule_data_matrix(_data(n, N=4, seed=5))
    orders, kl = pm.exhaustive_order_search(alpha, D)
    assert orders.shape == (720, n)
    v = pm.v_order(D[:, 0])
    ls, hist = pm.local_search_order(jax.random.key(0), alpha, D, v, num_samples=512)
    rk.validate_permutation(ls, n, zero_based=True, name="order")
    assert all(b > a for a, b in zip(hist, hist[1:]))
    assert kl.min() <= pm.exact_kl(alpha, D, ls) <= pm.exact_kl(alpha, D, v) + 0.02


def test_jit_vmap_and_numpyro_model():
    D = rk.footrule_data_matrix(_data(5))
    order = pm.v_order(D[:, 0])
    lp = jax.jit(lambda a, r: pm.PseudoMallows(a, D, order).log_prob(r))
    s = pm.PseudoMallows(2.0, D, order).sample(jax.random.key(0), (2, 3))
    assert s.shape == (2, 3, 5) and lp(2.0, s).shape == (2, 3)

    def model():
        numpyro.sample("rho", pm.PseudoMallows(2.0, D, order))

    tr = numpyro.handlers.trace(numpyro.handlers.seed(model, 0)).get_trace()
    assert tr["rho"]["value"].shape == (5,)
    assert np.isfinite(float(tr["rho"]["fn"].log_prob(tr["rho"]["value"])))


def test_bad_inputs():
    D = rk.footrule_data_matrix(_data(4))
    with pytest.raises(ValueError, match="alpha"):
        pm.PseudoMallows(-1.0, D, np.arange(4), validate_args=True)
    with pytest.raises(ValueError, match="order"):
        pm.PseudoMallows(1.0, D, np.array([0, 1, 1, 3]), validate_args=True)
    with pytest.raises(ValueError, match="D"):  # shapes are checked even without validation
        pm.PseudoMallows(1.0, np.zeros((4, 3)), np.arange(4), validate_args=False)
    with pytest.raises(ValueError, match="order"):
        pm.PseudoMallows(1.0, D, np.arange(3), validate_args=False)
    with pytest.raises(ValueError, match="alpha"):
        pm.local_search_order(jax.random.key(0), -1.0, D, np.arange(4))
    with pytest.raises(ValueError, match="repeated"):
        pm.PseudoMallows.from_rankings(np.array([[1, 1, 2, 3]]), 1.0)


@pytest.mark.parametrize("make", [lambda: pm.permutation(5), lambda: pm.item_order])
def test_constraints_round_trip_as_pytrees(make):
    """NumPyro's parametrised-constraint checks: rebuilt from its pytree, through ``jit`` and
    ``vmap`` (in and out), equal to the original, also when compared under ``jit``."""
    c = make()
    rebuilt = jax.tree.unflatten(*jax.tree.flatten(c)[::-1])
    assert isinstance(rebuilt, type(c)) and rebuilt == c and rebuilt.eq(c)
    assert (rebuilt.n, rebuilt.start) == (c.n, c.start)
    assert jax.jit(lambda c, x: x ** 2)(c, 1.0) == 1.0
    assert jax.jit(lambda c, x: c)(c, 1.0).eq(c)
    assert jax.vmap(lambda c, x: c, in_axes=(None, 0), out_axes=None)(c, jnp.ones(3)).eq(c)
    assert bool(jax.jit(lambda a, b: a.eq(b))(c, make()))
    assert c != 1 and not c.eq(pm.permutation(4))
    np.testing.assert_array_equal(rebuilt(jnp.array([[2, 1, 0, 4, 3], [1, 2, 3, 4, 5]])),
                                  c(jnp.array([[2, 1, 0, 4, 3], [1, 2, 3, 4, 5]])))


def test_validate_args_under_jit_follows_numpyro():
    """As NumPyro's own distributions (``Distribution.validate_args`` under
    ``jax.ensure_compile_time_eval``): invalid constants raise at construction, also inside
    ``jit``; traced parameters are not checked (NumPyro does not raise for its own either)."""
    import numpyro.distributions as dist

    D = rk.footrule_data_matrix(_data(5))
    order = jnp.arange(5)
    rho = jnp.array([2, 1, 3, 4, 5])
    bad_alpha = jnp.array(-1.0)
    for build, value in ((lambda: pm.PseudoMallows(-1.0, D, order, validate_args=True), rho),
                         (lambda: pm.PseudoMallows(bad_alpha, D, order, validate_args=True), rho),
                         (lambda: dist.Exponential(-1.0, validate_args=True), 1.0)):
        with pytest.raises(ValueError, match="invalid"):
            build()
        with pytest.raises(ValueError, match="invalid"):
            jax.jit(lambda b=build, v=value: b().log_prob(v))()
    bad_order = jnp.zeros(5, jnp.int32)  # closed over: a constant of the trace
    with pytest.raises(ValueError, match="invalid order"):
        jax.jit(lambda: pm.PseudoMallows(1.0, D, bad_order, validate_args=True).log_prob(rho))()
    # traced: neither NumPyro nor PseudoMallows checks (nor raises)
    ours = jax.jit(lambda a: pm.PseudoMallows(a, D, order, validate_args=True).log_prob(rho))
    theirs = jax.jit(lambda a: dist.Exponential(a, validate_args=True).log_prob(1.0))
    assert np.isfinite(float(ours(-1.0))) and np.isnan(float(theirs(-1.0)))
    good = jax.jit(lambda: pm.PseudoMallows(2.0, D, order, validate_args=True).log_prob(rho))()
    np.testing.assert_allclose(good, pm.PseudoMallows(2.0, D, order).log_prob(rho), rtol=1e-6)


def test_log_prob_grad_in_alpha_matches_finite_differences(x64):
    """d log q_o(rho) / d alpha (PM.2) against central differences in float64, at several
    alpha, for draws and for the consensus."""
    D = jnp.asarray(rk.footrule_data_matrix(_data(5)), jnp.float64)
    order = pm.v_order(D[:, 0])
    rhos = jnp.concatenate([pm.PseudoMallows(2.0, D, order).sample(jax.random.key(0), (3,)),
                            jnp.argsort(jnp.argsort(D[:, 0]))[None] + 1])
    for alpha in (0.3, 2.0, 7.5):
        for rho in rhos:
            f = lambda a, rho=rho: pm.PseudoMallows(a, D, order).log_prob(rho)
            eps = 1e-6
            fd = (f(alpha + eps) - f(alpha - eps)) / (2 * eps)
            np.testing.assert_allclose(float(jax.grad(f)(alpha)), float(fd), rtol=1e-6,
                                       atol=1e-8)
