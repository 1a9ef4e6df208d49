"""Bayesian Mallows MCMC: partition function, leap-and-shift Hastings ratio, invariance (n=5,
exact and sampled), alpha updates, data augmentation, recommendations, the kernel contract and
NumPyro's, and bad inputs."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from numpyro.infer import MCMC

from jaxlib_ext.samplers import mallows_augment as ma
from jaxlib_ext.samplers import mallows_mcmc as mm
from jaxlib_ext.samplers import pseudo_mallows as pm
from jaxlib_ext.samplers import rankings as rk
from tests.samplers._markov import assert_boltzmann_invariant

N5 = 5
PERMS5 = rk.all_permutations(N5)
INDEX5 = {tuple(p): i for i, p in enumerate(PERMS5)}


def _data(seed=0, N=6):
    rng = np.random.default_rng(seed)
    base = rng.permutation(N5) + 1
    out = []
    for _ in range(N):
        r = base.copy()
        i, j = rng.choice(N5, 2, replace=False)
        r[i], r[j] = r[j], r[i]
        out.append(r)
    return np.stack(out)


def _tv_to_exact(samples, log_p):
    codes = np.array([INDEX5[tuple(x)] for x in np.asarray(samples).reshape(-1, N5)])
    emp = np.bincount(codes, minlength=len(PERMS5)) / len(codes)
    return 0.5 * np.abs(emp - np.exp(log_p)).sum()


def test_footrule_counts_and_partition():
    for n in range(1, 7):
        d, lc = mm.footrule_distance_log_counts(n)
        dist = np.abs(rk.all_permutations(n) - np.arange(1, n + 1)).sum(1)
        u, c = np.unique(dist, return_counts=True)
        np.testing.assert_allclose(d, u)
        np.testing.assert_allclose(lc, np.log(c), rtol=1e-12)
    exact = mm.footrule_log_partition(12)
    grid = jnp.array([0.5, 4.0, 12.0])
    isz = mm.footrule_log_partition(
        12, method="importance", key=jax.random.key(0), alpha_grid=grid, num_samples=20_000
    )
    for a in grid:
        assert abs(float(exact(a)) - float(isz(a))) < 0.03


def _ls_reference(rho, u, r):
    """Leap-and-shift by list surgery: take item u out of the ranking, reinsert at rank r."""
    order = list(np.argsort(rho))
    order.remove(u)
    order.insert(r - 1, u)
    new = np.empty_like(rho)
    new[np.array(order)] = np.arange(1, len(rho) + 1)
    return new


@pytest.mark.parametrize("L", [1, 2, 4])
def test_leap_and_shift_hastings_ratio_from_enumeration(L):
    n = N5
    Q = np.zeros((120, 120))
    for a, rho in enumerate(PERMS5):
        for u in range(n):
            S = [r for r in range(max(1, rho[u] - L), min(n, rho[u] + L) + 1) if r != rho[u]]
            for r in S:
                Q[a, INDEX5[tuple(_ls_reference(rho, u, r))]] += 1.0 / (n * len(S))
    np.testing.assert_allclose(Q.sum(1), 1.0)
    # The kernel's closed-form ratio, for draws of its own proposal.
    keys = jax.random.split(jax.random.key(L), 400)
    rhos = jnp.asarray(PERMS5[np.arange(400) % 120])
    new, log_ratio = jax.vmap(lambda k, r: mm.leap_and_shift(k, r, L))(keys, rhos)
    for r0, r1, lr in zip(np.asarray(rhos), np.asarray(new), np.asarray(log_ratio)):
        a, b = INDEX5[tuple(r0)], INDEX5[tuple(r1)]
        assert Q[a, b] > 0
        assert abs(np.log(Q[b, a] / Q[a, b]) - lr) < 1e-5
    # ... and its proposal frequencies from one state match the enumerated row.
    keys = jax.random.split(jax.random.key(99), 20_000)
    rho0 = jnp.asarray(PERMS5[37])
    new, _ = jax.vmap(lambda k: mm.leap_and_shift(k, rho0, L))(keys)
    codes = np.array([INDEX5[tuple(x)] for x in np.asarray(new)])
    emp = np.bincount(codes, minlength=120) / len(codes)
    assert 0.5 * np.abs(emp - Q[37]).sum() < 0.02


def test_mcmc_invariance_fixed_alpha():
    R = _data()
    alpha = 2.0
    D = np.asarray(rk.footrule_data_matrix(R))
    e = -(alpha / N5) * D[np.arange(N5), PERMS5 - 1].sum(-1)
    log_p = e - np.logaddexp.reduce(e)
    kernel = mm.MallowsMH(R, alpha=alpha, leap_size=2)
    mcmc = MCMC(kernel, num_warmup=200, num_samples=2500, num_chains=64,
                chain_method="vectorized", progress_bar=False)
    mcmc.run(jax.random.key(0))
    rho = mcmc.get_samples(group_by_chain=True)["rho"]
    assert rho.shape == (64, 2500, N5)
    assert _tv_to_exact(rho, log_p) < 0.02
    r_hat, ess = mm.rank_diagnostics(rho)
    assert np.all(r_hat < 1.05) and np.all(ess > 1000)


def test_mcmc_alpha_update_matches_quadrature():
    """Joint (rho, alpha) posterior with Exponential(0.5) prior; rho marginal and E[alpha]
    from 1-D quadrature over alpha with the exact partition function."""
    R = _data(seed=1, N=4)
    rate = 0.5
    D = np.asarray(rk.footrule_data_matrix(R), np.float64)
    S = D[np.arange(N5), PERMS5 - 1].sum(-1)
    lz = mm.footrule_log_partition(N5)
    grid = np.linspace(1e-4, 40.0, 4001)
    logz = np.array([float(lz(a)) for a in grid[::40]])
    logz = np.interp(grid, grid[::40], logz)
    logj = -rate * grid[None] - grid[None] / N5 * S[:, None] - len(R) * logz[None]
    logj -= np.logaddexp.reduce(logj.ravel())
    log_p_rho = np.logaddexp.reduce(logj, axis=1)
    mean_alpha = float((np.exp(logj) * grid[None]).sum())
    res = mm.run_mallows_mcmc(
        jax.random.key(1), R, alpha=1.0, update_alpha=True, sigma_alpha=0.5, alpha_rate=rate,
        leap_size=2, num_chains=64, num_samples=2500, num_warmup=300,
    )
    assert _tv_to_exact(res.rho, log_p_rho) < 0.03
    assert abs(float(res.alpha.mean()) - mean_alpha) / mean_alpha < 0.05
    assert 0.1 < float(res.alpha_acceptance_rate) < 0.95


def test_augmentation_targets_conditional():
    """Swap-MH on one user's latent ranking (pairwise data) matches the enumerated conditional
    exp(-(alpha/n) d_F(R, rho)) restricted to the linear extensions."""
    n, alpha = N5, 3.0
    prefs = np.array([[0, 0, 2], [0, 3, 1], [0, 2, 4]])
    P = rk.pairwise_closure(prefs, n, 1)
    ok = np.asarray(rk.satisfies_pairwise(PERMS5, np.broadcast_to(P[0], (120, n, n))))
    rho = jnp.array([2, 5, 1, 3, 4])
    e = np.where(ok, -(alpha / n) * np.abs(PERMS5 - np.asarray(rho)).sum(-1), -np.inf)
    log_p = e - np.logaddexp.reduce(e)
    R0 = jnp.asarray(np.repeat(rk.initial_rankings_from_pairwise(P), 4000, axis=0))
    Pb = jnp.asarray(np.repeat(P, 4000, axis=0))
    R = jax.jit(lambda k, r: ma.augment_mh(k, rho, r, alpha, 60, prefer=Pb))(
        jax.random.key(0), R0
    )
    assert bool(jnp.all(rk.satisfies_pairwise(R, Pb)))
    assert _tv_to_exact(R, log_p) < 0.04


def test_clicks_fit_and_recommendations():
    rng = np.random.default_rng(0)
    n, N = 8, 6
    clicked = np.zeros((N, n), bool)
    for j in range(N):
        clicked[j, rng.choice(3, 2, replace=False)] = True
    b = rk.blocks_from_clicks(clicked)
    R0 = rk.initial_rankings_from_blocks(jax.random.key(0), b)
    fit = pm.fit_augmented(jax.random.key(1), R0, 3.0, num_iter=200, blocks=b)
    assert fit.rho.shape == (100, n)
    np.testing.assert_allclose(np.asarray(fit.user_rank_probs).sum(-1), 1.0, rtol=1e-5)
    items, probs = ma.top_k_recommendations(fit.user_rank_probs, clicked, 2)
    assert not np.any(np.take_along_axis(clicked, np.asarray(items), 1))
    assert np.all(np.asarray(probs) >= 0) and np.all(np.asarray(probs) <= 1 + 1e-6)
    fixed = pm.fit_augmented(jax.random.key(5), R0, 3.0, num_iter=50, blocks=b,
                             order=np.arange(n)[::-1])
    assert fixed.rho.shape == (25, n)
    with pytest.raises(ValueError, match="order"):
        pm.fit_augmented(jax.random.key(5), R0, 3.0, num_iter=50, blocks=b, order=[0, 0])
    res = mm.run_mallows_mcmc(jax.random.key(2), np.asarray(R0), alpha=3.0, blocks=b,
                              num_chains=2, num_samples=100, num_warmup=50)
    assert res.user_rank_probs.shape == (N, n, n)
    Rf = np.asarray(res.state.rankings[0])
    assert np.all(np.take_along_axis(np.asarray(b.rank_block), Rf - 1, 1) == b.item_block)


def test_pure_kernel_state_and_info():
    """``init``/``build_kernel`` are pure; ``MallowsMH`` only pairs their state and info with
    the key for NumPyro: the same keys give the same chain through either, ``init`` keeps no
    state, and ``mallows_mh`` is the same pair as a ``SamplingAlgorithm``."""
    R = _data()
    mh = mm.MallowsMH(R, alpha=2.0, update_alpha=True, alpha_jump=2, leap_size=2)
    keys = jax.random.split(jax.random.key(0), 3)
    first = mh.init(keys, 0, None, (), {})
    chex.assert_trees_all_equal(mh.init(keys, 0, None, (), {}), first)
    chains = jax.vmap(lambda p: mm.init(p, mh.data.D, mh.data.rankings))(first.chain.position)
    chex.assert_trees_all_equal(first.chain, chains)
    alg = mm.mallows_mh(R, alpha=2.0, update_alpha=True, alpha_jump=2, leap_size=2)
    chex.assert_trees_all_equal(jax.vmap(alg.init)({"rho": chains.rho}), chains)

    @jax.jit
    def four_steps(chains, state):  # the pure kernel and the adapter side by side
        def body(carry, _):
            chains, state = carry
            step_keys = jax.vmap(lambda k: jax.random.split(k)[1])(state.rng_key)
            chains, info = jax.vmap(alg.step)(step_keys, chains)
            return (chains, mh.sample(state, (), {})), info

        (chains, state), info = jax.lax.scan(body, (chains, state), None, length=4)
        return chains, state, jax.tree.map(lambda x: x[-1], info)

    chains, state, info = four_steps(chains, first)
    chex.assert_trees_all_equal(state.chain, chains)
    chex.assert_trees_all_equal(state.info, info)
    assert isinstance(chains, mm.MallowsState) and isinstance(info, mm.MallowsInfo)
    assert mm.MallowsState._fields == ("rho", "alpha", "D", "rankings", "iteration")
    chex.assert_shape((chains.rho, chains.alpha, info.rho_acceptance_rate), [(3, N5), (3,), (3,)])
    assert np.all(np.asarray(chains.iteration) == 4)
    assert state.position.keys() == {"rho", "alpha"}


def _mh_transition_matrix(D, alpha, L):
    """The exact transition matrix of one leap-and-shift MH step (alpha fixed) on the 120
    rankings of five items, from the kernel's own deterministic move and Hastings ratio;
    ``K[a, a]`` is left for the rejected mass."""
    n = N5
    S = D[np.arange(n), PERMS5 - 1].sum(-1)
    moves = [(a, u, r, len(window))
             for a, rho in enumerate(PERMS5) for u in range(n)
             for window in [[r for r in range(max(1, rho[u] - L), min(n, rho[u] + L) + 1)
                             if r != rho[u]]]
             for r in window]
    a, u, r, size = (np.array(c) for c in zip(*moves))
    new, log_ratio = jax.vmap(lambda p, i, j: mm.leap_and_shift_move(p, i, j, L))(
        jnp.asarray(PERMS5[a]), jnp.asarray(u), jnp.asarray(r))
    b = np.array([INDEX5[tuple(x)] for x in np.asarray(new)])
    dlog = -(alpha / n) * (S[b] - S[a]) + np.asarray(log_ratio, np.float64)
    K = np.zeros((120, 120))
    np.add.at(K, (a, b), np.minimum(1.0, np.exp(dlog)) / (n * size))
    return K, (alpha / n) * S


@pytest.mark.parametrize("L", [1, 2])
def test_leap_and_shift_mh_is_exactly_invariant(L):
    """pi K = pi for the enumerated one-step kernel (pi the posterior (M.1), alpha fixed), and
    the kernel's own draws from one state follow that row of K (20000 steps, TV < 0.02)."""
    R = _data()
    alpha = 2.0
    D = np.asarray(rk.footrule_data_matrix(R), np.float64)
    K, energies = _mh_transition_matrix(D, alpha, L)
    assert_boltzmann_invariant(K, energies, 1.0)
    row = K[37].copy()
    row[37] = 1.0 - (row.sum() - row[37])
    alg = mm.mallows_mh(R, alpha=alpha, leap_size=L)
    state = alg.init({"rho": jnp.asarray(PERMS5[37])})
    keys = jax.random.split(jax.random.key(L), 20_000)
    new, _ = jax.jit(jax.vmap(alg.step, (0, None)))(keys, state)
    codes = np.array([INDEX5[tuple(x)] for x in np.asarray(new.rho)])
    emp = np.bincount(codes, minlength=120) / len(codes)
    assert 0.5 * np.abs(emp - row).sum() < 0.02


@pytest.mark.parametrize("num_chains", [1, 2])
def test_numpyro_warmup_then_run_from_last_state_key(num_chains):
    """NumPyro's ``test_compile_warmup_run`` idiom: ``warmup(key)`` then
    ``run(last_state.rng_key)`` gives the draws of ``run(key)``; and ``run_mallows_mcmc`` gives
    the draws of ``MCMC`` with vectorised chains."""
    R = _data()
    mcmc = MCMC(mm.MallowsMH(R, alpha=2.0, leap_size=2), num_warmup=10, num_samples=20,
                num_chains=num_chains, chain_method="vectorized", progress_bar=False)
    mcmc.run(jax.random.key(0))
    expected = mcmc.get_samples(group_by_chain=True)["rho"]
    mcmc.warmup(jax.random.key(0))
    mcmc.run(mcmc.last_state.rng_key)
    np.testing.assert_array_equal(mcmc.get_samples(group_by_chain=True)["rho"], expected)
    if num_chains > 1:
        res = mm.run_mallows_mcmc(jax.random.key(0), R, alpha=2.0, leap_size=2,
                                  num_chains=num_chains, num_samples=20, num_warmup=10)
        np.testing.assert_array_equal(res.rho, expected)


def test_bad_inputs():
    R = _data()
    with pytest.raises(ValueError, match="alpha"):
        mm.MallowsMH(R, alpha=-1.0)
    with pytest.raises(ValueError, match="leap_size"):
        mm.MallowsMH(R, alpha=1.0, leap_size=0)
    with pytest.raises(ValueError, match="repeated"):
        mm.MallowsMH(np.array([[1, 2, 2, 4, 5]]), alpha=1.0)
    with pytest.raises(ValueError, match="D"):
        mm.MallowsMH(D=np.zeros((3, 4)), num_assessors=2, alpha=1.0)
    with pytest.raises(ValueError, match="init_params"):
        mm.MallowsMH(R, alpha=1.0).init(jax.random.key(0), 0, {"rho": [1, 1, 2, 3, 4]}, (), {})
    with pytest.raises(ValueError, match="method"):
        mm.footrule_log_partition(5, method="magic")
    D = jnp.asarray(rk.footrule_data_matrix(R), jnp.float32)
    with pytest.raises(TypeError, match="position"):
        mm.init(jnp.arange(1, 6), D)
    with pytest.raises(ValueError, match="rho"):
        mm.init({"rho": jnp.array([1, 1, 2, 3, 4]), "alpha": 1.0}, D)
    with pytest.raises(ValueError, match="alpha"):
        mm.init({"rho": jnp.arange(1, 6), "alpha": -1.0}, D)
    with pytest.raises(ValueError, match="rankings"):
        mm.init({"rho": jnp.arange(1, 6), "alpha": 1.0}, D, jnp.zeros((2, 4), jnp.int32))
    with pytest.raises(ValueError, match="log_partition"):
        mm.build_kernel(num_assessors=6, update_alpha=True)
