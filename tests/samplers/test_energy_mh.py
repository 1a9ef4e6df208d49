"""The MH step of PC-MALA is exact (arXiv 2605.15487): on a 1-D bimodal target MALA's
stationary histogram matches the target even with large and state-dependent steps, where
unadjusted Langevin with the same step is visibly biased."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from jaxlib_ext.samplers.energy import Covariance, langevin

W, M, S = jnp.array([0.3, 0.7]), jnp.array([-1.5, 1.0]), jnp.array([0.5, 0.7])
EDGES = np.linspace(-4.0, 4.0, 25)
CHAINS, STEPS = 4000, 150


def _target(x):  # x [B, 1]
    def u(v):
        lp = jnp.log(W) - 0.5 * ((v - M) / S) ** 2 - jnp.log(S * jnp.sqrt(2 * jnp.pi))
        return -jax.nn.logsumexp(lp)

    e, g = jax.vmap(jax.value_and_grad(u))(x[:, 0])
    return e, g[:, None]


def _expected():
    cdf = sum(float(w) * stats.norm.cdf(EDGES, float(m), float(s)) for w, m, s in zip(W, M, S))
    p = np.diff(cdf)
    return np.append(p, 1.0 - p.sum())  # the last bin: outside [-4, 4]


def _chi2(x):
    x = np.asarray(x)[:, 0]
    counts = np.histogram(x, EDGES)[0]
    counts = np.append(counts, len(x) - counts.sum())
    exp = _expected() * len(x)
    keep = exp > 5
    return float(((counts[keep] - exp[keep]) ** 2 / exp[keep]).sum()), int(keep.sum()) - 1


def _run(metropolis, **step):
    kernel = langevin.build_kernel(metropolis=metropolis)
    precond = Covariance(jnp.ones((CHAINS, 1)))
    x0 = jax.random.uniform(jax.random.key(0), (CHAINS, 1), minval=-3.0, maxval=3.0)

    @jax.jit
    def run(key):
        def body(st, k):
            st, info = kernel(k, st, _target, precond, **step)
            return st, info.acceptance_rate.mean()

        st, acc = jax.lax.scan(body, langevin.init(x0, _target), jax.random.split(key, STEPS))
        return st.position, acc.mean()

    return run(jax.random.key(1))


@pytest.mark.parametrize("step", [{"step_size": 0.35}, {"snr": 0.6}])
def test_mala_matches_target_where_ula_is_biased(step):
    x, acc = _run(True, **step)
    chi2, dof = _chi2(x)
    assert chi2 < stats.chi2.ppf(0.999, dof), (chi2, dof)
    assert 0.2 < float(acc) < 0.99
    if "step_size" in step:
        xu, _ = _run(False, **step)
        chi2_u, dof_u = _chi2(xu)
        assert chi2_u > 10 * stats.chi2.ppf(0.999, dof_u), chi2_u


def test_reverse_step_size_matters():
    """With the state-dependent rule (M.4), a reverse density that reuses ``h(x)`` instead of
    ``h(x')`` breaks detailed balance: its histogram is off, the exact kernel's is not."""
    snr = 0.6
    precond = Covariance(jnp.ones((CHAINS, 1)))

    def wrong_kernel(key, x, e, g):
        k1, k2 = jax.random.split(key)
        h = langevin.snr_step_size(g, precond, snr)[:, None]
        prop = x - h * g + jnp.sqrt(2 * h) * jax.random.normal(k1, x.shape)
        e1, g1 = _target(prop)
        lq_rev = -((x - prop + h * g1) ** 2)[:, 0] / (4 * h[:, 0])
        lq_fwd = -((prop - x + h * g) ** 2)[:, 0] / (4 * h[:, 0])
        acc = jnp.log(jax.random.uniform(k2, e.shape)) < e - e1 + lq_rev - lq_fwd
        a = acc[:, None]
        return jnp.where(a, prop, x), jnp.where(acc, e1, e), jnp.where(a, g1, g)

    @jax.jit
    def run(key):
        x0 = jax.random.uniform(jax.random.key(0), (CHAINS, 1), minval=-3.0, maxval=3.0)
        e0, g0 = _target(x0)

        def body(c, k):
            return wrong_kernel(k, *c), None

        (x, _, _), _ = jax.lax.scan(body, (x0, e0, g0), jax.random.split(key, STEPS))
        return x

    chi2_wrong, dof = _chi2(run(jax.random.key(1)))
    chi2_right, _ = _chi2(_run(True, snr=snr)[0])
    assert chi2_right < stats.chi2.ppf(0.999, dof)
    assert chi2_wrong > 3 * stats.chi2.ppf(0.999, dof), (chi2_wrong, chi2_right)
