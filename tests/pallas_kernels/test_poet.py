"""POET-X block rotations: every path of ``poet_linear`` against ``x @ W_eff`` built densely,
the Cayley–Neumann blocks against their definition, the recomputing backward against autodiff
and finite differences, the Pallas kernels in interpret mode, bad inputs, and the lowering of
the Pallas path for an H200."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.scipy.linalg import block_diag
from jax.test_util import check_grads

from jaxlib_ext.pallas_kernels import poet
from jaxlib_ext.pallas_kernels.poet import (
    cayley_neumann,
    effective_weight,
    num_block_params,
    poet_linear,
    skew,
)
from jaxlib_ext.pallas_kernels.poet.config import PoetKernelConfig
from jaxlib_ext.pallas_kernels.poet.pallas import block_apply_pallas, block_gram_pallas

PATHS = [("xla", False), ("pallas", False), ("xla", True), ("pallas", True)]


def rel(a, b):
    return float(jnp.linalg.norm(a - b) / jnp.linalg.norm(b))


def inputs(seed, n=24, m=40, b=8, lead=(2, 5), scale=0.1, dtype=np.float64):
    r = np.random.default_rng(seed)
    p = num_block_params(b)
    return (
        jnp.asarray(r.normal(size=(*lead, n)), dtype),
        jnp.asarray(r.normal(size=(n, m)) / np.sqrt(n), dtype),
        jnp.asarray(scale * r.normal(size=(n // b, p)), dtype),
        jnp.asarray(scale * r.normal(size=(m // b, p)), dtype),
        jnp.asarray(r.permutation(n), jnp.int32),
        jnp.asarray(r.permutation(m), jnp.int32),
    )


@pytest.mark.parametrize(("method", "memory"), PATHS)
def test_every_path_equals_the_dense_effective_weight_float64(method, memory):
    with jax.enable_x64(True):
        x, w, ti, to, pi, po = inputs(0)
        # W_eff assembled from its definition: S B S^T on each side
        def dense_rot(theta, perm):
            g = cayley_neumann(theta, 8)
            s = np.eye(perm.shape[0])[:, np.asarray(perm)]
            return s @ np.asarray(block_diag(*g)) @ s.T

        w_eff = dense_rot(ti, pi) @ np.asarray(w) @ dense_rot(to, po)
        expected = np.asarray(x) @ w_eff
        got = poet_linear(x, w, ti, to, pi, po, block_size=8, method=method,
                          memory_saving=memory)
        assert got.dtype == jnp.float64 and got.shape == (2, 5, 40)
        assert rel(got, expected) < 1e-10
        ref = poet_linear(x, w, ti, to, pi, po, block_size=8, method="reference")
        assert rel(ref, expected) < 1e-10


@pytest.mark.parametrize("method", ["xla", "pallas"])
def test_memory_saving_gradients_equal_autodiff_and_finite_differences(method):
    with jax.enable_x64(True):
        x, w, ti, to, pi, po = inputs(1, n=16, m=8, b=4, lead=(3,))

        def loss(memory):
            def f(x, ti, to, w=w):
                y = poet_linear(x, w, ti, to, pi, po, block_size=4, method=method,
                                memory_saving=memory)
                return jnp.sum(jnp.sin(y) * jnp.arange(y.size).reshape(y.shape))
            return f

        g_mem = jax.grad(loss(True), argnums=(0, 1, 2, 3))(x, ti, to, w)
        g_ref = jax.grad(loss(False), argnums=(0, 1, 2))(x, ti, to)
        for a, b in zip(g_mem[:3], g_ref, strict=True):
            assert rel(a, b) < 1e-10
        np.testing.assert_array_equal(g_mem[3], 0.0)  # frozen base weight
        check_grads(loss(True), (x, ti, to), order=1,
                    modes=("rev",), atol=1e-6, rtol=1e-6)


def test_theta_zero_is_the_identity_exactly():
    x, w, ti, to, pi, po = inputs(2, dtype=np.float32)
    zi, zo = jnp.zeros_like(ti), jnp.zeros_like(to)
    np.testing.assert_array_equal(cayley_neumann(zi, 8), jnp.broadcast_to(jnp.eye(8), (3, 8, 8)))
    plain = jnp.matmul(x, w, precision="highest")
    for method, memory in PATHS:
        got = poet_linear(x, w, zi, zo, pi, po, block_size=8, method=method,
                          memory_saving=memory)
        np.testing.assert_array_equal(got, plain)


def test_convention_blocks_act_on_row_vectors():
    """Identity permutations, theta_out = 0, w = I: W_eff = BlockDiag(G) (not its transpose)."""
    with jax.enable_x64(True):
        _, _, ti, _, _, _ = inputs(3)
        ident = jnp.arange(24, dtype=jnp.int32)
        zo = jnp.zeros((3, num_block_params(8)))
        eye = jnp.eye(24)
        got = poet_linear(eye, eye, ti, zo, ident, ident, block_size=8, method="xla")
        np.testing.assert_allclose(got, block_diag(*cayley_neumann(ti, 8)), atol=1e-15)
        q = skew(ti[:1], 8)[0]
        np.testing.assert_array_equal(q, -q.T)
        np.testing.assert_array_equal(q[np.triu_indices(8, 1)], ti[0])


def test_cayley_neumann_coefficients_and_orthogonality_error():
    with jax.enable_x64(True):
        r = np.random.default_rng(4)
        b = 16
        theta = jnp.asarray(0.05 * r.normal(size=(3, num_block_params(b))))
        q = np.asarray(skew(theta, b))
        i = np.eye(b)
        mp = np.linalg.matrix_power
        pin = np.stack([i + 2 * a + 2 * mp(a, 2) + 2 * mp(a, 3) + mp(a, 4) for a in q])
        np.testing.assert_allclose(cayley_neumann(theta, b), pin, rtol=0, atol=1e-14)

        def orth_err(t):
            g = np.asarray(cayley_neumann(t, b))
            return np.linalg.norm(np.swapaxes(g, -1, -2) @ g - i)

        ratio = orth_err(theta) / orth_err(theta / 2)
        assert 15.0 < ratio < 17.0, ratio  # G^T G - I = -2 Q^4 + Q^8


def test_singular_values_preserved_to_the_orthogonality_error():
    with jax.enable_x64(True):
        x, w, ti, to, pi, po = inputs(5, scale=0.02)
        sv_w = np.linalg.svd(np.asarray(w), compute_uv=False)
        sv_eff = np.linalg.svd(np.asarray(effective_weight(w, ti, to, pi, po, 8)),
                               compute_uv=False)
        g = [np.asarray(cayley_neumann(t, 8)) for t in (ti, to)]
        orth = max(np.abs(np.swapaxes(a, -1, -2) @ a - np.eye(8)).max() for a in g)
        assert 0 < orth < 1e-3
        np.testing.assert_allclose(sv_eff, sv_w, atol=10 * orth * sv_w.max())
        assert np.abs(sv_eff - sv_w).max() > 0  # not trivially equal: the rotations act


@pytest.mark.parametrize("tokens", [1, 70])
def test_pallas_kernels_match_einsum(tokens):
    r = np.random.default_rng(6)
    k, b = 3, 32
    z = jnp.asarray(r.normal(size=(tokens, k * b)), jnp.float32)
    dy = jnp.asarray(r.normal(size=(tokens, k * b)), jnp.float32)
    g = jnp.asarray(r.normal(size=(k, b, b)), jnp.float32)
    cfg = PoetKernelConfig(block_tokens=16, block_cols=16, block_k=16, interpret=True)
    want = jnp.einsum("tkb,kbc->tkc", z.reshape(tokens, k, b), g).reshape(tokens, k * b)
    assert rel(block_apply_pallas(z, g, cfg), want) < 1e-6
    want = jnp.einsum("tkb,tkc->kbc", z.reshape(tokens, k, b), dy.reshape(tokens, k, b))
    assert rel(block_gram_pallas(z, dy, k, cfg), want) < 1e-6


@pytest.mark.parametrize(
    ("change", "error", "match"),
    [
        (dict(block_size=5), ValueError, "must divide n"),
        (dict(block_size=1), ValueError, "block_size must be an int >= 2"),
        (dict(perm_in=jnp.arange(23)), ValueError, "perm_in must have length n = 24"),
        (dict(perm_out=jnp.arange(41)), ValueError, "perm_out must have length m = 40"),
        (dict(perm_in=jnp.arange(24.0)), TypeError, "perm_in must be a 1-d integer array"),
        (dict(theta_in=jnp.zeros((3, 27))), ValueError, "theta_in must have shape"),
        (dict(x=jnp.zeros((2, 25))), ValueError, "x must have shape"),
        (dict(method="cuda"), ValueError, "method must be one of"),
        (dict(method="reference", memory_saving=True), ValueError, "memory_saving"),
    ],
)
def test_bad_inputs_raise_naming_the_argument(change, error, match):
    x, w, ti, to, pi, po = inputs(7, dtype=np.float32)
    kw = dict(x=x, w=w, theta_in=ti, theta_out=to, perm_in=pi, perm_out=po, block_size=8)
    kw.update(change)
    with pytest.raises(error, match=match):
        poet_linear(**kw)


def test_methods_listed():
    from jaxlib_ext.pallas_kernels import METHODS

    assert poet.METHODS == METHODS == ("auto", "reference", "xla", "pallas")


@pytest.mark.parametrize("memory", [False, True])
def test_pallas_path_lowers_through_triton_for_h200(memory, lower_for_h200):
    """On CPU: forward+backward of the Pallas path lowered for CUDA against an abstract H200."""
    n, m, b = 256, 512, 128
    p = num_block_params(b)
    sds = jax.ShapeDtypeStruct
    args = [sds((2, 64, n), jnp.bfloat16), sds((n, m), jnp.bfloat16), sds((n // b, p), jnp.float32),
            sds((m // b, p), jnp.float32), sds((n,), jnp.int32), sds((m,), jnp.int32)]

    def f(x, w, ti, to, pi, po):
        def loss(x, ti, to):
            y = poet_linear(x, w, ti.astype(x.dtype), to.astype(x.dtype), pi, po, block_size=b,
                            method="pallas", memory_saving=memory,
                            config=PoetKernelConfig(interpret=False))
            return jnp.sum(y.astype(jnp.float32))
        return jax.grad(loss, argnums=(0, 1, 2))(x, ti, to)

    assert "triton" in lower_for_h200(f, args)


def test_memory_saving_keeps_only_the_input_for_the_backward_pass():
    """Residuals of ``jax.vjp`` of the jitted layer: the input, the base weight and the small
    rotation parameters in memory mode; several activation-sized arrays otherwise."""
    x, w, ti, to, pi, po = inputs(8, n=32, m=64, b=8, lead=(256,), dtype=np.float32)

    def saved(memory):
        layer = jax.jit(lambda x, ti, to: poet_linear(x, w, ti, to, pi, po, block_size=8,
                                                      memory_saving=memory))
        _, vjp = jax.vjp(layer, x, ti, to)
        return sum(a.nbytes for a in jax.tree.leaves(vjp) if hasattr(a, "nbytes"))

    small = x.nbytes + w.nbytes + ti.nbytes + to.nbytes + pi.nbytes + po.nbytes
    assert saved(True) <= small
    assert saved(False) > small + x.nbytes
