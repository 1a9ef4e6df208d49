"""Momentum delta rule op: chunk vs recurrent vs a NumPy loop, reductions, continuation, errors."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.test_util import check_grads

from jaxlib_ext.pallas_kernels._common import load_kernel, segsum, unit_lower_inverse
from jaxlib_ext.pallas_kernels.gated_delta import gated_delta_rule
from jaxlib_ext.pallas_kernels.mdn import momentum_delta_rule
from jaxlib_ext.pallas_kernels.mdn.chunk import momentum_delta_rule_chunk
from jaxlib_ext.pallas_kernels.mdn.reference import momentum_delta_rule_recurrent
from tests.pallas_kernels._helpers import rel_rmse

NAMES = ("q", "k", "v", "p", "log_alpha", "log_mu", "beta", "eta")
B, T, H, K, V = 2, 131, 3, 12, 16  # odd T: every chunk size pads; C = 16 gives 9 chunks


def make_inputs(seed, dtype, *, b=B, t=T, h=H, kd=K, vd=V, n_alpha=0.8, n_mu=4.0, eta="pos"):
    """Gates as in the reference implementation's tests: logsigmoid(U)/n, beta = 0.5 sigmoid.

    Drawn with NumPy (no per-shape XLA compilation), then cast to ``dtype``.
    """
    rng = np.random.default_rng(seed)

    def unit(shape):
        x = rng.standard_normal(shape)
        return x / np.linalg.norm(x, axis=-1, keepdims=True)

    def log_sigmoid(x):
        return -np.logaddexp(0.0, -x)

    log_alpha = log_sigmoid(rng.uniform(size=(b, t, h))) / n_alpha
    z = rng.standard_normal((b, t, h))
    x = dict(
        q=unit((b, t, h, kd)),
        k=unit((b, t, h, kd)),
        v=rng.standard_normal((b, t, h, vd)),
        p=np.exp(log_alpha)[..., None] * unit((b, t, h, kd)),
        log_alpha=log_alpha,
        log_mu=log_sigmoid(rng.uniform(size=(b, t, h))) / n_mu,
        beta=0.5 / (1.0 + np.exp(-rng.standard_normal((b, t, h)))),  # >= 1e-3 in practice
        eta=1.0 + np.tanh(z) if eta == "pos" else z,  # layer range (0, 2), or N(0,1) as in fla
    )
    h0 = 0.5 * rng.standard_normal((2, b, h, kd, vd))
    return {n: jnp.asarray(a, dtype) for n, a in x.items()}, jnp.asarray(h0, dtype)


def numpy_mdn(x, h0, scale):
    """Plain float64 loop over eqs. (1)-(4) of the reference docstring."""
    a = {n: np.asarray(x[n], np.float64) for n in NAMES}
    b_, t_, h_, _ = a["q"].shape
    o = np.zeros(a["v"].shape)
    fin = np.asarray(h0, np.float64).copy()
    for bi in range(b_):
        for hi in range(h_):
            S, M = fin[0, bi, hi], fin[1, bi, hi]
            for ti in range(t_):
                w = S.T @ a["p"][bi, ti, hi] - a["v"][bi, ti, hi]
                M = np.exp(a["log_mu"][bi, ti, hi]) * M + a["eta"][bi, ti, hi] * np.outer(
                    a["k"][bi, ti, hi], w
                )
                S = np.exp(a["log_alpha"][bi, ti, hi]) * S - a["beta"][bi, ti, hi] * M
                o[bi, ti, hi] = S.T @ (scale * a["q"][bi, ti, hi])
            fin[0, bi, hi], fin[1, bi, hi] = S, M
    return o, fin


@functools.partial(jax.jit, static_argnames=("method", "chunk_size"))
def _value_and_grads(x, h0, co, cf, method, chunk_size=64):
    """Outputs, final state and gradients of a random linear functional wrt all nine inputs."""

    def loss(x, h0):
        fn = momentum_delta_rule_recurrent if method == "reference" else momentum_delta_rule_chunk
        kw = {} if method == "reference" else {"chunk_size": chunk_size}
        o, fin = fn(
            *(x[n] for n in NAMES), scale=0.3, initial_state=h0, output_final_state=True, **kw
        )
        return jnp.sum(o * co) + jnp.sum(fin * cf), (o, fin)

    (_, (o, fin)), grads = jax.value_and_grad(loss, argnums=(0, 1), has_aux=True)(x, h0)
    return o, fin, grads


def _compare_chunk_to_recurrent(dtype, chunk_size, tol, seed, **gate_kw):
    x, h0 = make_inputs(seed, dtype, **gate_kw)
    rng = np.random.default_rng(seed + 100)
    co = jnp.asarray(rng.standard_normal(x["v"].shape), dtype)
    cf = jnp.asarray(rng.standard_normal(h0.shape), dtype)
    o_r, f_r, (g_r, gh_r) = _value_and_grads(x, h0, co, cf, "reference")
    o_c, f_c, (g_c, gh_c) = _value_and_grads(x, h0, co, cf, "xla", chunk_size)
    assert o_c.dtype == dtype and f_c.dtype == dtype
    errors = {"o": rel_rmse(o_c, o_r), "final_state": rel_rmse(f_c, f_r)}
    errors.update({f"d{n}": rel_rmse(g_c[n], g_r[n]) for n in NAMES})
    errors["dinitial_state"] = rel_rmse(gh_c, gh_r)
    for name, err in errors.items():
        assert np.isfinite(err) and err < tol, (name, err, errors)
    for g in [*g_r.values(), gh_r]:  # the comparison is not vacuous
        assert float(jnp.max(jnp.abs(g))) > 0


# --------------------------------------------------------------------------- oracles


def test_recurrent_matches_numpy_loop_float64():
    with jax.enable_x64(True):
        x, h0 = make_inputs(0, jnp.float64, b=2, t=37, h=2, kd=5, vd=6, eta="normal")
        o, fin = momentum_delta_rule(
            **x, scale=0.7, initial_state=h0, output_final_state=True, method="reference"
        )
        o_np, fin_np = numpy_mdn(x, h0, 0.7)
        assert o.dtype == jnp.float64 and fin.dtype == jnp.float64
        np.testing.assert_allclose(o, o_np, rtol=0, atol=1e-12)
        np.testing.assert_allclose(fin, fin_np, rtol=0, atol=1e-12)


def test_recurrent_gradients_numerically_float64():
    with jax.enable_x64(True):
        x, h0 = make_inputs(1, jnp.float64, b=1, t=8, h=2, kd=3, vd=4, eta="normal")

        def f(q, k, v, p, la, lm, beta, eta, h0):
            o, fin = momentum_delta_rule_recurrent(
                q, k, v, p, la, lm, beta, eta, scale=0.5, initial_state=h0, output_final_state=True
            )
            return jnp.sum(jnp.sin(o)) + jnp.sum(fin**2)

        # jitted: the VJP and the finite differences run as compiled programs
        check_grads(jax.jit(f), (*(x[n] for n in NAMES), h0), order=1, modes=("rev",),
                    eps=1e-6)


# --------------------------------------------------------------------------- chunk vs recurrent


_slow = pytest.mark.slow


@pytest.mark.parametrize(
    "chunk_size", [64, *(pytest.param(c, marks=_slow) for c in (16, 32, 128))]
)
def test_chunk_matches_recurrent_float32(chunk_size):
    _compare_chunk_to_recurrent(jnp.float32, chunk_size, 1e-4, seed=10 + chunk_size)


@pytest.mark.parametrize(
    "chunk_size", [16, *(pytest.param(c, marks=_slow) for c in (32, 64, 128))]
)
def test_chunk_matches_recurrent_float64(chunk_size):
    with jax.enable_x64(True):
        _compare_chunk_to_recurrent(jnp.float64, chunk_size, 1e-9, seed=20 + chunk_size)


@pytest.mark.parametrize(
    ("n_alpha", "n_mu", "eta"),
    [
        (8.0, 0.8, "normal"),
        pytest.param(0.8, 8.0, "pos", marks=_slow),
        pytest.param(1.0, 1.0, "normal", marks=_slow),
    ],
)
def test_chunk_matches_recurrent_gate_grid_float32(n_alpha, n_mu, eta):
    """Slow/fast alpha vs mu (incl. mu decaying much faster than alpha) and eta of either sign.
    At C = 64 (the longest decay spans in a chunk), whose programs the float32 case above has
    compiled."""
    _compare_chunk_to_recurrent(jnp.float32, 64, 1e-4, seed=3, n_alpha=n_alpha, n_mu=n_mu, eta=eta)


def test_public_op_paths_agree_and_auto_is_chunk_on_cpu():
    x, h0 = make_inputs(4, jnp.float32, t=45)
    outs = {
        m: momentum_delta_rule(**x, initial_state=h0, output_final_state=True, method=m)
        for m in ("reference", "xla", "auto")
    }
    assert rel_rmse(outs["xla"][0], outs["reference"][0]) < 1e-5
    assert rel_rmse(outs["xla"][1], outs["reference"][1]) < 1e-5
    if jax.default_backend() == "cpu":
        np.testing.assert_array_equal(outs["auto"][0], outs["xla"][0])
    o, fin = momentum_delta_rule(**x)  # defaults: zero state, no final state
    assert o.shape == (B, 45, H, V) and fin is None


# --------------------------------------------------------------------------- reductions


def _numpy_deltanet(q, k, v, beta, scale):
    """DeltaNet: S_t = S_{t-1} + beta_t k_t (v_t - S_{t-1}^T k_t)^T, o_t = S_t^T (scale q_t)."""
    q, k, v, beta = (np.asarray(a, np.float64) for a in (q, k, v, beta))
    o = np.zeros(v.shape)
    for bi in range(q.shape[0]):
        for hi in range(q.shape[2]):
            S = np.zeros((q.shape[3], v.shape[3]))
            for ti in range(q.shape[1]):
                kt = k[bi, ti, hi]
                S = S + beta[bi, ti, hi] * np.outer(kt, v[bi, ti, hi] - S.T @ kt)
                o[bi, ti, hi] = S.T @ (scale * q[bi, ti, hi])
    return o


@pytest.mark.parametrize("method", ["reference", "xla"])
def test_reduces_to_gated_deltanet_and_deltanet(method):
    with jax.enable_x64(True):
        x, _ = make_inputs(5, jnp.float64, t=53)
        s0 = jnp.asarray(0.5 * np.random.default_rng(9).standard_normal((B, H, K, V)))
        # mu = 0, eta = 1, p = alpha * k: Gated DeltaNet (M_0 is irrelevant when mu = 0)
        red = dict(
            x,
            log_mu=jnp.full_like(x["log_mu"], -jnp.inf),
            eta=jnp.ones_like(x["eta"]),
            p=jnp.exp(x["log_alpha"])[..., None] * x["k"],
        )
        h0 = jnp.stack([s0, jnp.ones_like(s0)])
        o, fin = momentum_delta_rule(
            **red, initial_state=h0, output_final_state=True, method=method, chunk_size=16
        )
        o_g, s_g = gated_delta_rule(
            x["q"],
            x["k"],
            x["v"],
            x["log_alpha"],
            x["beta"],
            initial_state=s0,
            output_final_state=True,
            method="reference",
        )
        assert rel_rmse(o, o_g) < 1e-12
        assert rel_rmse(fin[0], s_g) < 1e-12
        # additionally alpha = 1: DeltaNet, against a hand-written loop
        red = dict(red, log_alpha=jnp.zeros_like(x["log_alpha"]), p=x["k"])
        o, _ = momentum_delta_rule(**red, method=method, chunk_size=16)
        o_np = _numpy_deltanet(x["q"], x["k"], x["v"], x["beta"], K**-0.5)
        np.testing.assert_allclose(o, o_np, rtol=0, atol=1e-12)


@pytest.mark.parametrize("method", ["reference", "xla"])
def test_beta_zero_only_decays_memory(method):
    """beta = 0: S_t = A_t S_0 exactly (no epsilon in the chunk form), M still evolves."""
    with jax.enable_x64(True):
        x, h0 = make_inputs(6, jnp.float64, t=41)
        x = dict(x, beta=jnp.zeros_like(x["beta"]))
        o, fin = momentum_delta_rule(
            **x, initial_state=h0, output_final_state=True, method=method, chunk_size=16
        )
        logA = jnp.cumsum(x["log_alpha"], axis=1)
        o_ref = jnp.einsum("bth,bhkv,bthk->bthv", jnp.exp(logA), h0[0], x["q"]) * K**-0.5
        assert rel_rmse(o, o_ref) < 1e-13
        assert rel_rmse(fin[0], jnp.exp(logA[:, -1])[..., None, None] * h0[0]) < 1e-13
        assert not np.allclose(fin[1], h0[1])


# --------------------------------------------------------------------------- state continuation


@pytest.mark.parametrize("method", ["reference", "xla"])
def test_state_continuation(method):
    x, h0 = make_inputs(7, jnp.float32, t=90)
    kw = dict(output_final_state=True, method=method, chunk_size=32)
    o, fin = momentum_delta_rule(**x, initial_state=h0, **kw)
    t1 = 45  # inside a chunk; halves of one length share a compiled program
    first = {n: a[:, :t1] for n, a in x.items()}
    second = {n: a[:, t1:] for n, a in x.items()}
    o1, mid = momentum_delta_rule(**first, initial_state=h0, **kw)
    o2, fin2 = momentum_delta_rule(**second, initial_state=mid, **kw)
    assert rel_rmse(jnp.concatenate([o1, o2], axis=1), o) < 1e-5
    assert rel_rmse(fin2, fin) < 1e-5


# --------------------------------------------------------------------------- dtypes, transforms


def test_low_precision_inputs_keep_float32_state():
    x, h0 = make_inputs(8, jnp.float32, t=33)
    xb = {n: a.astype(jnp.bfloat16) for n, a in x.items()}
    o, fin = momentum_delta_rule(**xb, initial_state=h0, output_final_state=True)
    assert o.dtype == jnp.bfloat16 and fin.dtype == jnp.float32
    o32, _ = momentum_delta_rule(
        **{n: a.astype(jnp.float32) for n, a in xb.items()}, initial_state=h0
    )
    assert rel_rmse(o.astype(jnp.float32), o32) < 1e-2


def test_jit_and_vmap_skip_value_checks_on_tracers():
    x, h0 = make_inputs(9, jnp.float32, b=1, t=20, h=2, kd=8, vd=8)

    @jax.jit
    def f(x, h0):
        return momentum_delta_rule(**x, initial_state=h0, output_final_state=True)

    o, fin = f(x, h0)
    o_eager, _ = momentum_delta_rule(**x, initial_state=h0)
    assert rel_rmse(o, o_eager) < 1e-6
    # negative beta cannot be checked on a tracer: no error under jit
    f(dict(x, beta=-x["beta"]), h0)

    # vmap over an extra leading axis of every input (its first slice: the eager call above)
    xs = {n: jnp.stack([a, a[::-1]]) for n, a in x.items()}
    ov, _ = jax.vmap(lambda x: momentum_delta_rule(**x, initial_state=h0))(xs)
    assert rel_rmse(ov[0], o_eager) < 1e-6


@pytest.mark.skipif(
    load_kernel("jaxlib_ext.pallas_kernels.mdn.pallas", "momentum_delta_rule_pallas") is None,
    reason="Pallas kernel module not importable",
)
def test_pallas_dispatch_matches_reference():
    x, h0 = make_inputs(11, jnp.float32, b=1, t=21, h=2, kd=8, vd=8)
    o_p, f_p = momentum_delta_rule(
        **x, initial_state=h0, output_final_state=True, method="pallas", chunk_size=16
    )
    o_r, f_r = momentum_delta_rule(
        **x, initial_state=h0, output_final_state=True, method="reference"
    )
    assert rel_rmse(o_p, o_r) < 1e-4 and rel_rmse(f_p, f_r) < 1e-4


# --------------------------------------------------------------------------- bad input


def _bad_cases():
    x, h0 = make_inputs(12, jnp.float32, b=2, t=9, h=2, kd=4, vd=5)
    cases = [
        ("q", dict(x, q=x["q"].astype(jnp.int32)), {}),
        ("k", dict(x, k=x["k"][:, :8]), {}),
        ("p", dict(x, p=x["p"][..., :3]), {}),
        ("v", dict(x, v=x["v"][:, :, :1]), {}),
        ("v", dict(x, v=x["v"][0]), {}),  # rank
        ("q", dict(x, q=x["q"][0]), {}),  # rank
        ("log_alpha", dict(x, log_alpha=x["log_alpha"][..., None]), {}),
        ("log_mu", dict(x, log_mu=x["log_mu"][:, :5]), {}),
        ("eta", dict(x, eta=x["eta"][:1]), {}),
        ("beta", dict(x, beta=-x["beta"]), {}),
        ("beta", dict(x, beta=x["beta"].astype(jnp.int32)), {}),
        ("k", dict(x, k=x["k"].astype(jnp.int32)), {}),
        ("initial_state", x, {"initial_state": h0[0]}),
        ("initial_state", x, {"initial_state": h0[:, :, :, :3]}),
        ("initial_state", x, {"initial_state": h0.astype(jnp.int32)}),
        ("chunk_size", x, {"chunk_size": 48}),
        ("chunk_size", x, {"chunk_size": 64.0}),
        ("method", x, {"method": "fused"}),
    ]
    return cases


@pytest.mark.parametrize("case", range(18))
def test_bad_input_raises_value_error_naming_argument(case):
    cases = _bad_cases()
    assert len(cases) == 18
    name, x, kw = cases[case]
    with pytest.raises(ValueError, match=name):
        momentum_delta_rule(**x, **kw)


# --------------------------------------------------------------------------- shared helpers


@pytest.mark.parametrize("c", [1, 5, *(pytest.param(c, marks=_slow) for c in (16, 64)), 100])
def test_unit_lower_inverse_and_segsum(c):
    with jax.enable_x64(True):
        rng = np.random.default_rng(c)
        L = np.tril(0.3 * rng.standard_normal((2, 3, c, c)), -1)
        # jitted: one program per size (eager, each matmul level would compile on its own)
        X = np.asarray(jax.jit(unit_lower_inverse)(jnp.asarray(L)))
        np.testing.assert_allclose(X, np.linalg.inv(np.eye(c) + L), rtol=0, atol=1e-12)
        x = rng.uniform(-1.0, 0.0, size=(2, c))
        x[:, c // 2] = -np.inf  # a gate of exactly zero
        seg = np.asarray(jax.jit(segsum)(jnp.asarray(x)))
        # want[:, i, j] = x[:, j + 1 : i + 1].sum(-1) for j <= i, -inf above the diagonal
        want = np.full((2, c, c), -np.inf)
        for i in range(c):
            for j in range(i + 1):
                want[:, i, j] = x[:, j + 1 : i + 1].sum(-1)
        np.testing.assert_allclose(seg, want, rtol=0, atol=1e-13)
