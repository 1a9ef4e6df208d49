"""FOAM (arXiv 2512.07112): reductions to Adam, fold algebra, first step, composition, sharding."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from jaxlib_ext.optim import ScaleByFoamState, foam, scale_by_foam
from jaxlib_ext.optim.foam import fold, folded_shape, unfold


def rel(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-300))


def hf_adamw_reference(params, grads_seq, lr, b1, b2, eps, wd):
    """NumPy HF AdamW: eps on sqrt(v), step size lr*sqrt(1-b2^t)/(1-b1^t), post-update decay."""
    p = {k: np.array(v, np.float64) for k, v in params.items()}
    m = {k: np.zeros_like(v) for k, v in p.items()}
    v = {k: np.zeros_like(x) for k, x in p.items()}
    for t, g in enumerate(grads_seq, start=1):
        for k in p:
            m[k] = b1 * m[k] + (1 - b1) * g[k]
            v[k] = b2 * v[k] + (1 - b2) * g[k] ** 2
            step = lr * np.sqrt(1 - b2**t) / (1 - b1**t)
            p[k] = p[k] - step * m[k] / (np.sqrt(v[k]) + eps)
            if wd > 0:
                p[k] = p[k] - lr * wd * p[k]
    return p


def run(opt, params, grads_seq, jit=True):
    state = opt.init(params)

    def step(p, s, g):
        u, s = opt.update(g, s, p)
        return optax.apply_updates(p, u), s

    step = jax.jit(step) if jit else step
    for g in grads_seq:
        params, state = step(params, state, g)
    return params, state


def make_problem(rng, shapes, steps, dtype=np.float64):
    params = {k: rng.standard_normal(s).astype(dtype) for k, s in shapes.items()}
    grads = [
        {k: rng.standard_normal(s).astype(dtype) for k, s in shapes.items()} for _ in range(steps)
    ]
    return params, grads


SHAPES = {"w": (12, 5), "u": (7, 3, 6), "b": (5,)}


@pytest.mark.parametrize("wd", [0.0, 0.1])
def test_level0_equals_hf_adamw_float64(wd):
    with jax.enable_x64(True):
        rng = np.random.default_rng(0)
        params, grads = make_problem(rng, SHAPES, 6)
        ref = hf_adamw_reference(params, grads, 1e-2, 0.9, 0.95, 1e-3, wd)
        got, state = run(foam(1e-2, 0.9, 0.95, 1e-3, wd, level=0), params, grads)
        for k in ref:
            assert got[k].dtype == jnp.float64
            assert rel(got[k], ref[k]) < 1e-14, k


def test_level0_eps0_equals_optax_adam_float64():
    with jax.enable_x64(True):
        rng = np.random.default_rng(1)
        params, grads = make_problem(rng, SHAPES, 5)
        got, _ = run(foam(3e-3, eps=0.0, level=0), params, grads)
        ref, _ = run(optax.adam(3e-3, eps=0.0), params, grads)
        ref_w, _ = run(optax.adamw(3e-3, eps=0.0, weight_decay=0.0), params, grads)
        for k in ref:
            assert rel(got[k], ref[k]) < 1e-13, k
            assert rel(got[k], ref_w[k]) < 1e-13, k


@pytest.mark.parametrize("level", [1, 2, 3])
@pytest.mark.parametrize("second_moment", ["mean_of_squares", "square_of_mean"])
def test_block_constant_gradients_equal_adam(level, second_moment):
    with jax.enable_x64(True):
        rng = np.random.default_rng(level)
        b = 2**level
        n_blocks, cols = 3, 5
        params = {"w": rng.standard_normal((n_blocks * b, cols))}
        grads = [
            {"w": np.repeat(rng.standard_normal((n_blocks, cols)), b, axis=0)} for _ in range(5)
        ]
        kw = dict(b1=0.9, b2=0.99, eps=1e-6, second_moment=second_moment)
        got, st = run(foam(1e-2, level=level, **kw), params, grads)
        ref, st0 = run(foam(1e-2, level=0, **kw), params, grads)
        assert rel(got["w"], ref["w"]) < 1e-13
        # folded state = Adam's state subsampled at one entry per block
        assert st[0].mu["w"].shape == (n_blocks, cols)
        assert rel(st[0].mu["w"], st0[0].mu["w"][::b]) < 1e-13
        assert rel(st[0].nu["w"], st0[0].nu["w"][::b]) < 1e-13


def test_hand_computed_first_step():
    with jax.enable_x64(True):
        lr, scale, alpha, eps = 1e-2, 0.25, 0.7, 1e-8
        g = np.array([[0.3], [-1.2], [0.5], [2.0]])  # fold axis -2 has 4 entries: one block
        p = np.zeros_like(g)
        opt = foam(lr, level=2, scale=scale, res_scale=alpha, eps=eps)
        u, _ = opt.update({"w": g}, opt.init({"w": p}), {"w": p})
        gbar = g.mean()
        r = g - gbar
        expected = -lr * scale * (gbar + 10 * alpha * r) / (
            np.sqrt(np.mean(g**2) + 1000 * alpha**2 * r**2) + eps * np.sqrt(1000)
        )
        assert rel(u["w"], expected) < 1e-13


@pytest.mark.parametrize("axis", [0, 1, -1, -2])
def test_fold_unfold_algebra(axis):
    rng = np.random.default_rng(3)
    x = jnp.asarray(rng.standard_normal((8, 10)), jnp.float32)
    level = 2
    n = x.shape[axis]
    f = fold(x, level, axis)
    assert f.shape == folded_shape(x.shape, level, axis)
    # F(U(y)) = y, also for a partial last block (U crops, F pads with zeros: the last block
    # mean of U(y) is y * (real count) / 4, so identity holds only for full blocks).
    y = jnp.asarray(rng.standard_normal(f.shape), jnp.float32)
    fu = fold(unfold(y, level, n, axis), level, axis)
    uf = unfold(f, level, n, axis)
    r = x - uf
    if n % 4 == 0:
        assert rel(fu, y) < 1e-7
        # U(F(.)) is idempotent and the residual folds to zero.
        assert rel(unfold(fold(uf, level, axis), level, n, axis), uf) < 1e-7
        assert float(jnp.max(jnp.abs(fold(r, level, axis)))) < 1e-6
    else:
        # by design (zero padding, divisor 4): the partial block's residual does not fold to 0
        assert float(jnp.max(jnp.abs(fold(r, level, axis)))) > 1e-3


def test_fold_of_unfold_is_identity_exact():
    y = jnp.arange(12.0).reshape(3, 4)
    for level in range(4):
        np.testing.assert_array_equal(fold(unfold(y, level, 3 * 2**level, 0), level, 0), y)


def test_state_shapes_and_default_mask_on_nnx_model():
    class Tiny(nnx.Module):
        def __init__(self, rngs):
            self.embed = nnx.Embed(11, 6, rngs=rngs)
            self.proj = nnx.Linear(6, 10, rngs=rngs)
            self.mlp = nnx.Linear(10, 6, rngs=rngs)
            self.lm_head = nnx.Linear(6, 11, rngs=rngs)

    params = nnx.state(Tiny(nnx.Rngs(0)), nnx.Param)
    state = foam(1e-3, level=2).init(params)
    mu = state[0].mu
    assert mu["embed"]["embedding"].shape == (11, 6)
    assert mu["proj"]["kernel"].shape == (2, 10)  # ceil(6 / 4)
    assert mu["mlp"]["kernel"].shape == (3, 6)  # ceil(10 / 4)
    assert mu["proj"]["bias"].shape == (10,)
    assert mu["lm_head"]["kernel"].shape == (6, 11)
    # a folded step runs on the NNX state
    grads = jax.tree.map(jnp.ones_like, params)
    u, _ = jax.jit(foam(1e-3, level=2).update)(grads, state, params)
    assert jax.tree.structure(u) == jax.tree.structure(params)


def test_fold_axis_zero_and_mask_callable():
    params = {"w": jnp.ones((8, 6)), "v": jnp.ones((8, 6))}
    opt = scale_by_foam(level=1, fold_axis=0, fold_mask=lambda p: {"w": True, "v": False})
    st = opt.init(params)
    assert isinstance(st, ScaleByFoamState)
    assert st.mu["w"].shape == (4, 6) and st.mu["v"].shape == (8, 6)
    opt = scale_by_foam(level=1, fold_axis=-1, fold_mask={"w": True, "v": False})
    assert opt.init(params).mu["w"].shape == (8, 3)


def test_fold_keeps_the_sharding_of_the_fold_axis():
    """Sharding propagation: moments folded along a sharded axis stay sharded along it."""
    mesh = jax.make_mesh((8,), ("fsdp",))
    shard = NamedSharding(mesh, P("fsdp", None))
    repl = NamedSharding(mesh, P(None))
    rng = np.random.default_rng(0)
    params = {
        "w": jax.device_put(jnp.asarray(rng.standard_normal((64, 12)), jnp.float32), shard),
        "b": jax.device_put(jnp.zeros(12), repl),
    }
    opt = foam(1e-2, level=2)

    @jax.jit
    def step(p, s):
        u, s = opt.update(jax.tree.map(lambda x: 2.0 * x, p), s, p)
        return optax.apply_updates(p, u), s

    with jax.set_mesh(mesh):
        state = jax.jit(opt.init)(params)
        params, state = step(params, state)
    mu_w = state[0].mu["w"]
    assert mu_w.shape == (16, 12)
    assert isinstance(mu_w.sharding, NamedSharding)
    assert mu_w.sharding.spec == P("fsdp", None)
    assert len(mu_w.sharding.device_set) == 8
    assert params["w"].sharding.is_equivalent_to(shard, 2)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(level=-1), "level"),
        (dict(level=1.5), "level"),
        (dict(b1=1.0), "b1"),
        (dict(eps=-1.0), "eps"),
        (dict(second_moment="rms"), "second_moment"),
        (dict(learning_rate="cosine"), "learning_rate"),
        (dict(learning_rate=[1e-3]), "learning_rate"),
        (dict(weight_decay=-0.1), "weight_decay"),
    ],
)
def test_bad_constructor_arguments(kwargs, match):
    kw = dict(learning_rate=1e-3)
    kw.update(kwargs)
    with pytest.raises(ValueError, match=match):
        foam(**kw)


def test_bad_fold_axis_and_mask():
    params = {"w": jnp.ones((8, 4)), "b": jnp.ones(4)}
    with pytest.raises(ValueError, match="fold_axis"):
        foam(1e-3, fold_axis=2).init(params)
    with pytest.raises(ValueError, match="fold_axis"):
        foam(1e-3, fold_axis=-3).init(params)
    with pytest.raises(ValueError, match="fold_mask"):
        foam(1e-3, fold_mask={"w": True}).init(params)
    with pytest.raises(ValueError, match="fold_mask"):
        foam(1e-3, fold_mask={"w": True, "b": "yes"}).init(params)
