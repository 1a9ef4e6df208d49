"""POET-X: the poet_x chain with merge-then-reinitialize against the algorithm written out, its
pieces, the recipe, and the training CLI with ``--optimizer poet_x``."""

from __future__ import annotations

import json
import warnings
from functools import partial

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
    _common,
    bound_rotations,
    clip_by_global_norm_merge_warmup,
    make_optimizer,
    merge_clip_threshold,
    merge_poet_layer,
    merge_then_reinitialize,
    poet_labels,
    poet_layers,
    poet_x,
    prepare_model,
    recipe_defaults,
    scale_by_poet,
)
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


def _label_state(state, label):
    """The HF-Adam state (count, mu, nu) of one label of :func:`poet_x`'s partition."""
    return state[0].inner_states[label].inner_state[0]


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
    rot_m, rot_p = _label_state(s_m, "rotation"), _label_state(s_p, "rotation")
    for name in ("theta_in", "theta_out"):
        np.testing.assert_array_equal(poet_m[name][...], 0.0)
        np.testing.assert_array_equal(rot_m.mu["poet"][name][...], 0.0)
        np.testing.assert_array_equal(rot_m.nu["poet"][name][...], 0.0)
    assert int(rot_m.count) == 0 and int(rot_p.count) == 3
    assert int(s_m[-1].count) == int(s_p[-1].count) == 3
    for label in ("dense", "dense_decay"):
        jax.tree.map(np.testing.assert_array_equal, _label_state(s_m, label),
                     _label_state(s_p, label))
    for path in (("poet", "bias"), ("scale",), ("head",)):
        a, b = p_m, p_p
        for key in path:
            a, b = a[key], b[key]
        np.testing.assert_array_equal(a[...], b[...])
    # new permutations: exact integers, a permutation each
    perm = np.asarray(poet_m["perm_in"][...])
    np.testing.assert_array_equal(np.sort(perm), np.arange(24))
    assert not np.array_equal(perm, np.asarray(poet_p["perm_in"][...]))
    # the frozen leaves hold no optimizer state
    state_paths = [jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_leaves_with_path(s_m)]
    assert not [p for p in state_paths if "poet_base" in p or "perm_" in p]
    # the merge step compiled once with the others
    p_m, s_m = step(p_m, s_m)
    assert step._cache_size() == 1
    assert float(jnp.abs(p_m["poet"]["theta_in"][...]).max()) > 0


def test_poet_x_is_the_chain_of_its_public_pieces():
    """``poet_x`` = its module docstring's chain, written out by hand from the public pieces
    (optax's own learning-rate scaling, a merge at steps 3 and 6): the same parameters."""
    params, loss, _ = _split()
    lr, wd, every = 3e-2, 0.1, 3

    def dense(*decay):
        return optax.chain(_common.scale_by_hf_adam(0.9, 0.999, 1e-6),
                           optax.scale_by_learning_rate(lr), *decay)

    hand = optax.chain(
        optax.partition({
            "rotation": optax.chain(scale_by_poet(merge_every=every),
                                    optax.scale_by_learning_rate(lr * 0.5)),
            "frozen": optax.set_to_zero(),
            "dense": dense(),
            "dense_decay": dense(_common.hf_decoupled_weight_decay(lr, wd)),
        }, poet_labels),
        _common.cast_to_params_dtype(),
        bound_rotations(1e-2),
        merge_then_reinitialize(every, jax.random.key(0)),
    )
    got = _steps(poet_x(lr, merge_every=every, weight_decay=wd), params, loss, 7)[0]
    want = _steps(hand, params, loss, 7)[0]
    jax.tree.map(np.testing.assert_array_equal, got, want)


def test_poet_x_trains_the_layer():
    params, loss, _ = _split()
    trained, _, _ = _steps(poet_x(1e-2, merge_every=10), params, loss, 40)
    assert float(loss(trained)) < 0.5 * float(loss(params))


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


def _plain_poet_x(params, grad, steps, *, lr, base_lr, scale, b1, b2, eps, wd, merge_every, key,
                  block):
    """POET-X written out as one loop over NumPy float64 arrays: HF AdamW on every trained leaf
    (the rotations on their own counter), HF decay of the dense matrices, and every
    ``merge_every`` steps the dense merge ``W0 <- R_in W0 R_out``, fresh permutations from
    ``fold_in(fold_in(key, t), layer)`` and the rotations and their moments back to zero."""
    from jaxlib_ext.pallas_kernels.poet.reference import effective_weight

    p = jax.tree.map(np.asarray, params)
    layers = sorted(k for k, v in p.items() if isinstance(v, dict))
    trained = [(k, n) for k in layers for n in ("theta_in", "theta_out")] + \
        [(k, None) for k in p if k not in layers]

    def get(tree, k, n):
        return tree[k] if n is None else tree[k][n]

    def put(tree, k, n, value):
        if n is None:
            tree[k] = value
        else:
            tree[k][n] = value

    m = {kn: np.zeros_like(get(p, *kn)) for kn in trained}
    v = {kn: np.zeros_like(get(p, *kn)) for kn in trained}
    t = t_rot = 0
    history = []
    for _ in range(steps):
        g = jax.tree.map(np.asarray, grad(p))
        t, t_rot = t + 1, t_rot + 1
        for kn in trained:
            rotation = kn[1] is not None
            tt = t_rot if rotation else t
            gi = get(g, *kn)
            m[kn] = b1 * m[kn] + (1 - b1) * gi
            v[kn] = b2 * v[kn] + (1 - b2) * gi * gi
            u = np.sqrt(1 - b2**tt) / (1 - b1**tt) * m[kn] / (np.sqrt(v[kn]) + eps)
            if rotation:
                put(p, *kn, get(p, *kn) - lr(t - 1) * scale * u)
            else:
                new = get(p, *kn) - base_lr(t - 1) * u
                put(p, *kn, new * (1 - base_lr(t - 1) * wd) if new.ndim >= 2 else new)
        if t % merge_every == 0:
            step_key = jax.random.fold_in(key, t)
            for j, k in enumerate(layers):
                layer = p[k]
                perms = [layer[n].astype(np.int32) for n in ("perm_in", "perm_out")]
                layer["poet_base"] = np.asarray(effective_weight(
                    layer["poet_base"], layer["theta_in"], layer["theta_out"], *perms, block))
                k_in, k_out = jax.random.split(jax.random.fold_in(step_key, j))
                for name, kk in (("perm_in", k_in), ("perm_out", k_out)):
                    size = layer[name].shape[0]
                    layer[name] = np.asarray(jax.random.permutation(kk, size), np.float64)
                for name in ("theta_in", "theta_out"):
                    layer[name] = np.zeros_like(layer[name])
                    m[(k, name)], v[(k, name)] = (np.zeros_like(layer[name]) for _ in range(2))
            t_rot = 0
        history.append(jax.tree.map(np.copy, p))
    return history, m, v


def test_poet_x_equals_the_algorithm_written_as_one_loop():
    """30 steps with merges at 12 and 24 over two POET layers and dense leaves (schedules,
    ``poet_lr_scale``, decay), float64: every step's parameters and the final moments agree with
    :func:`_plain_poet_x`, which shares no code with the chain but the key derivation."""
    block, steps, every = 4, 30, 12
    lr = lambda c: 2e-2 / (1.0 + 0.05 * c)  # noqa: E731
    base_lr = lambda c: 0.7 * lr(c)  # noqa: E731
    kw = dict(b1=0.8, b2=0.95, eps=1e-7)
    with jax.enable_x64(True):
        rng = np.random.default_rng(0)

        def layer(n, m):
            p = block * (block - 1) // 2
            w = rng.normal(size=(n, m))
            return {"poet_base": jnp.asarray(w / np.linalg.norm(w, axis=0)),
                    "theta_in": jnp.zeros((n // block, p)), "theta_out": jnp.zeros((m // block, p)),
                    "perm_in": jnp.asarray(rng.permutation(n), jnp.float64),
                    "perm_out": jnp.asarray(rng.permutation(m), jnp.float64)}

        params = {"a": layer(12, 8), "b": layer(8, 8), "vec": jnp.ones(8),
                  "mat": jnp.asarray(0.3 * rng.normal(size=(8, 3)))}
        x, y = jnp.asarray(rng.normal(size=(5, 12))), jnp.asarray(rng.normal(size=(5, 3)))

        def apply(q, h, name):
            lay = q[name]
            return poet_linear(h, jax.lax.stop_gradient(lay["poet_base"]), lay["theta_in"],
                               lay["theta_out"], lay["perm_in"].astype(jnp.int32),
                               lay["perm_out"].astype(jnp.int32), block_size=block,
                               method="reference")

        def loss(q):
            h = jnp.tanh(apply(q, x, "a"))
            return jnp.mean(((apply(q, h, "b") * q["vec"]) @ q["mat"] - y) ** 2)

        grad = jax.jit(jax.grad(loss))
        key = jax.random.key(7)
        want, m, v = _plain_poet_x(params, grad, steps, lr=lr, base_lr=base_lr, scale=0.3,
                                   wd=0.1, merge_every=every, key=key, block=block, **kw)
        tx = poet_x(lr, merge_every=every, poet_lr_scale=0.3, weight_decay=0.1,
                    base_learning_rate=base_lr, key=key, **kw)

        @jax.jit
        def step(p, s):
            u, s = tx.update(grad(p), s, p)
            return optax.apply_updates(p, u), s

        p, s = params, tx.init(params)
        for t in range(steps):
            p, s = step(p, s)
            close = partial(np.testing.assert_allclose, rtol=1e-9, atol=1e-12,
                            err_msg=f"step {t + 1}")
            jax.tree.map(close, p, want[t])
        rotation, dense = _label_state(s, "rotation"), _label_state(s, "dense")
        assert int(rotation.count) == steps - 2 * every and int(dense.count) == steps
        for (k, n), mk in m.items():
            state = rotation if n is not None else (
                _label_state(s, "dense_decay") if mk.ndim >= 2 else dense)
            for got, ref in ((state.mu, mk), (state.nu, v[(k, n)])):
                np.testing.assert_allclose(got[k] if n is None else got[k][n], ref, rtol=1e-9,
                                           atol=1e-15)


def test_key_forms_agree_and_bad_keys_are_named():
    """An int seed, its ``jax.random.key`` and its raw ``uint32[2]`` key draw the same merges."""
    params, loss, _ = _split()
    ends = [_steps(poet_x(3e-2, merge_every=2, key=k), params, loss, 2)[0]
            for k in (5, jax.random.key(5), jax.random.PRNGKey(5))]
    for other in ends[1:]:
        jax.tree.map(np.testing.assert_array_equal, ends[0], other)
    for bad in (0.5, "0", jnp.zeros(3), jax.random.split(jax.random.key(0), 2)):
        with pytest.raises(ValueError, match="key"):
            poet_x(1e-2, key=bad)


def test_scale_by_poet_restarts_its_moments_every_merge():
    """Between restarts it is HF Adam; after each ``merge_every``-th update its state is zero,
    so the update after a restart equals the first update of a fresh one."""
    tx = scale_by_poet(merge_every=3)
    grads = [{"w": jnp.asarray([[0.5, -2.0], [1.0, 3.0]]) * (1.0 + 0.3 * t)} for t in range(8)]
    s = tx.init(grads[0])
    for t, g in enumerate(grads, start=1):
        u, s = tx.update(g, s)
        assert int(s.count) == t % 3
        if t % 3 == 0:
            np.testing.assert_array_equal(s.mu["w"], 0.0)
            np.testing.assert_array_equal(s.nu["w"], 0.0)
        if t % 3 == 1:  # the first step of a fresh HF Adam: g / (|g| + eps / sqrt(1 - b2))
            fresh, _ = tx.update(g, tx.init(g))
            np.testing.assert_array_equal(u["w"], fresh["w"])
            want = g["w"] / (jnp.abs(g["w"]) + 1e-6 / np.sqrt(1 - 0.999))
            np.testing.assert_allclose(u["w"], want, rtol=1e-5)
    with pytest.raises(ValueError, match="merge_every"):
        scale_by_poet(merge_every=0)
    with pytest.raises(ValueError, match="b2"):
        scale_by_poet(b2=1.0)
