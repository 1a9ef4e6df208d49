"""The grouped matmuls ``moe.gmm`` / ``moe.tgmm``: every method (and both XLA forms,
``ragged_dot`` and the tiled work items) equals the loop over groups.

Group layouts cover empty groups (first, middle, last, all), one group holding every row, rows
past the sum (zeros out, ignored in ``tgmm``) and ``M`` not a multiple of the Pallas row tile
(16 here); float32 and float64; gradients of ``gmm`` and ``tgmm`` against the loop's; argument
errors; the Pallas kernels lowered for an H200 by the Triton backend.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jaxlib_ext.pallas_kernels import moe
from jaxlib_ext.pallas_kernels.moe._metadata import group_metadata
from jaxlib_ext.pallas_kernels.moe.config import GMMKernelConfig
from tests.pallas_kernels._helpers import rel_rmse

CFG = GMMKernelConfig(block_m=16, block_n=16, block_k=16, interpret=True)
M, K, N = 45, 20, 24
LAYOUTS = {
    "mixed": [3, 0, 17, 9, 16],  # an empty group, boundaries inside tiles, sum = M
    "empty_ends": [0, 20, 0, 25, 0],
    "one_group": [0, 0, 45, 0, 0],
    "tail_rows": [5, 1, 0, 7, 2],  # sum 15 < M: rows past the sum
    "all_empty": [0, 0, 0, 0, 0],
}
TOL = {jnp.float32: 1e-5, jnp.float64: 1e-12}


def _inputs(seed, dtype, sizes, m=M):
    r = np.random.default_rng(seed)
    lhs = jnp.asarray(r.normal(size=(m, K)), dtype)
    rhs = jnp.asarray(r.normal(size=(len(sizes), K, N)), dtype)
    grad = jnp.asarray(r.normal(size=(m, N)), dtype)
    return lhs, rhs, grad, jnp.asarray(sizes, jnp.int32)


XLA_FORMS = {
    "ragged_dot": (moe.gmm_ragged_dot, moe.tgmm_ragged_dot),
    "tiled": (
        lambda a, b, s: moe.gmm_tiled(a, b, s, block_m=16),
        lambda a, b, s: moe.tgmm_tiled(a, b, s, block_m=16),
    ),
}


def _run(fn, method, *args):
    if method in XLA_FORMS:
        return XLA_FORMS[method][fn is moe.tgmm](*args)
    return fn(*args, method=method, config=CFG if method == "pallas" else None)


ALL = [*moe.METHODS, *XLA_FORMS]


@pytest.mark.parametrize("method", ALL)
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_gmm_and_tgmm_equal_loop_over_groups(method, layout):
    lhs, rhs, grad, sizes = _inputs(0, jnp.float32, LAYOUTS[layout])
    out = _run(moe.gmm, method, lhs, rhs, sizes)
    ref = moe.gmm_loop(lhs, rhs, sizes)
    assert out.shape == (M, N) and out.dtype == jnp.float32
    assert rel_rmse(out, ref) < 1e-5
    past = int(sizes.sum())
    assert np.all(np.asarray(out)[past:] == 0.0)
    w = _run(moe.tgmm, method, lhs, grad, sizes)
    assert w.shape == (len(LAYOUTS[layout]), K, N)
    assert rel_rmse(w, moe.tgmm_loop(lhs, grad, sizes)) < 1e-5
    for g, n in enumerate(LAYOUTS[layout]):
        if n == 0:
            assert np.all(np.asarray(w[g]) == 0.0)


@pytest.mark.parametrize("method", ["pallas", *XLA_FORMS])
def test_float64(method):
    with jax.enable_x64(True):
        lhs, rhs, grad, sizes = _inputs(1, jnp.float64, LAYOUTS["mixed"])
        out = _run(moe.gmm, method, lhs, rhs, sizes)
        assert out.dtype == jnp.float64
        assert rel_rmse(out, moe.gmm_loop(lhs, rhs, sizes)) < 1e-12
        w = _run(moe.tgmm, method, lhs, grad, sizes)
        assert rel_rmse(w, moe.tgmm_loop(lhs, grad, sizes)) < 1e-12


@pytest.mark.parametrize("method", ["pallas", *XLA_FORMS])
@pytest.mark.parametrize("layout", ["mixed", "tail_rows"])
def test_gmm_gradients_equal_loop(method, layout):
    lhs, rhs, grad, sizes = _inputs(2, jnp.float32, LAYOUTS[layout])

    def loss(fn):
        return lambda a, b: jnp.sum(fn(a, b) * grad)

    ours = jax.grad(loss(lambda a, b: _run(moe.gmm, method, a, b, sizes)), (0, 1))(lhs, rhs)
    ref = jax.grad(loss(lambda a, b: moe.gmm_loop(a, b, sizes)), (0, 1))(lhs, rhs)
    for o, r in zip(ours, ref, strict=True):
        assert rel_rmse(o, r) < 1e-5
    past = int(sizes.sum())
    assert np.all(np.asarray(ours[0])[past:] == 0.0)  # rows past the sum do not matter


# (not "ragged_dot": JAX has no gradient of ragged_dot_general contracting over the groups)
@pytest.mark.parametrize("method", ["pallas", "xla", "tiled"])
@pytest.mark.parametrize("layout", ["mixed", "tail_rows"])
def test_tgmm_gradients_equal_loop(method, layout):
    """``tgmm`` is differentiable in both operands (the Pallas path by its custom VJP of two
    ``gmm`` kernels); rows past the sum get zero gradients."""
    lhs, _, grad, sizes = _inputs(8, jnp.float32, LAYOUTS[layout])
    cot = jnp.asarray(np.random.default_rng(9).normal(size=(len(LAYOUTS[layout]), K, N)),
                      jnp.float32)

    def loss(fn):
        return lambda a, g: jnp.sum(fn(a, g) * cot)

    ours = jax.grad(loss(lambda a, g: _run(moe.tgmm, method, a, g, sizes)), (0, 1))(lhs, grad)
    ref = jax.grad(loss(lambda a, g: moe.tgmm_loop(a, g, sizes)), (0, 1))(lhs, grad)
    for o, r in zip(ours, ref, strict=True):
        assert rel_rmse(o, r) < 1e-5
    past = int(sizes.sum())
    assert np.all(np.asarray(ours[0])[past:] == 0.0) and np.all(np.asarray(ours[1])[past:] == 0.0)


def test_pallas_under_jit_with_traced_sizes():
    lhs, rhs, _, sizes = _inputs(3, jnp.float32, LAYOUTS["mixed"])
    f = jax.jit(lambda a, b, s: moe.gmm(a, b, s, method="pallas", config=CFG))
    assert rel_rmse(f(lhs, rhs, sizes), moe.gmm_loop(lhs, rhs, sizes)) < 1e-5
    other = jnp.asarray([10, 10, 0, 0, 25], jnp.int32)  # same compile, other groups
    assert rel_rmse(f(lhs, rhs, other), moe.gmm_loop(lhs, rhs, other)) < 1e-5


def test_tiled_default_block_pads_at_most_an_eighth():
    from jaxlib_ext.pallas_kernels.moe.tiled import default_block_m

    assert default_block_m(32768, 64) == 64
    assert default_block_m(45, 5) == 8
    assert default_block_m(10**6, 4) == 128


def test_group_metadata_covers_each_row_once():
    sizes = jnp.asarray(LAYOUTS["mixed"] + [0, 0], jnp.int32)
    tile, group, lo, hi = (np.asarray(a) for a in group_metadata(sizes, M, 16))
    assert tile.shape == (3 + 7 - 1,)
    covered = np.zeros(M, int)
    ends = np.cumsum(np.asarray(sizes))
    for t, g, a, b in zip(tile, group, lo, hi, strict=True):
        assert t * 16 <= a <= b <= (t + 1) * 16
        covered[a:b] += 1
        if b > a:
            assert ends[g] - sizes[g] <= a and b <= ends[g]
    assert np.all(covered == 1)


def test_bad_arguments():
    lhs, rhs, grad, sizes = _inputs(4, jnp.float32, LAYOUTS["mixed"])
    for method in ("megablox", "ragged", "dense"):
        with pytest.raises(ValueError, match="method must be one of"):
            moe.gmm(lhs, rhs, sizes, method=method)
        with pytest.raises(ValueError, match="method must be one of"):
            moe.tgmm(lhs, grad, sizes, method=method)
    with pytest.raises(ValueError, match="rhs"):
        moe.gmm(lhs, rhs[:, :5], sizes)
    with pytest.raises(ValueError, match="lhs"):
        moe.gmm(lhs[None], rhs, sizes)
    with pytest.raises(ValueError, match="group_sizes"):
        moe.gmm(lhs, rhs, sizes.astype(jnp.float32))
    with pytest.raises(ValueError, match="group_sizes"):
        moe.gmm(lhs, rhs, sizes[:3])
    with pytest.raises(ValueError, match="at most M"):
        moe.gmm(lhs, rhs, sizes + 1)
    with pytest.raises(ValueError, match=">= 0"):
        moe.gmm(lhs, rhs, sizes.at[0].set(-1))
    with pytest.raises(ValueError, match="grad"):
        moe.tgmm(lhs, grad[:3], sizes)
    with pytest.raises(ValueError, match="power of two"):
        GMMKernelConfig(block_m=24)
    with pytest.raises(TypeError, match="config"):
        moe.gmm(lhs, rhs, sizes, method="pallas", config={"block_m": 16})


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16], ids=["float32", "bfloat16"])
def test_pallas_lowers_for_h200(dtype, lower_for_h200):
    """The Triton lowering of the forward and both backward kernels succeeds for an H200."""
    from jaxlib_ext.pallas_kernels.moe.pallas import gmm_pallas

    cfg = GMMKernelConfig()
    lhs = jax.ShapeDtypeStruct((300, 128), dtype)
    rhs = jax.ShapeDtypeStruct((8, 128, 96), dtype)
    sizes = jax.ShapeDtypeStruct((8,), jnp.int32)

    def fwd_bwd(a, b, s):
        f = lambda a, b: jnp.sum(gmm_pallas(a, b, s, config=cfg).astype(jnp.float32))  # noqa: E731
        return jax.value_and_grad(f, (0, 1))(a, b)

    text = lower_for_h200(fwd_bwd, (lhs, rhs, sizes))
    assert text.count("__gpu$xla.gpu.triton") == 3


def test_pallas_bfloat16_interpreted():
    """bfloat16 operands (bf16 dots, float32 accumulation) against the float32 loop."""
    lhs, rhs, grad, sizes = _inputs(5, jnp.float32, LAYOUTS["mixed"])
    lb, rb = lhs.astype(jnp.bfloat16), rhs.astype(jnp.bfloat16)
    out = moe.gmm(lb, rb, sizes, method="pallas", config=CFG)
    assert out.dtype == jnp.bfloat16
    ref = moe.gmm_loop(lb.astype(jnp.float32), rb.astype(jnp.float32), sizes)
    assert rel_rmse(out, ref) < 1e-2
    w = moe.tgmm(lb, grad.astype(jnp.bfloat16), sizes, method="pallas", config=CFG)
    w_ref = moe.tgmm_loop(lb.astype(jnp.float32), grad.astype(jnp.bfloat16).astype(jnp.float32),
                          sizes)  # fmt: skip
    assert rel_rmse(w, w_ref) < 1e-2


_JIT_PALLAS = jax.jit(lambda a, b, s: moe.gmm_pallas(a, b, s, config=CFG))
_JIT_TILED = jax.jit(lambda a, b, s: moe.gmm_tiled(a, b, s, block_m=8))
_JIT_TGMM = jax.jit(lambda a, g, s: moe.tgmm_pallas(a, g, s, config=CFG))


@settings(max_examples=12, deadline=None, derandomize=True)
@given(st.lists(st.integers(0, 12), min_size=6, max_size=6))
def test_random_groupings(sizes):
    """Random groupings of ``M = 45`` rows into 6 groups (many empty, sums up to 45 by
    clipping the last groups), one compile per path."""
    sizes = np.asarray(sizes)
    sizes = np.minimum(sizes, np.maximum(M - (np.cumsum(sizes) - sizes), 0))
    lhs, _, grad, _ = _inputs(6, jnp.float32, [0] * 6)
    rhs = jnp.asarray(np.random.default_rng(7).normal(size=(6, K, N)), jnp.float32)
    s = jnp.asarray(sizes, jnp.int32)
    ref = moe.gmm_loop(lhs, rhs, s)
    assert rel_rmse(_JIT_PALLAS(lhs, rhs, s), ref) < 1e-5
    assert rel_rmse(_JIT_TILED(lhs, rhs, s), ref) < 1e-5
    assert rel_rmse(_JIT_TGMM(lhs, grad, s), moe.tgmm_loop(lhs, grad, s)) < 1e-5
