"""Gated delta rule op: chunk and Pallas vs recurrent vs a NumPy loop, continuation, bad input."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxlib_ext.pallas_kernels.gated_delta import (
    gated_delta_rule,
    gated_delta_rule_chunk,
    gated_delta_rule_pallas,
    gated_delta_rule_recurrent,
)
from jaxlib_ext.pallas_kernels.mdn import MDNKernelConfig
from tests.pallas_kernels._helpers import gdn_inputs, rel_rmse

NAMES = ("q", "k", "v", "g", "beta")
B, T, H, K, V = 2, 131, 3, 12, 16


def make_inputs(seed, dtype, *, b=B, t=T, h=H, kd=K, vd=V):
    return gdn_inputs(seed, dtype, b=b, t=t, h=h, kd=kd, vd=vd)


def numpy_gdn(x, s0, scale):
    a = {n: np.asarray(x[n], np.float64) for n in NAMES}
    o = np.zeros(a["v"].shape)
    fin = np.asarray(s0, np.float64).copy()
    b_, t_, h_, _ = a["q"].shape
    for bi in range(b_):
        for hi in range(h_):
            S = fin[bi, hi]
            for ti in range(t_):
                kt = a["k"][bi, ti, hi]
                S = np.exp(a["g"][bi, ti, hi]) * S
                S = S + a["beta"][bi, ti, hi] * np.outer(kt, a["v"][bi, ti, hi] - S.T @ kt)
                o[bi, ti, hi] = S.T @ (scale * a["q"][bi, ti, hi])
            fin[bi, hi] = S
    return o, fin


@functools.partial(jax.jit, static_argnames=("method", "chunk_size"))
def _value_and_grads(x, s0, co, cf, method, chunk_size=64):
    def loss(x, s0):
        fn = gated_delta_rule_recurrent if method == "reference" else gated_delta_rule_chunk
        kw = {} if method == "reference" else {"chunk_size": chunk_size}
        o, fin = fn(
            *(x[n] for n in NAMES), scale=0.4, initial_state=s0, output_final_state=True, **kw
        )
        return jnp.sum(o * co) + jnp.sum(fin * cf), (o, fin)

    (_, (o, fin)), grads = jax.value_and_grad(loss, argnums=(0, 1), has_aux=True)(x, s0)
    return o, fin, grads


def test_recurrent_matches_numpy_loop_float64():
    with jax.enable_x64(True):
        x, s0 = make_inputs(0, jnp.float64, t=29, kd=5, vd=6)
        o, fin = gated_delta_rule(
            **x, scale=0.6, initial_state=s0, output_final_state=True, method="reference"
        )
        o_np, fin_np = numpy_gdn(x, s0, 0.6)
        np.testing.assert_allclose(o, o_np, rtol=0, atol=1e-12)
        np.testing.assert_allclose(fin, fin_np, rtol=0, atol=1e-12)


_F32, _F64 = (jnp.float32, 1e-4), (jnp.float64, 1e-9)
_slow = pytest.mark.slow


@pytest.mark.parametrize(
    ("dtype", "tol", "chunk_size"),
    [
        pytest.param(*_F32, 16, id="f32-16"),
        pytest.param(*_F64, 64, id="f64-64"),
        *(pytest.param(*_F32, c, id=f"f32-{c}", marks=_slow) for c in (32, 64, 128)),
        *(pytest.param(*_F64, c, id=f"f64-{c}", marks=_slow) for c in (16, 32, 128)),
    ],
)
def test_chunk_matches_recurrent(dtype, tol, chunk_size):
    with jax.enable_x64(dtype == jnp.float64):
        x, s0 = make_inputs(chunk_size, dtype)
        rng = np.random.default_rng(1)
        co = jnp.asarray(rng.standard_normal(x["v"].shape), dtype)
        cf = jnp.asarray(rng.standard_normal(s0.shape), dtype)
        o_r, f_r, (g_r, gs_r) = _value_and_grads(x, s0, co, cf, "reference")
        o_c, f_c, (g_c, gs_c) = _value_and_grads(x, s0, co, cf, "xla", chunk_size)
        errors = {"o": rel_rmse(o_c, o_r), "final_state": rel_rmse(f_c, f_r)}
        errors.update({f"d{n}": rel_rmse(g_c[n], g_r[n]) for n in NAMES})
        errors["dinitial_state"] = rel_rmse(gs_c, gs_r)
        for name, err in errors.items():
            assert np.isfinite(err) and err < tol, (name, err, errors)


@functools.partial(jax.jit, static_argnames=("chunk_size",))
def _pallas_value_and_grads(x, s0, co, cf, chunk_size):
    """One compiled program (eager, each op of the loss and of the custom VJP's glue would
    compile on its own)."""
    config = MDNKernelConfig(interpret=jax.default_backend() == "cpu", poison_outputs=True)

    def loss(x, s0):
        o, fin = gated_delta_rule_pallas(
            *(x[n] for n in NAMES), scale=0.4, initial_state=s0, output_final_state=True,
            chunk_size=chunk_size, config=config,
        )  # fmt: skip
        return jnp.sum(o.astype(jnp.float32) * co) + jnp.sum(fin * cf), (o, fin)

    (_, (o, fin)), grads = jax.value_and_grad(loss, argnums=(0, 1), has_aux=True)(x, s0)
    return o, fin, grads


@pytest.mark.parametrize(
    ("dtype", "tol", "chunk_size"),
    [(jnp.float32, 1e-4, 16), pytest.param(jnp.bfloat16, 1e-2, 32, marks=pytest.mark.slow)],
    ids=["f32", "bf16"],
)
def test_pallas_matches_recurrent(dtype, tol, chunk_size):
    """The Pallas path (the momentum delta rule's kernels at mu = 0, eta = 1, p = alpha k;
    interpret mode on CPU, unwritten outputs NaN): outputs, final state and every gradient
    against the recurrence, at an odd length and K != V (both padded)."""
    x, s0 = make_inputs(6, jnp.float32, b=1, t=37, h=1, kd=12, vd=20)
    x = {n: a.astype(dtype) if n in ("q", "k", "v") else a for n, a in x.items()}
    rng = np.random.default_rng(2)
    co = jnp.asarray(rng.standard_normal(x["v"].shape), jnp.float32)
    cf = jnp.asarray(rng.standard_normal(s0.shape), jnp.float32)
    x32 = {n: a.astype(jnp.float32) for n, a in x.items()}
    o_r, f_r, (g_r, gs_r) = _value_and_grads(x32, s0, co, cf, "reference")
    o_p, f_p, (g_p, gs_p) = _pallas_value_and_grads(x, s0, co, cf, chunk_size)
    assert o_p.dtype == dtype and f_p.shape == s0.shape and f_p.dtype == jnp.float32
    errors = {"o": rel_rmse(o_p, o_r), "final_state": rel_rmse(f_p, f_r)}
    errors.update({f"d{n}": rel_rmse(g_p[n], g_r[n]) for n in NAMES})
    errors["dinitial_state"] = rel_rmse(gs_p, gs_r)
    for name, err in errors.items():
        assert np.isfinite(err) and err < tol, (name, err, errors)


@pytest.mark.parametrize("method", ["reference", "xla"])
def test_state_continuation(method):
    x, s0 = make_inputs(3, jnp.float32, t=74)  # halves of 37 (inside a chunk): one program
    kw = dict(output_final_state=True, method=method, chunk_size=16)
    o, fin = gated_delta_rule(**x, initial_state=s0, **kw)
    o1, mid = gated_delta_rule(**{n: a[:, :37] for n, a in x.items()}, initial_state=s0, **kw)
    o2, fin2 = gated_delta_rule(**{n: a[:, 37:] for n, a in x.items()}, initial_state=mid, **kw)
    assert rel_rmse(jnp.concatenate([o1, o2], axis=1), o) < 1e-5
    assert rel_rmse(fin2, fin) < 1e-5


def test_auto_defaults_and_dtypes():
    x, _ = make_inputs(4, jnp.float32, t=40)
    xb = {n: a.astype(jnp.bfloat16) for n, a in x.items()}
    o, fin = gated_delta_rule(**xb, output_final_state=True)
    assert o.dtype == jnp.bfloat16 and fin.dtype == jnp.float32 and fin.shape == (B, H, K, V)
    o_r, _ = gated_delta_rule(**x, method="reference")
    assert rel_rmse(o.astype(jnp.float32), o_r) < 2e-2


@pytest.mark.parametrize(
    ("name", "change"),
    [
        ("q", lambda x, s: (dict(x, q=x["q"][0]), {})),
        ("k", lambda x, s: (dict(x, k=x["k"][..., :3]), {})),
        ("v", lambda x, s: (dict(x, v=x["v"][:, :4]), {})),
        ("g", lambda x, s: (dict(x, g=x["g"][..., None]), {})),
        ("beta", lambda x, s: (dict(x, beta=-x["beta"]), {})),
        ("beta", lambda x, s: (dict(x, beta=x["beta"].astype(jnp.int32)), {})),
        ("initial_state", lambda x, s: (x, {"initial_state": s[None]})),
        ("chunk_size", lambda x, s: (x, {"chunk_size": 8})),
        ("method", lambda x, s: (x, {"method": "naive"})),
    ],
)
def test_bad_input(name, change):
    x, s0 = make_inputs(5, jnp.float32, t=7, kd=4, vd=4)
    x, kw = change(x, s0)
    with pytest.raises(ValueError, match=name):
        gated_delta_rule(**x, **kw)
