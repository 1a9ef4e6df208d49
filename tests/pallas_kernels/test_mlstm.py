"""mLSTM op: the reference (recurrent) vs the XLA forms (parallel, chunk) vs a float64
un-stabilised loop, state chaining, large input gates, gradients, errors."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.test_util import check_grads

from jaxlib_ext.pallas_kernels import METHODS as ALL_METHODS
from jaxlib_ext.pallas_kernels.mlstm import METHODS, XLA_FORMS, MLSTMState, mlstm
from jaxlib_ext.pallas_kernels.mlstm.chunk import mlstm_chunk
from jaxlib_ext.pallas_kernels.mlstm.parallel import mlstm_parallel
from jaxlib_ext.pallas_kernels.mlstm.reference import mlstm_recurrent
from tests.pallas_kernels._helpers import rel_rmse

NAMES = ("q", "k", "v", "i_gate", "f_gate")
B, T, H, K, V = 2, 131, 3, 12, 16  # odd T: every chunk size pads; C = 16 gives 9 chunks
#: The op's paths by test id: ``mlstm``'s ``method`` and, for ``"xla"``, its ``xla_form``.
PATHS = {
    "reference": dict(method="reference"),
    "xla-parallel": dict(method="xla", xla_form="parallel"),
    "xla-chunk": dict(method="xla", xla_form="chunk"),
}
#: The function each path runs.
KERNELS = {"reference": mlstm_recurrent, "xla-parallel": mlstm_parallel, "xla-chunk": mlstm_chunk}


def make_inputs(seed, dtype, *, b=B, t=T, h=H, kd=K, vd=V, i_shift=0.0):
    """Inputs drawn with NumPy: unit-variance ``q, k, v``, ``i~ ~ N(i_shift, 2^2)``, forget
    pre-activations ``N(2, 1.5^2)`` (gates from about 0.5 to 1), and a random stabilised state
    whose ``m`` is of the size the recurrence produces."""
    rng = np.random.default_rng(seed)
    x = dict(
        q=rng.standard_normal((b, t, h, kd)),
        k=rng.standard_normal((b, t, h, kd)),
        v=rng.standard_normal((b, t, h, vd)),
        i_gate=i_shift + 2.0 * rng.standard_normal((b, t, h)),
        f_gate=2.0 + 1.5 * rng.standard_normal((b, t, h)),
    )
    state = (
        0.5 * rng.standard_normal((b, h, kd, vd)),
        0.5 * rng.standard_normal((b, h, kd)),
        rng.uniform(-1.0, 2.0, size=(b, h)),
    )
    return {n: jnp.asarray(a, dtype) for n, a in x.items()}, MLSTMState(
        *(jnp.asarray(a, dtype) for a in state)
    )


def numpy_mlstm(x, state, scale):
    """Plain float64 loop over the un-stabilised recurrence: true ``exp(i~)``, ``sigmoid(f~)``,
    memory ``exp(m_0) C_0``, ``exp(m_0) n_0`` and the bound ``max(|n^T q|, 1)``. Returns the
    outputs and the un-stabilised final ``(C, n)``."""
    a = {n: np.asarray(x[n], np.float64) for n in NAMES}
    C0, n0, m0 = (np.asarray(s, np.float64) for s in state)
    b_, t_, h_, _ = a["q"].shape
    out = np.zeros(a["v"].shape)
    C_fin, n_fin = np.zeros(C0.shape), np.zeros(n0.shape)
    for bi in range(b_):
        for hi in range(h_):
            C = np.exp(m0[bi, hi]) * C0[bi, hi]
            n = np.exp(m0[bi, hi]) * n0[bi, hi]
            for ti in range(t_):
                i = np.exp(a["i_gate"][bi, ti, hi])
                f = 1.0 / (1.0 + np.exp(-a["f_gate"][bi, ti, hi]))
                k, v = a["k"][bi, ti, hi], a["v"][bi, ti, hi]
                C = f * C + i * np.outer(k, v)
                n = f * n + i * k
                qs = scale * a["q"][bi, ti, hi]
                out[bi, ti, hi] = C.T @ qs / max(abs(n @ qs), 1.0)
            C_fin[bi, hi], n_fin[bi, hi] = C, n
    return out, C_fin, n_fin


def unstabilised(state):
    """``(exp(m) C, exp(m) n)`` of a stabilised state, in float64."""
    C, n, m = (np.asarray(s, np.float64) for s in state)
    return np.exp(m)[..., None, None] * C, np.exp(m)[..., None] * n


def _run(path, x, state, chunk_size=64, **kw):
    return mlstm(
        *(x[n] for n in NAMES), initial_state=state, output_final_state=True, **PATHS[path],
        chunk_size=chunk_size, **kw,
    )


# --------------------------------------------------------------------------- oracle


@pytest.mark.parametrize("method", ["reference", "xla-parallel", "xla-chunk"])
def test_matches_unstabilised_float64_loop(method):
    with jax.enable_x64(True):
        x, s0 = make_inputs(0, jnp.float64, t=37, h=2, kd=5, vd=6)
        h, fin = _run(method, x, s0, chunk_size=16, scale=0.7)
        h_np, C_np, n_np = numpy_mlstm(x, s0, 0.7)
        assert h.dtype == jnp.float64 and fin.C.dtype == jnp.float64
        C, n = unstabilised(fin)
        assert rel_rmse(h, h_np) < 1e-10
        assert rel_rmse(C, C_np) < 1e-10 and rel_rmse(n, n_np) < 1e-10


@pytest.mark.parametrize("chunk_size", [16, pytest.param(64, marks=pytest.mark.slow)])
def test_float32_paths_agree_with_each_other_and_the_float64_loop(chunk_size):
    x, s0 = make_inputs(10 + chunk_size, jnp.float32)
    h_np, C_np, n_np = numpy_mlstm(x, s0, K**-0.5)
    outs = {m: _run(m, x, s0, chunk_size=chunk_size) for m in PATHS}
    for method, (h, fin) in outs.items():
        assert h.dtype == jnp.float32 and fin.C.dtype == jnp.float32
        C, n = unstabilised(fin)
        errors = {"h": rel_rmse(h, h_np), "C": rel_rmse(C, C_np), "n": rel_rmse(n, n_np)}
        assert all(e < 1e-5 for e in errors.values()), (method, errors)
    h_r, f_r = outs["reference"]
    for method in ("xla-parallel", "xla-chunk"):
        h, fin = outs[method]
        assert rel_rmse(h, h_r) < 1e-5, method
        for a, b in zip(fin, f_r):
            assert rel_rmse(a, b) < 1e-5, method


def test_zero_state_default_and_auto_is_the_xla_chunk_form():
    x, _ = make_inputs(2, jnp.float32, t=45)
    h_np, _, _ = numpy_mlstm(x, (np.zeros((B, H, K, V)), np.zeros((B, H, K)), np.zeros((B, H))),
                             K**-0.5)
    h, fin = mlstm(*(x[n] for n in NAMES))
    assert fin is None and h.shape == (B, 45, H, V)
    assert rel_rmse(h, h_np) < 1e-5
    h_auto, _ = mlstm(*(x[n] for n in NAMES), method="auto")
    h_chunk, _ = mlstm(*(x[n] for n in NAMES), method="xla", xla_form="chunk")
    np.testing.assert_array_equal(h_auto, h_chunk)
    np.testing.assert_array_equal(mlstm(*(x[n] for n in NAMES), method="xla")[0], h_chunk)
    assert METHODS == ("auto", "reference", "xla")
    assert METHODS == tuple(m for m in ALL_METHODS if m != "pallas")
    assert XLA_FORMS == ("chunk", "parallel")


# --------------------------------------------------------------------------- stabiliser


@pytest.mark.parametrize("method", ["reference", "xla-parallel", "xla-chunk"])
@pytest.mark.parametrize("i_value", [30.0, 100.0])
def test_large_input_gates_do_not_overflow(method, i_value):
    """``exp(100)`` overflows float32; the stabilised state keeps everything finite and equal
    to the float64 un-stabilised loop (whose range holds ``exp(100)``). Positive ``q, k`` keep
    ``n^T q`` a sum of positive terms, so the comparison measures the stabiliser, not the
    conditioning of a near-zero denominator."""
    x, _ = make_inputs(3, jnp.float32, t=40)
    x = dict(
        x, q=jnp.abs(x["q"]), k=jnp.abs(x["k"]),
        i_gate=jnp.full_like(x["i_gate"], i_value).at[:, ::3].add(-5.0),
    )
    h, fin = _run(method, x, None, chunk_size=16)
    zero = (np.zeros((B, H, K, V)), np.zeros((B, H, K)), np.zeros((B, H)))
    h_np, C_np, n_np = numpy_mlstm(x, zero, K**-0.5)
    assert np.all(np.isfinite(h)) and all(np.all(np.isfinite(s)) for s in fin)
    assert float(jnp.min(fin.m)) > i_value - 10  # the stabiliser carries the scale
    C, n = unstabilised(fin)
    assert rel_rmse(h, h_np) < 1e-5
    assert rel_rmse(C, C_np) < 1e-5 and rel_rmse(n, n_np) < 1e-5


def test_tiny_normaliser_uses_the_lower_bound():
    """Strongly negative input gates: ``|n^T q| < 1`` in un-stabilised units, so the output is
    the un-normalised read-out ``C^T q``."""
    x, _ = make_inputs(4, jnp.float32, t=20)
    x = dict(x, i_gate=x["i_gate"] - 12.0)
    zero = (np.zeros((B, H, K, V)), np.zeros((B, H, K)), np.zeros((B, H)))
    h_np, _, _ = numpy_mlstm(x, zero, K**-0.5)
    for method in ("reference", "xla-parallel", "xla-chunk"):
        h, _ = _run(method, x, None, chunk_size=16)
        assert rel_rmse(h, h_np) < 1e-5, method


# --------------------------------------------------------------------------- chaining


# the chunk form (what "auto" runs) by default; the reference path's carried state is checked
# token by token below; the other paths are a sweep
@pytest.mark.parametrize(
    "method",
    [*(pytest.param(m, marks=pytest.mark.slow) for m in ("reference", "xla-parallel")),
     "xla-chunk"],
)
def test_state_chaining(method):
    x, s0 = make_inputs(5, jnp.float32, t=90)
    h, fin = _run(method, x, s0, chunk_size=32)
    t1 = 45  # inside a chunk; halves of one length share a compiled program
    first = {n: a[:, :t1] for n, a in x.items()}
    second = {n: a[:, t1:] for n, a in x.items()}
    h1, mid = _run(method, first, s0, chunk_size=32)
    h2, fin2 = _run(method, second, mid, chunk_size=32)
    assert rel_rmse(jnp.concatenate([h1, h2], axis=1), h) < 1e-5
    for a, b in zip(fin2, fin):
        assert rel_rmse(a, b) < 1e-5


def test_one_step_at_a_time_equals_full_sequence():
    """Decoding: the reference path fed one token at a time with the carried state."""
    x, s0 = make_inputs(6, jnp.float32, t=9)
    h, fin = _run("xla-chunk", x, s0, chunk_size=16)
    state, steps = s0, []
    for t in range(9):
        h_t, state = _run("reference", {n: a[:, t : t + 1] for n, a in x.items()}, state)
        steps.append(h_t)
    assert rel_rmse(jnp.concatenate(steps, axis=1), h) < 1e-5
    for a, b in zip(state, fin):
        assert rel_rmse(a, b) < 1e-5


# --------------------------------------------------------------------------- gradients


@functools.partial(jax.jit, static_argnames=("method", "chunk_size"))
def _value_and_grads(x, s0, ch, cs, method, chunk_size=64):
    """Gradients of a random linear functional of the outputs and the final state (its
    un-stabilised ``C``, ``n``) wrt all inputs and the initial state."""

    def loss(x, s0):
        kw = {"chunk_size": chunk_size} if method == "xla-chunk" else {}
        h, fin = KERNELS[method](
            *(x[n] for n in NAMES), initial_state=s0, output_final_state=True, **kw
        )
        scale = jnp.exp(fin.m)
        return (
            jnp.sum(h * ch)
            + jnp.sum(scale[..., None, None] * fin.C * cs[0])
            + jnp.sum(scale[..., None] * fin.n * cs[1])
        )

    return jax.grad(loss, argnums=(0, 1))(x, s0)


@pytest.mark.parametrize(
    "method,chunk_size",
    [("xla-parallel", 64), ("xla-chunk", 16),
     pytest.param("xla-chunk", 64, marks=pytest.mark.slow)],
)
def test_gradients_match_the_reference_float32(method, chunk_size):
    x, s0 = make_inputs(7, jnp.float32, t=75)
    rng = np.random.default_rng(8)
    ch = jnp.asarray(rng.standard_normal(x["v"].shape), jnp.float32)
    cs = (jnp.asarray(0.1 * rng.standard_normal(s0.C.shape), jnp.float32),
          jnp.asarray(0.1 * rng.standard_normal(s0.n.shape), jnp.float32))
    g_r, gs_r = _value_and_grads(x, s0, ch, cs, "reference")
    g, gs = _value_and_grads(x, s0, ch, cs, method, chunk_size)
    for n in NAMES:
        assert np.all(np.isfinite(g[n])), n
        assert float(jnp.max(jnp.abs(g_r[n]))) > 0, n  # not vacuous
        assert rel_rmse(g[n], g_r[n]) < 1e-4, (n, rel_rmse(g[n], g_r[n]))
    for name, a, b in zip(("C", "n", "m"), gs, gs_r):
        assert rel_rmse(a, b) < 1e-4, (name, rel_rmse(a, b))


# the reference and the chunk path by default; the parallel path's gradients equal the
# reference's in test_gradients_match_the_reference_float32
@pytest.mark.parametrize(
    "method", ["reference", pytest.param("xla-parallel", marks=pytest.mark.slow), "xla-chunk"]
)
def test_gradients_numerically_float64(method):
    with jax.enable_x64(True):
        x, s0 = make_inputs(9, jnp.float64, b=1, t=11, h=2, kd=3, vd=4)

        def f(q, k, v, i_gate, f_gate, C0, n0, m0):
            kw = {"chunk_size": 4} if method == "xla-chunk" else {}
            h, fin = KERNELS[method](
                q, k, v, i_gate, f_gate, scale=0.5, initial_state=MLSTMState(C0, n0, m0),
                output_final_state=True, **kw,
            )
            return jnp.sum(jnp.sin(h)) + jnp.sum(jnp.exp(fin.m)[..., None] * fin.n)

        # jitted: the VJP and each finite-difference evaluation run as compiled programs
        # (eager, every op of the three paths would compile on its own)
        check_grads(jax.jit(f), (*(x[n] for n in NAMES), *s0), order=1, modes=("rev",),
                    eps=1e-6)


# --------------------------------------------------------------------------- dtypes, transforms


def test_low_precision_inputs_keep_float32_state():
    x, s0 = make_inputs(11, jnp.float32, t=33)
    xb = {n: a.astype(jnp.bfloat16) for n, a in x.items()}
    h, fin = _run("xla-chunk", xb, s0)
    assert h.dtype == jnp.bfloat16 and fin.C.dtype == jnp.float32
    h32, _ = _run("xla-chunk", {n: a.astype(jnp.float32) for n, a in xb.items()}, s0)
    assert rel_rmse(h.astype(jnp.float32), h32) < 1e-2


def test_jit_and_vmap():
    x, s0 = make_inputs(12, jnp.float32, b=1, t=20, h=2, kd=8, vd=8)
    f = jax.jit(lambda x, s: _run("xla-chunk", x, s, chunk_size=16))
    h, fin = f(x, s0)
    assert rel_rmse(h, _run("reference", x, s0)[0]) < 1e-5
    xs = {n: jnp.stack([a, a[:, ::-1]]) for n, a in x.items()}
    hv, _ = jax.vmap(lambda x: _run("xla-chunk", x, None, chunk_size=16))(xs)
    assert rel_rmse(hv[0], _run("xla-chunk", x, None, chunk_size=16)[0]) < 1e-6


# --------------------------------------------------------------------------- bad input


def _bad_cases():
    x, s0 = make_inputs(13, jnp.float32, b=2, t=9, h=2, kd=4, vd=5)
    return [
        ("q", dict(x, q=x["q"].astype(jnp.int32)), {}),
        ("q", dict(x, q=x["q"][0]), {}),  # rank
        ("k", dict(x, k=x["k"][:, :8]), {}),
        ("k", dict(x, k=x["k"][..., :3]), {}),
        ("v", dict(x, v=x["v"][:, :, :1]), {}),
        ("v", dict(x, v=x["v"][0]), {}),
        ("i_gate", dict(x, i_gate=x["i_gate"][..., None]), {}),
        ("i_gate", dict(x, i_gate=x["i_gate"].astype(jnp.int32)), {}),
        ("f_gate", dict(x, f_gate=x["f_gate"][:, :5]), {}),
        ("initial_state", x, {"initial_state": s0.C}),
        ("initial_state.C", x, {"initial_state": (s0.C[..., :3], s0.n, s0.m)}),
        ("initial_state.n", x, {"initial_state": (s0.C, s0.n[0], s0.m)}),
        ("initial_state.m", x, {"initial_state": (s0.C, s0.n, s0.m.astype(jnp.int32))}),
        ("chunk_size", x, {"chunk_size": 48}),
        ("chunk_size", x, {"chunk_size": 64.0}),
        ("method", x, {"method": "pallas"}),  # of the vocabulary, but no Pallas kernels
        ("method", x, {"method": "chunk"}),  # an XLA form, not a method
        ("xla_form", x, {"method": "xla", "xla_form": "recurrent"}),
        ("scale", x, {"scale": float("nan")}),
    ]


@pytest.mark.parametrize("case", range(19))
def test_bad_input_raises_value_error_naming_argument(case):
    cases = _bad_cases()
    assert len(cases) == 19
    name, x, kw = cases[case]
    with pytest.raises(ValueError, match=name):
        mlstm(*(x[n] for n in NAMES), **kw)
