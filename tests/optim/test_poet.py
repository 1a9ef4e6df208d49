"""POET-X: the NNX layer, poetize, the poet_x transform with merge-then-reinitialize, and the
training CLI with ``--optimizer poet_x``."""

from __future__ import annotations

import json
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from jaxlib_ext import cli
from jaxlib_ext.models.transformer import build_transformer
from jaxlib_ext.optim import (
    ClipMergeWarmupState,
    PoetLinear,
    clip_by_global_norm_merge_warmup,
    make_optimizer,
    merge_clip_threshold,
    merge_poet_layer,
    poet_labels,
    poet_layers,
    poet_x,
    poetize,
    poetize_report,
    prepare_model,
    recipe_defaults,
)
from jaxlib_ext.optim._poet_layer import PoetBase, PoetPermutation, PoetRotation
from jaxlib_ext.pallas_kernels.poet import poet_linear


class TwoLayer(nnx.Module):
    """A POET layer between a dense vector and a dense head (what poet_x must route apart)."""

    def __init__(self, rngs, dtype=jnp.float32):
        self.poet = PoetLinear(24, 16, block_size=8, rngs=rngs, use_bias=True, param_dtype=dtype)
        self.scale = nnx.Param(jnp.ones((16,), dtype))
        self.head = nnx.Param(0.1 * jax.random.normal(rngs.params(), (16, 5), dtype))

    def __call__(self, x):
        return (jnp.tanh(self.poet(x)) * self.scale[...]) @ self.head[...]


def _split(dtype=jnp.float32):
    model = TwoLayer(nnx.Rngs(0), dtype)
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    x = jax.random.normal(jax.random.key(1), (6, 24), dtype)
    y = jax.random.normal(jax.random.key(2), (6, 5), dtype)

    def loss(p):
        return jnp.mean((nnx.merge(graphdef, p, rest)(x) - y) ** 2)

    def out(p):
        return nnx.merge(graphdef, p, rest)(x)

    return params, loss, out


def _steps(tx, params, loss, n):
    @jax.jit
    def step(p, s):
        g = jax.grad(loss)(p)
        u, s = tx.update(g, s, p)
        return optax.apply_updates(p, u), s

    state = tx.init(params)
    for _ in range(n):
        params, state = step(params, state)
    return params, state, step


def test_layer_parameter_count_and_init():
    layer = PoetLinear(24, 40, block_size=8, rngs=nnx.Rngs(0))
    rot = nnx.state(layer, PoetRotation)
    assert sum(x.size for x in jax.tree.leaves(rot)) == (24 + 40) * (8 - 1) // 2
    assert layer.num_trainable == (24 + 40) * 7 // 2
    w = layer.poet_base[...]
    np.testing.assert_allclose(jnp.linalg.norm(w, axis=0), 1.0, rtol=1e-6)  # unit-norm neurons
    x = jax.random.normal(jax.random.key(0), (3, 24))
    np.testing.assert_array_equal(layer(x), jnp.matmul(x, w, precision="highest"))
    perms = [np.asarray(layer.perm_in[...]), np.asarray(layer.perm_out[...])]
    for p, size in zip(perms, (24, 40), strict=True):
        np.testing.assert_array_equal(np.sort(p), np.arange(size))


def test_layer_gradients_reach_only_theta_and_bias():
    params, loss, _ = _split()
    grads = jax.grad(loss)(params)["poet"]
    np.testing.assert_array_equal(grads["poet_base"][...], 0.0)
    np.testing.assert_array_equal(grads["perm_in"][...], 0.0)
    assert float(jnp.abs(grads["theta_in"][...]).max()) > 0
    assert float(jnp.abs(grads["bias"][...]).max()) > 0


def test_labels_route_poet_leaves():
    params, _, _ = _split()
    labels = poet_labels(params)
    assert labels["poet"]["theta_in"] == "rotation" and labels["poet"]["theta_out"] == "rotation"
    assert labels["poet"]["poet_base"] == "frozen" and labels["poet"]["perm_out"] == "frozen"
    assert labels["poet"]["bias"] == "dense" and labels["head"] == "dense_decay"


def test_merge_of_one_layer_keeps_the_function_float64():
    with jax.enable_x64(True):
        r = np.random.default_rng(0)
        n, m, b = 16, 24, 8
        p = b * (b - 1) // 2
        w = jnp.asarray(r.normal(size=(n, m)))
        ti, to = jnp.asarray(0.2 * r.normal(size=(2, p))), jnp.asarray(0.2 * r.normal(size=(3, p)))
        pi, po = jnp.asarray(r.permutation(n)), jnp.asarray(r.permutation(m))
        x = jnp.asarray(r.normal(size=(5, n)))
        before = poet_linear(x, w, ti, to, pi, po, block_size=b, method="reference")
        merged, new_in, new_out = merge_poet_layer(w, ti, to, pi, po, jax.random.key(3))
        after = poet_linear(x, merged, 0 * ti, 0 * to, new_in, new_out, block_size=b)
        np.testing.assert_allclose(after, before, rtol=1e-12, atol=1e-12)
        assert not np.array_equal(new_in, pi)


def test_merge_then_reinitialize_inside_jit():
    """At the merge step: the output equals the unmerged layer's, theta is zero, the rotation
    moments and counter are reset, every other leaf's state equals a run without merges."""
    params, loss, out = _split()
    merging, plain = poet_x(3e-2, merge_every=3), poet_x(3e-2, merge_every=10**6)
    p_m, s_m, step = _steps(merging, params, loss, 3)
    p_p, s_p, _ = _steps(plain, params, loss, 3)
    np.testing.assert_allclose(out(p_m), out(p_p), rtol=2e-5, atol=2e-6)
    poet_m, poet_p = p_m["poet"], p_p["poet"]
    assert float(jnp.abs(poet_p["theta_in"][...]).max()) > 0
    for name in ("theta_in", "theta_out"):
        np.testing.assert_array_equal(poet_m[name][...], 0.0)
        np.testing.assert_array_equal(s_m.mu["poet"][name][...], 0.0)
        np.testing.assert_array_equal(s_m.nu["poet"][name][...], 0.0)
    assert int(s_m.rotation_count) == 0 and int(s_p.rotation_count) == 3
    assert int(s_m.count) == int(s_p.count) == 3
    for path in (("poet", "bias"), ("scale",), ("head",)):
        for a, b in ((s_m.mu, s_p.mu), (s_m.nu, s_p.nu), (p_m, p_p)):
            for key in path:
                a, b = a[key], b[key]
            np.testing.assert_array_equal(a[...], b[...])
    # new permutations: exact integers, a permutation each
    perm = np.asarray(poet_m["perm_in"][...])
    np.testing.assert_array_equal(np.sort(perm), np.arange(24))
    assert not np.array_equal(perm, np.asarray(poet_p["perm_in"][...]))
    # the frozen leaves hold no optimizer state
    assert s_m.mu["poet"]["poet_base"][...].shape == (0,)
    # the merge step compiled once with the others
    p_m, s_m = step(p_m, s_m)
    assert step._cache_size() == 1
    assert float(jnp.abs(p_m["poet"]["theta_in"][...]).max()) > 0


def test_poet_x_trains_the_layer():
    params, loss, _ = _split()
    trained, _, _ = _steps(poet_x(1e-2, merge_every=10), params, loss, 40)
    assert float(loss(trained)) < 0.5 * float(loss(params))


def test_poetize_converts_divisible_layers_and_reports_the_rest():
    model = build_transformer("tiny", rngs=nnx.Rngs(0))
    kernel = model.blocks[0].mlp.up.kernel[...]
    report = poetize_report(model, 32)
    assert len(report.converted) == 10 and report.skipped == ()
    report = poetize_report(model, 128, exclude=("lm_head", "qkv"))
    assert ("blocks.0.attn.qkv", "excluded") in report.skipped
    assert any("352" in why for _, why in report.skipped)  # the SwiGLU width, 11 * 32
    with pytest.warns(UserWarning, match="left dense"):
        poetize(model, 128)
    assert {p for p, _ in poet_layers(model)} == {f"blocks.{i}.attn.{n}" for i in (0, 1)
                                                  for n in ("qkv", "out")}
    poetize(model, 32)  # the rest
    layer = model.blocks[0].mlp.up
    assert isinstance(layer, PoetLinear) and isinstance(layer.poet_base, PoetBase)
    assert isinstance(layer.perm_in, PoetPermutation)
    assert layer.poet_base.get_metadata()["logical_axes"] == ("embed", "mlp")
    x = jax.random.normal(jax.random.key(0), (2, 3, 128))
    unit = kernel / jnp.linalg.norm(kernel, axis=0)
    np.testing.assert_allclose(layer(x), jnp.matmul(x, unit, precision="highest"), rtol=1e-5,
                               atol=1e-6)
    with pytest.raises(ValueError, match="block_size"):
        poetize(model, 1)


def test_recipe_prepares_the_model_and_builds_the_optimizer():
    assert recipe_defaults("poet_x")["block_size"] == 256
    model = build_transformer("tiny", rngs=nnx.Rngs(0))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        model = prepare_model("poet_x", model, block_size=32, merge_every=4)
    assert len(poet_layers(model)) == 10
    tx = make_optimizer("poet_x", 1e-3, total_steps=10, block_size=32, merge_every=4)
    params = nnx.state(model, nnx.Param)
    assert jax.tree.structure(tx.init(params)) is not None
    with pytest.raises(ValueError, match="block_size must be an int >= 2"):
        PoetLinear(8, 8, block_size=1, rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match="must divide"):
        PoetLinear(8, 12, block_size=8, rngs=nnx.Rngs(0))


def test_cli_trains_the_tiny_transformer_with_poet_x(tmp_path):
    # one layer: the CLI path (poetize, the merges, eval, checkpoint) at half the compile time
    code = cli.main([
        "train", "--model", "transformer", "--arch", "n_layers=1", "--optimizer", "poet_x",
        "--opt", "block_size=32",
        "--opt", "merge_every=2", "--steps", "4", "--batch-size", "8", "--seq-len", "16",
        "--eval-every", "4", "--eval-batches", "1", "--checkpoint-every", "4",
        "--out-dir", str(tmp_path), "--no-progress", "--mesh", "data=-1",
    ])
    assert code == 0
    rows = [json.loads(s) for s in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert rows and all(np.isfinite(r.get("loss", r.get("eval_loss", 0.0))) for r in rows)
    assert any("eval_loss" in r for r in rows)


def test_cayley_neumann_drift_is_rho_to_the_fourth_and_rotation_radius_bounds_rho():
    """A truncated block's singular values are ``|1 - lambda^4|``; ``rotation_radius`` is an
    upper bound on ``rho = max lambda`` within 1.1%."""
    from jaxlib_ext.optim.poet import rotation_radius
    from jaxlib_ext.pallas_kernels.poet.reference import cayley_neumann, skew

    b = 8
    theta = 0.15 * jax.random.normal(jax.random.key(0), (4, b * (b - 1) // 2))
    rho = np.max(np.abs(np.linalg.eigvals(np.asarray(skew(theta, b), np.float64))), axis=-1)
    sv = np.linalg.svd(np.asarray(cayley_neumann(theta, b), np.float64), compute_uv=False)
    np.testing.assert_allclose(np.max(np.abs(sv - 1), axis=-1), rho**4, rtol=1e-4, atol=1e-6)
    bound = np.asarray(rotation_radius(theta, b))
    assert np.all(bound >= rho * (1 - 1e-6)) and np.all(bound <= 1.011 * rho)


def _orthogonality_error(params):
    from jaxlib_ext.pallas_kernels.poet.reference import cayley_neumann

    g = cayley_neumann(params["poet"]["theta_in"][...], 8)
    return float(np.max(np.abs(np.linalg.svd(np.asarray(g), compute_uv=False) - 1)))


def test_rotations_past_the_orthogonality_bound_warn_or_are_clipped():
    """Long merge intervals at a large learning rate: silent while the drift is within the
    bound, then ``"warn"`` names the layers; ``"clip"`` keeps every block within it."""
    params, loss, _ = _split()
    kw = dict(merge_every=200, orthogonality_bound=1e-3)
    p, s, step = _steps(poet_x(3e-2, **kw), params, loss, 0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        p, s = step(p, s)  # one step: rho^4 ~ 1e-5
        jax.effects_barrier()
    assert _orthogonality_error(p) < 1e-3
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(11):
            p, s = step(p, s)
        jax.effects_barrier()
    messages = {str(w.message).split(" passed")[0] for w in caught}
    assert messages == {"poet_x: the rotations of poet/theta_in",
                        "poet_x: the rotations of poet/theta_out"}
    assert "orthogonality_bound=0.001" in str(caught[0].message)
    assert _orthogonality_error(p) > 1e-3
    clipped, _, _ = _steps(poet_x(3e-2, on_orthogonality="clip", **kw), params, loss, 12)
    assert _orthogonality_error(clipped) <= 1e-3 * (1 + 1e-3)
    assert float(loss(clipped)) < float(loss(params))


@pytest.mark.parametrize("kwargs, match", [
    (dict(orthogonality_bound=0.0), "orthogonality_bound"),
    (dict(orthogonality_bound=1.5), "orthogonality_bound"),
    (dict(on_orthogonality="raise"), "on_orthogonality"),
])
def test_bad_orthogonality_arguments_are_named(kwargs, match):
    with pytest.raises(ValueError, match=match):
        poet_x(1e-2, **kwargs)


def _ramp(t, c=2.0, every=20, f=0.1, w=10, until=2000):
    """The authors' calc_poet_grad_clipping_value at completed-step count t, by hand."""
    k = t % every
    if t < every or t > until or k >= w:
        return c
    return c * (f + (1 - f) * k / w)


def _clipped_norms(tx, steps, scale=100.0):
    """Norms of tx's outputs under jit for gradients of norm ``scale`` (always clipped)."""
    g = {"a": jnp.full((3, 4), scale / np.sqrt(24.0)), "b": {"c": jnp.full((12,), scale
                                                                           / np.sqrt(24.0))}}

    @jax.jit
    def run(state):
        def body(s, _):
            u, s = tx.update(g, s)
            return s, optax.tree.norm(u)
        return jax.lax.scan(body, state, None, length=steps)

    state, norms = run(tx.init(g))
    return np.asarray(norms), int(state.count)


def test_clip_warmup_ramps_after_each_merge_inside_jit():
    tx = clip_by_global_norm_merge_warmup(2.0, merge_every=20)
    norms, count = _clipped_norms(tx, 50)  # two merges, at counts 20 and 40
    assert count == 50 and isinstance(tx.init({"a": jnp.ones(2)}), ClipMergeWarmupState)
    want = np.array([_ramp(t) for t in range(50)])
    np.testing.assert_allclose(norms, want, rtol=1e-5)
    # by hand: 0.1c on the first update after a merge, +0.09c a step, c from the 10th on
    np.testing.assert_allclose(norms[[19, 20, 21, 29, 30, 40, 45]],
                               [2.0, 0.2, 0.38, 1.82, 2.0, 0.2, 1.1], rtol=1e-5)
    thresholds = jax.jit(lambda t: merge_clip_threshold(t, 2.0, merge_every=20))(
        jnp.arange(50))
    np.testing.assert_allclose(np.asarray(thresholds), want, rtol=1e-6)
    # the authors' gd_warmup_steps: no warm-up after step `until`
    late, _ = _clipped_norms(clip_by_global_norm_merge_warmup(2.0, merge_every=20, until=30), 50)
    np.testing.assert_allclose(late, [_ramp(t, until=30) for t in range(50)], rtol=1e-5)
    assert late[40] == pytest.approx(2.0) and late[20] == pytest.approx(0.2)
    # gradients under the threshold pass unchanged
    small, _ = _clipped_norms(tx, 25, scale=0.1)
    np.testing.assert_allclose(small, 0.1, rtol=1e-5)


def test_clip_warmup_off_is_the_constant_clip():
    g = {"w": jnp.arange(6.0).reshape(2, 3), "v": -jnp.ones(4)}
    ref = optax.clip_by_global_norm(1.0)
    tx = clip_by_global_norm_merge_warmup(1.0, merge_every=5, warmup_steps=0)
    s, rs = tx.init(g), ref.init(g)
    for _ in range(12):
        u, s = tx.update(g, s)
        r, rs = ref.update(g, rs)
        jax.tree.map(np.testing.assert_array_equal, u, r)
    # the recipe: warm-up on by default, constant optax clip with clip_warmup=False
    assert recipe_defaults("poet_x")["clip_warmup"] is True
    on = make_optimizer("poet_x", 1e-3, total_steps=30, merge_every=5)
    off = make_optimizer("poet_x", 1e-3, total_steps=30, merge_every=5, clip_warmup=False)
    assert isinstance(on.init(g)[0], ClipMergeWarmupState)
    assert not isinstance(off.init(g)[0], ClipMergeWarmupState)
    assert not isinstance(make_optimizer("adamw", 1e-3, total_steps=30).init(g)[0],
                          ClipMergeWarmupState)


@pytest.mark.parametrize("kwargs, match", [
    (dict(start_fraction=0.0), "start_fraction"),
    (dict(start_fraction=1.5), "start_fraction"),
    (dict(warmup_steps=-1), "warmup_steps"),
    (dict(merge_every=0), "merge_every"),
    (dict(until=-1), "until"),
    (dict(max_norm=0.0), "max_norm"),
])
def test_bad_clip_warmup_arguments_are_named(kwargs, match):
    args = {"max_norm": 1.0, "merge_every": 10, **kwargs}
    with pytest.raises(ValueError, match=match):
        clip_by_global_norm_merge_warmup(**args)
    with pytest.raises(ValueError, match=match):
        merge_clip_threshold(0, **args)


def test_recipe_names_its_clip_warmup_keys_in_errors():
    with pytest.raises(ValueError, match="clip_warmup_start"):
        make_optimizer("poet_x", 1e-3, total_steps=10, clip_warmup_start=0.0)
    with pytest.raises(ValueError, match="clip_warmup_steps"):
        make_optimizer("poet_x", 1e-3, total_steps=10, clip_warmup_steps=-1)
