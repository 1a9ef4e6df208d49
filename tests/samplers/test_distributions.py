"""Every distribution of ``jaxlib_ext.samplers`` through the same generic checks, after NumPyro's
own ``test/test_distributions.py``: sample and ``log_prob`` shapes, ``expand``, the pytree round
trip under ``jit``, ``vmap`` and ``lax.map``, the support (``-inf`` outside it; errors and
warnings under ``validate_args``), exact normalisation by enumeration and gradients of
``log_prob`` with respect to the continuous parameters.

A new distribution joins by adding one ``DistCase`` to ``CASES``.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import NamedTuple

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.test_util import check_grads

from jaxlib_ext.samplers import pseudo_mallows as pm
from jaxlib_ext.samplers import rankings as rk


class DistCase(NamedTuple):
    """One distribution with one set of parameters.

    ``make(*params)`` builds it; ``grad_argnums`` are the continuous parameters; ``bad_params``
    maps a parameter name to a parameter tuple in which that parameter is invalid;
    ``outside`` is a value of the event shape outside the support; ``support_values()`` lists
    the whole (finite) support, for the normalisation check.
    """

    make: Callable
    params: tuple
    grad_argnums: tuple[int, ...]
    bad_params: dict
    outside: np.ndarray
    support_values: Callable[[], np.ndarray]


def _rankings(n, N=5, seed=0):
    """Noisy copies of one consensus ranking, so the posterior is not flat."""
    rng = np.random.default_rng(seed)
    base = rng.permutation(n) + 1
    R = []
    for _ in range(N):
        r = base.copy()
        i, j = rng.choice(n, 2, replace=False)
        r[i], r[j] = r[j], r[i]
        R.append(r)
    return np.stack(R)


def pseudo_mallows_case(n: int, order: str) -> DistCase:
    D = np.asarray(rk.footrule_data_matrix(_rankings(n)))
    o = np.asarray(pm.v_order(D[:, 0])) if order == "v" else np.random.default_rng(n).permutation(n)
    repeated = np.arange(n)
    repeated[-1] = 0
    outside = np.arange(1, n + 1)
    outside[0] = outside[-1]  # a repeated rank
    return DistCase(
        make=pm.PseudoMallows,
        params=(2.5, D, o),
        grad_argnums=(0,),
        bad_params={
            "alpha": (-1.0, D, o),
            "D": (2.5, np.where(np.eye(n, dtype=bool), np.inf, D), o),
            "order": (2.5, D, repeated),
        },
        outside=outside,
        support_values=lambda: rk.all_permutations(n),
    )


CASES = [
    pytest.param(pseudo_mallows_case(5, "random"), id="PseudoMallows"),
]


@pytest.fixture
def x64():
    old = jax.config.jax_enable_x64
    jax.config.update("jax_enable_x64", True)
    yield
    jax.config.update("jax_enable_x64", old)


def _assert_same_samples_and_scores(d1, d2, key):
    s1, s2 = d1.sample(key), d2.sample(key)
    chex.assert_trees_all_equal(s1, s2)
    chex.assert_trees_all_close(d1.log_prob(s1), d2.log_prob(s2), rtol=1e-6)


@pytest.mark.parametrize("case", CASES)
def test_sample_and_log_prob_shapes(case):
    d = case.make(*case.params)
    key = jax.random.key(0)
    for sample_shape in [(), (2, 3)]:  # the draws of the other tests reuse these two sizes
        s = d.sample(key, sample_shape)
        chex.assert_shape(s, sample_shape + d.batch_shape + d.event_shape)
        chex.assert_shape(d.log_prob(s), sample_shape + d.batch_shape)
        s_call = d(rng_key=key, sample_shape=sample_shape)
        s_int, intermediates = d.sample_with_intermediates(key, sample_shape)
        chex.assert_trees_all_equal(s, s_call, s_int)
        assert isinstance(intermediates, list)


@pytest.mark.parametrize("case", CASES)
def test_expand(case):
    d = case.make(*case.params)
    e = d.expand((3, 2))
    assert e.batch_shape == (3, 2) and e.event_shape == d.event_shape
    s = e.sample(jax.random.key(1))
    chex.assert_shape(s, (3, 2) + d.event_shape)
    chex.assert_trees_all_close(e.log_prob(s), d.log_prob(s), rtol=1e-6)
    assert len(np.unique(np.asarray(s).reshape(6, -1), axis=0)) > 1  # independent draws


@pytest.mark.parametrize("case", CASES)
def test_pytree_round_trip_jit_vmap_lax_map(case):
    d = case.make(*case.params)
    key = jax.random.key(2)
    leaves, treedef = jax.tree.flatten(d)
    rebuilt = jax.tree.unflatten(treedef, leaves)
    chex.assert_trees_all_equal_structs(d, rebuilt)
    assert (rebuilt.batch_shape, rebuilt.event_shape) == (d.batch_shape, d.event_shape)
    _assert_same_samples_and_scores(d, rebuilt, key)

    def f(_):
        return case.make(*case.params)

    _assert_same_samples_and_scores(d, jax.jit(f)(0), key)

    stacked = jax.lax.map(f, jnp.ones(3))  # every leaf gains a leading axis of 3
    keys = jax.random.split(key, 3)
    samples = jax.vmap(lambda dist, k: dist.sample(k))(stacked, keys)
    chex.assert_shape(samples, (3,) + d.event_shape)
    for k, s in zip(keys, samples):
        chex.assert_trees_all_equal(s, d.sample(k))

    # vmap over the continuous parameters: one distribution per value, scored inside vmap.
    values = jnp.asarray([1.0, 2.0, 4.0])
    batched = jax.vmap(lambda a: case.make(a, *case.params[1:]))(values)
    assert (batched.batch_shape, batched.event_shape) == (d.batch_shape, d.event_shape)
    x = d.sample(key)
    got = jax.vmap(lambda dist: dist.log_prob(x))(batched)
    want = jnp.stack([case.make(a, *case.params[1:]).log_prob(x) for a in values])
    chex.assert_trees_all_close(got, want, rtol=1e-6)


@pytest.mark.parametrize("case", CASES)
def test_support(case):
    d = case.make(*case.params, validate_args=False)
    s = d.sample(jax.random.key(3), (2, 3))
    assert bool(jnp.all(d.support(s)))
    assert not bool(d.support(case.outside))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no warning without validation
        assert float(d.log_prob(case.outside)) == -np.inf
        assert float(jax.jit(d.log_prob)(case.outside)) == -np.inf
    checked = case.make(*case.params, validate_args=True)
    with pytest.warns(UserWarning, match="Out-of-support"):
        assert float(checked.log_prob(case.outside)) == -np.inf


@pytest.mark.parametrize("case", CASES)
def test_invalid_parameters(case):
    for name, params in case.bad_params.items():
        with pytest.raises(ValueError, match=name):
            case.make(*params, validate_args=True)
        case.make(*params, validate_args=False)  # no check when validation is off


@pytest.mark.parametrize("case", CASES)
def test_normalised_by_enumeration(x64, case):
    d = case.make(*case.params)
    values = case.support_values()
    total = jnp.exp(d.log_prob(values)).sum()
    assert abs(float(total) - 1.0) < 1e-6


@pytest.mark.parametrize("case", CASES)
def test_grad_log_prob_matches_finite_differences(x64, case):
    x = case.make(*case.params).sample(jax.random.key(4))

    def log_prob(*continuous):
        params = list(case.params)
        for i, v in zip(case.grad_argnums, continuous):
            params[i] = v
        return case.make(*params).log_prob(x)

    args = tuple(jnp.asarray(case.params[i], jnp.float64) for i in case.grad_argnums)
    grads = jax.grad(log_prob, argnums=tuple(range(len(args))))(*args)
    assert all(bool(jnp.all(jnp.isfinite(g))) for g in grads)
    check_grads(log_prob, args, order=1, modes=["rev"], eps=1e-4)
