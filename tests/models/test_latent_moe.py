"""LatentMoE (arXiv 2601.18089): dispatch, router, balancing, identity reduction, expert
parallelism and argument errors.

The sorted dispatches (``"xla"``, ``"pallas"`` interpreted, ``"auto"``) equal the dense
reference (``"reference"``) at relative 1e-5 (float32) and 1e-12 (float64), forward and
gradients, with tied router scores, an expert that receives no token and token counts that are
not multiples of the kernel's row tile (16 here).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxlib_ext.core import sharding
from jaxlib_ext.models.latent_moe import (
    LatentMoE,
    LatentMoEConfig,
    load_metrics,
    route,
    router_bias_update,
)
from jaxlib_ext.pallas_kernels.moe.config import GMMKernelConfig

D, E, K, M, L, MS = 32, 8, 3, 24, 16, 20
CFG = GMMKernelConfig(block_m=16, block_n=16, block_k=16, interpret=True)
TOL = {"float32": 1e-5, "float64": 1e-12}
TIED = (2, 5)  # experts with identical router columns: their scores tie on every token
DEAD = 7  # an expert no token selects (a large negative correction bias)


def _rel(out, ref) -> float:
    out, ref = np.asarray(out, np.float64), np.asarray(ref, np.float64)
    return float(np.linalg.norm(out - ref) / np.linalg.norm(ref))


def _layer(method="xla", *, latent=L, shared=MS, seed=0, dtype=jnp.float32, mesh=None,
           **kw):
    """A layer with parameters drawn at scale 0.3 (so no term is negligible), two tied router
    columns and one expert biased out of every selection; ``kw`` are config fields."""
    config = LatentMoEConfig(
        num_experts=E, top_k=K, expert_dim=M, latent_dim=latent, shared_expert_dim=shared,
        routed_scaling=2.5, method=method, **kw,
    )  # fmt: skip
    # every parameter is redrawn below: the initialisation's bits do not matter, and the
    # non-partitionable threefry compiles its eager draws in a fraction of the CPU time
    with jax.threefry_partitionable(False):
        layer = LatentMoE(D, config, gmm_config=CFG, mesh=mesh, param_dtype=dtype,
                          rngs=nnx.Rngs(seed))
    params = nnx.state(layer, nnx.Param)
    rng = np.random.default_rng(seed + 100)  # NumPy draws: no XLA program per shape
    params = jax.tree.map(
        lambda p: jnp.asarray(0.3 * rng.standard_normal(p.shape), p.dtype), params
    )
    nnx.update(layer, params)
    router = layer.router[...]
    layer.router[...] = router.at[:, TIED[1]].set(router[:, TIED[0]])
    layer.router_bias[...] = jnp.zeros((E,), jnp.float32).at[DEAD].set(-1e3)
    return layer


def _tokens(seed=1, shape=(2, 19), dtype=jnp.float32):
    x = np.random.default_rng(seed).standard_normal((*shape, D), dtype=np.float32)
    return jnp.asarray(x.astype(dtype))


# one compiled program per layer (eager, the sorted dispatch compiles each of its ops)
_call = nnx.jit(lambda layer, x: layer(x))


@nnx.jit
def _forward_and_grads(layer, x):
    def loss(layer, x):
        y, _ = layer(x)
        return jnp.sum(jnp.sin(y))

    y, _ = layer(x)
    grads, gx = nnx.grad(loss, argnums=(0, 1))(layer, x)
    return y, gx, nnx.state(grads, nnx.Param)


def _compare(method, dtype_name, **kw):
    dtype = jnp.dtype(dtype_name)
    x = _tokens(dtype=dtype)
    y_ref, gx_ref, g_ref = _forward_and_grads(_layer("reference", dtype=dtype, **kw), x)
    layer = _layer(method, dtype=dtype, **kw)
    _call(layer, x)
    counts = np.asarray(layer.expert_load[...])
    assert counts[DEAD] == 0 and counts.sum() == x.shape[0] * x.shape[1] * K
    assert (x.shape[0] * x.shape[1] * K) % 16 != 0  # pairs not a multiple of the row tile
    y, gx, g = _forward_and_grads(layer, x)
    assert y.dtype == dtype and y.shape == x.shape
    tol = TOL[dtype_name]
    assert _rel(y, y_ref) < tol
    assert _rel(gx, gx_ref) < tol
    for name in g_ref:
        if name == "w1" or name == "w2":  # the dead expert's gradient is exactly zero
            assert np.all(np.asarray(g[name][...])[DEAD] == 0.0)
        assert _rel(g[name][...], g_ref[name][...]) < tol, name


# each method in one dtype by default; the other two pairs are sweeps
@pytest.mark.parametrize(
    "method", ["xla", *(pytest.param(m, marks=pytest.mark.slow) for m in ("pallas", "auto"))]
)
def test_sorted_dispatch_equals_dense_float32(method):
    _compare(method, "float32")


@pytest.mark.parametrize("method", [pytest.param("xla", marks=pytest.mark.slow), "pallas"])
def test_sorted_dispatch_equals_dense_float64(method):
    with jax.enable_x64(True):
        _compare(method, "float64")


@pytest.mark.slow  # a configuration sweep of the comparison above (no latent, no shared expert)
def test_standard_moe_dispatch_equals_dense():
    _compare("xla", "float32", latent=None, shared=None)


def test_ties_are_broken_by_lower_index():
    layer = _layer()
    x = _tokens().reshape(-1, D)
    r = layer.routing(x)
    s = np.asarray(r.scores)
    assert np.array_equal(s[:, TIED[0]], s[:, TIED[1]])
    sel = np.asarray(r.experts)
    both = np.isin(TIED[0], sel, assume_unique=False)
    assert both  # the tie is exercised
    for row in sel:  # whenever the higher index is selected, so is the lower one, before it
        if TIED[1] in row:
            assert TIED[0] in row and list(row).index(TIED[0]) < list(row).index(TIED[1])


def test_latent_equal_to_width_with_identity_projections_is_standard_moe():
    x = _tokens()
    std = _layer(latent=None)
    lat = _layer(latent=D)
    for name in ("router", "w1", "w2", "shared_w1", "shared_w2"):
        getattr(lat, name)[...] = getattr(std, name)[...]
    lat.down[...] = jnp.eye(D)
    lat.up[...] = jnp.eye(D)
    y_std, _ = std(x)
    y_lat, _ = lat(x)
    assert _rel(y_lat, y_std) < 1e-6


def test_router_bias_changes_selection_not_the_selected_weights():
    r = np.random.default_rng(0)
    x = jnp.asarray(r.normal(size=(64, D)), jnp.float32)
    kernel = jnp.asarray(r.normal(size=(D, E)), jnp.float32)
    plain = route(x, kernel, jnp.zeros(E), top_k=K, scaling=5.0)
    bias = jnp.asarray(r.normal(size=E), jnp.float32)
    biased = route(x, kernel, bias, top_k=K, scaling=5.0)
    assert np.array_equal(plain.scores, biased.scores)
    assert np.any(np.asarray(plain.experts) != np.asarray(biased.experts))
    for rt in (plain, biased):  # weights: the unbiased scores of the selected experts
        s = np.take_along_axis(np.asarray(rt.scores), np.asarray(rt.experts), axis=1)
        np.testing.assert_allclose(rt.weights, 5.0 * s / s.sum(1, keepdims=True), rtol=1e-6)
        np.testing.assert_allclose(np.sum(rt.weights, axis=1), 5.0, rtol=1e-6)
    raw = route(x, kernel, bias, top_k=K, normalize=False, scaling=1.0)
    s = np.take_along_axis(np.asarray(raw.scores), np.asarray(raw.experts), axis=1)
    np.testing.assert_array_equal(raw.weights, s)


def test_bias_update_is_a_pure_function_of_loads():
    bias = jnp.asarray([0.0, 0.5, -0.5, 0.0])
    new = router_bias_update(bias, jnp.asarray([10.0, 2.0, 5.0, 3.0]), 0.1)
    np.testing.assert_allclose(new, [-0.1, 0.6, -0.5, 0.1], atol=1e-7)  # mean load 5


def test_update_bias_flag_and_balancing():
    # tokens sharing a common direction, so that a random router favours a few experts
    x = _tokens(shape=(4, 32)) + 1.5 * jax.random.normal(jax.random.key(9), (D,))
    layer = _layer(bias_update_rate=0.05)
    layer.router_bias[...] = jnp.zeros((E,))
    layer.router[...] = 0.3 * jax.random.normal(jax.random.key(3), (D, E))
    y0, m0 = layer(x)
    assert np.all(np.asarray(layer.router_bias[...]) == 0.0)  # no update without the flag
    counts = layer.expert_load[...]
    y1, _ = layer(x, update_bias=True)
    np.testing.assert_array_equal(y0, y1)  # the call uses the bias from before the update
    expected = router_bias_update(jnp.zeros(E), counts, 0.05)
    np.testing.assert_allclose(layer.router_bias[...], expected)
    for key, value in load_metrics(counts).items():
        np.testing.assert_allclose(m0[key], value)
    step = nnx.jit(lambda layer, x: layer(x, update_bias=True)[1])
    for _ in range(40):
        metrics = step(layer, x)
    assert float(m0["moe_load_cv"]) > 0.8
    assert float(metrics["moe_load_cv"]) < 0.5 * float(m0["moe_load_cv"])


def test_bfloat16_compute():
    layer = _layer()
    x = _tokens(dtype=jnp.bfloat16)
    y, _ = layer(x)
    y32, _ = layer(x.astype(jnp.float32))
    assert y.dtype == jnp.bfloat16
    assert _rel(y, y32) < 3e-2


EP_CASES = [
    ("data=2,expert=4", "xla"),
    pytest.param("expert=8", "xla", marks=pytest.mark.slow),
    pytest.param("expert=8", "pallas", marks=pytest.mark.slow),
]


@pytest.mark.parametrize(("spec", "method"), EP_CASES)
def test_expert_parallel_equals_unsharded(spec, method):
    """Forward and gradients in float64, so that only summation order could differ."""
    with jax.enable_x64(True):
        x = _tokens(shape=(4, 6), dtype=jnp.float64)
        y_ref, gx_ref, g_ref = _forward_and_grads(_layer(method, dtype=jnp.float64), x)
        mesh = sharding.make_mesh(spec)
        with jax.set_mesh(mesh):
            layer = _layer(method, dtype=jnp.float64)
            y, gx, g = _forward_and_grads(layer, x)
        assert _rel(y, y_ref) < 1e-12
        assert _rel(gx, gx_ref) < 1e-12
        for name in g_ref:
            assert _rel(g[name][...], g_ref[name][...]) < 1e-12, name


@pytest.mark.slow
def test_expert_parallel_with_mesh_argument():
    x = _tokens(shape=(4, 6))
    y_ref, _ = _layer()(x)
    layer = _layer(mesh=sharding.make_mesh("data=4,expert=2"))
    y, _ = nnx.jit(lambda layer, x: layer(x))(layer, x)
    assert _rel(y, y_ref) < 1e-5


def test_bad_arguments():
    kw = dict(num_experts=E, top_k=K, expert_dim=M)

    def make(*, mesh=None, **fields):
        return LatentMoE(D, LatentMoEConfig(**{**kw, **fields}), mesh=mesh, rngs=nnx.Rngs(0))

    with pytest.raises(ValueError, match="top_k"):
        make(top_k=E + 1)
    with pytest.raises(ValueError, match="latent_dim"):
        make(latent_dim=D + 1)
    for method in ("megablox", "ragged", "dense"):
        with pytest.raises(ValueError, match="LatentMoEConfig.method must be one of"):
            make(method=method)
    assert LatentMoEConfig().method == "xla"
    with pytest.raises(ValueError, match="expert_dim"):
        make(expert_dim=0)
    with pytest.raises(TypeError, match="config must be a LatentMoEConfig"):
        LatentMoE(D, {"num_experts": E}, rngs=nnx.Rngs(0))
    bad_mesh = sharding.make_mesh("data=2,expert=3", jax.devices()[:6])
    with pytest.raises(ValueError, match="does not divide num_experts"):
        make(mesh=bad_mesh)
    layer = make()
    with pytest.raises(ValueError, match="does not divide num_experts"), jax.set_mesh(bad_mesh):
        layer(_tokens(shape=(6, 1)))
    with pytest.raises(ValueError, match="x must have shape"):
        layer(jnp.ones((3, D + 1)))
    with (
        pytest.raises(ValueError, match="method 'reference' has no expert-parallel form"),
        jax.set_mesh(sharding.make_mesh("data=2,expert=4")),
    ):
        make(method="reference")(_tokens(shape=(8, 1)))
    with (
        pytest.raises(ValueError, match="tokens cannot be split"),
        jax.set_mesh(sharding.make_mesh("expert=8")),
    ):
        layer(_tokens(shape=(3, 1)))


def test_expert_parallel_inside_a_data_parallel_shard_map():
    """Inside a ``shard_map`` already manual over ``expert`` (tokens local, weights replicated),
    each device keeps its experts and exchanges tokens directly; equal to the unsharded layer."""
    x = _tokens(shape=(8, 6))
    layer = _layer()
    y_ref, _ = _call(layer, x)
    mesh = sharding.make_mesh("data=2,expert=4")
    graphdef, state = nnx.split(layer)
    tok = jax.P(("data", "fsdp", "expert"))

    def body(state, x):
        return nnx.merge(graphdef, state)(x)[0]

    fn = jax.shard_map(body, mesh=mesh, in_specs=(jax.P(), tok), out_specs=tok, check_vma=False)
    assert _rel(jax.jit(fn)(state, x), y_ref) < 1e-5
