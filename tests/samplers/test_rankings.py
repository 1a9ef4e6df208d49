"""Rankings: validation, distances, the footrule data matrix, loaders and partial data."""

import itertools

import jax
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jaxlib_ext.samplers import rankings as rk


def _brute_kendall(a, b):
    n = len(a)
    return sum(
        (a[i] - a[j]) * (b[i] - b[j]) < 0 for i, j in itertools.combinations(range(n), 2)
    )


def test_distances_match_brute_force():
    rng = np.random.default_rng(0)
    for n in (1, 4, 7):
        a, b = rng.permutation(n) + 1, rng.permutation(n) + 1
        assert int(rk.footrule_distance(a, b)) == np.abs(a - b).sum()
        assert int(rk.kendall_distance(a, b)) == _brute_kendall(a, b)


def test_data_matrix_gives_summed_footrule():
    rng = np.random.default_rng(1)
    R = np.stack([rng.permutation(6) + 1 for _ in range(9)])
    D = np.asarray(rk.footrule_data_matrix(R))
    assert D.shape == (6, 6)
    for rho in rk.all_permutations(6)[::37]:
        want = np.abs(R - rho[None]).sum()
        assert D[np.arange(6), rho - 1].sum() == want


@pytest.mark.parametrize(
    "bad, msg",
    [
        ([[1, 1, 3]], "repeated rank"),
        ([[1, 2, 4]], "1..3"),
        ([[0, 2, 3]], "1..3"),
        ([[1.0, np.nan, 3.0]], "NaN"),
        ([[1.5, 2, 3]], "integer"),
        ([[1, rk.MISSING, 3]], "MISSING"),
    ],
)
def test_bad_rankings_raise(bad, msg):
    with pytest.raises(ValueError, match=msg):
        rk.validate_rankings(np.array(bad))


def test_missing_sentinel_allowed_when_asked():
    R = rk.validate_rankings(np.array([[1, rk.MISSING, 3]]), allow_missing=True)
    b = rk.blocks_from_partial(R)
    full = rk.initial_rankings_from_blocks(jax.random.key(0), b)
    assert full.tolist() == [[1, 2, 3]]
    with pytest.raises(TypeError, match="dtype"):
        rk.validate_rankings(np.array([[True, False]]))


def test_loaders():
    pot = rk.load_potato()
    assert pot.shape == (12, 20)
    assert rk.load_potato("weighing").shape == (12, 20)
    assert sorted(rk.load_potato_true_ranking()) == list(range(1, 21))
    sushi, names = rk.load_sushi()
    assert sushi.shape == (5000, 10) and len(names) == 10
    prefs, N, n = rk.load_beach()
    assert prefs.shape == (1442, 3) and (N, n) == (60, 15)
    P = rk.pairwise_closure(prefs, n, N)
    R0 = rk.initial_rankings_from_pairwise(P)
    rk.validate_rankings(R0)
    assert bool(np.all(rk.satisfies_pairwise(R0, P)))


def test_pairwise_cycle_and_clicks():
    with pytest.raises(ValueError, match="cyclic"):
        rk.pairwise_closure(np.array([[0, 0, 1], [0, 1, 2], [0, 2, 0]]), 3)
    clicked = np.zeros((3, 6), bool)
    clicked[0, [1, 4]] = True
    clicked[2, 5] = True
    b = rk.blocks_from_clicks(clicked)
    R = np.asarray(rk.initial_rankings_from_blocks(jax.random.key(3), b))
    rk.validate_rankings(R)
    assert set(R[0, [1, 4]]) == {1, 2} and R[2, 5] == 1
    with pytest.raises(ValueError, match="every item"):
        rk.blocks_from_clicks(np.ones((1, 3), bool))


# --------------------------------------------------------------------------- properties

_PROPERTY = settings(max_examples=20, deadline=None, derandomize=True)


@st.composite
def _rank_vectors(draw, num: int):
    """``num`` rank vectors (1-based permutations) of one common length ``n`` in 1..7."""
    n = draw(st.integers(1, 7))
    perms = st.permutations(list(range(1, n + 1)))
    return [np.array(draw(perms), np.int32) for _ in range(num)]


@_PROPERTY
@given(_rank_vectors(3))
def test_footrule_is_a_metric_bounded_by_kendall(rs):
    """Footrule is a metric on permutations, even-valued, and Diaconis-Graham (1977) holds:
    Kendall <= footrule <= 2 Kendall."""
    a, b, c = rs
    d = lambda x, y: int(rk.footrule_distance(x, y))  # noqa: E731
    assert d(a, a) == 0 and (d(a, b) == 0) == bool(np.array_equal(a, b))
    assert d(a, b) == d(b, a) and d(a, c) <= d(a, b) + d(b, c)
    assert d(a, b) % 2 == 0
    k = int(rk.kendall_distance(a, b))
    assert k <= d(a, b) <= 2 * k


@_PROPERTY
@given(_rank_vectors(4))
def test_data_matrix_identity_and_marginals(rs):
    """``sum_i D[i, rho_i - 1] = sum_j d_F(R_j, rho)``; rank marginals are doubly stochastic."""
    R, rho = np.stack(rs[:3]), rs[3]
    D = np.asarray(rk.footrule_data_matrix(R))
    n = len(rho)
    assert D[np.arange(n), rho - 1].sum() == int(rk.footrule_distance(R, rho[None]).sum())
    m = np.asarray(rk.rank_marginals(R))
    np.testing.assert_allclose(m.sum(axis=1), 1.0, rtol=1e-6)
    np.testing.assert_allclose(m.sum(axis=0), 1.0, rtol=1e-6)
