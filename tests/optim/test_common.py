"""Generic checks every optimizer of ``jaxlib_ext.optim`` passes (in the style of optax's
``contrib/_common_test.py``): it reaches the minimum of a small problem, works under ``jit``,
``inject_hyperparams``, ``MultiSteps`` and ``chain``, accepts optax's extra keyword arguments,
keeps parameter dtypes, and its state goes through ``optax.tree.map_params`` and shards like the
parameters. A new optimizer joins with one line in ``OPTIMIZERS``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

from jaxlib_ext.optim import foam, poet_x, smet, sparsify


class Case(NamedTuple):
    """An optimizer under test.

    Attributes:
      factory: the alias, called as ``factory(learning_rate=..., **kwargs)``.
      kwargs: its other arguments.
      static_args: the arguments ``optax.inject_hyperparams`` must leave static (state shapes).
      support: ``support(target, state) -> target`` restricted to what the optimizer can reach
        (SMET reaches the minimum on its active entries); ``None`` for the identity.
    """

    factory: Callable[..., optax.GradientTransformation]
    kwargs: dict[str, Any]
    static_args: tuple[str, ...]
    support: Callable[[Any, Any], Any] | None = None


OPTIMIZERS = {
    "foam": Case(foam, dict(level=1), ("level", "fold_axis")),
    "smet": Case(smet, dict(density=0.5, total_steps=10_000, update_every=5_000, block_size=4,
                            key=jax.random.key(0)), ("density", "block_size"), sparsify),
    "poet_x": Case(poet_x, dict(merge_every=5), ("merge_every",)),
}
NAMES = list(OPTIMIZERS)


def make(name, learning_rate=1e-2, **overrides):
    case = OPTIMIZERS[name]
    return case.factory(learning_rate=learning_rate, **{**case.kwargs, **overrides})


def inject(name, learning_rate=1e-2):
    case = OPTIMIZERS[name]
    return optax.inject_hyperparams(case.factory, static_args=case.static_args)(
        learning_rate=learning_rate, **case.kwargs
    )


# A vector (dense Adam in every optimizer) and a matrix (folded by FOAM, sparse in SMET).
TARGET = {"v": jnp.array([1.0, -1.0, 2.0]),
          "w": jnp.array([[3.0, -2.0, 1.0, 4.0], [1.0, 0.5, -1.0, 2.0],
                          [-3.0, 2.0, 1.5, -0.5], [0.5, 1.0, -2.0, 3.0]])}


def params_like(dtype=jnp.float32, fill=0.5):
    return jax.tree.map(lambda t: jnp.full(t.shape, fill, dtype), TARGET)


def grads_at(params, target=TARGET):
    """Gradient of ``sum((p - target)^2)``, in the params' dtypes."""
    return jax.tree.map(lambda p, t: (2.0 * (p - t)).astype(p.dtype), params, target)


def run_steps(opt, params, steps, **update_kwargs):
    """``steps`` updates on the parabola under ``jit`` (``lax.scan``); returns params, state."""

    def body(carry, _):
        p, s = carry
        u, s = opt.update(grads_at(p), s, p, **update_kwargs)
        return (optax.apply_updates(p, u), s), None

    run = jax.jit(lambda p: jax.lax.scan(body, (p, opt.init(p)), length=steps)[0])
    return run(params)


@pytest.mark.parametrize("name", NAMES)
def test_reaches_the_minimum_of_a_parabola(name):
    lr = optax.cosine_decay_schedule(0.1, 1500, alpha=0.01)
    params, state = run_steps(make(name, lr), params_like(), 1500)
    support = OPTIMIZERS[name].support
    target = TARGET if support is None else support(TARGET, state)
    chex.assert_trees_all_close(params, target, atol=3e-2, rtol=3e-2)


@pytest.mark.parametrize("name", NAMES)
def test_jit_does_not_recompile_and_accepts_extra_args(name):
    opt = make(name)
    chained = optax.chain(optax.clip_by_global_norm(1e6), opt)

    @jax.jit
    def step(p, s, s_chained):
        g = grads_at(p)
        u, s = opt.update(g, s, p, unexpected_extra_arg=1)
        u2, s_chained = chained.update(g, s_chained, p, unexpected_extra_arg=1)
        return optax.apply_updates(p, u), s, s_chained, u, u2

    p = params_like()
    s, sc = opt.init(p), chained.init(p)
    for _ in range(3):
        p, s, sc, u, u2 = step(p, s, sc)
        # clipping at a huge norm is the identity: the chain changes nothing
        chex.assert_trees_all_equal(u, u2)
    assert step._cache_size() == 1


@pytest.mark.parametrize("name", NAMES)
def test_inject_hyperparams(name):
    params = params_like()
    plain, injected = make(name, 1e-2), inject(name, 1e-2)
    s_plain = jax.jit(plain.init)(params)
    s_inj = jax.jit(injected.init)(params)
    # the state's structure does not depend on hyperparameters being numbers or arrays
    chex.assert_trees_all_equal_structs(s_inj.inner_state, s_plain)
    chex.assert_trees_all_equal_shapes_and_dtypes(s_inj.inner_state, s_plain)
    u_plain, s_plain = jax.jit(plain.update)(grads_at(params), s_plain, params)
    u_inj, s_inj = jax.jit(injected.update)(grads_at(params), s_inj, params)
    chex.assert_trees_all_equal_structs(s_inj.inner_state, s_plain)
    # hyperparameters become float32 arrays: rounding differs from Python floats
    chex.assert_trees_all_close(u_inj, u_plain, rtol=1e-5)
    chex.assert_trees_all_close(s_inj.inner_state, s_plain, rtol=1e-5, atol=1e-5)
    # a learning rate changed through the injected state takes effect
    params = optax.apply_updates(params, u_plain)
    s_inj.hyperparams["learning_rate"] = jnp.asarray(3e-2, jnp.float32)
    u_inj, _ = jax.jit(injected.update)(grads_at(params), s_inj, params)
    u_ref, _ = jax.jit(make(name, 3e-2).update)(grads_at(params), s_plain, params)
    chex.assert_trees_all_close(u_inj, u_ref, rtol=1e-5)


@pytest.mark.parametrize("name", NAMES)
def test_learning_rate_schedule_equals_constant(name):
    p_sched, _ = run_steps(make(name, optax.constant_schedule(1e-2)), params_like(), 10)
    p_const, _ = run_steps(make(name, 1e-2), params_like(), 10)
    chex.assert_trees_all_close(p_sched, p_const, rtol=1e-6)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_multisteps_and_dtypes(name, dtype):
    """Updates keep the params' dtype; the state keeps its shapes and dtypes across steps;
    ``MultiSteps(opt, 2)`` returns zeros, then one step on the mean gradient."""
    params = params_like(dtype)
    opt = make(name)
    state = jax.jit(opt.init)(params)
    updates, new_state = jax.jit(opt.update)(grads_at(params), state, params)
    chex.assert_trees_all_equal_dtypes(updates, params)
    chex.assert_tree_all_finite((updates, new_state))
    # a descent step on the vector, which every optimizer treats densely
    g_v = np.asarray(grads_at(params)["v"], np.float32)
    np.testing.assert_array_equal(np.sign(np.asarray(updates["v"], np.float32)), -np.sign(g_v))
    chex.assert_trees_all_equal_shapes_and_dtypes(new_state, state)

    multi = optax.MultiSteps(opt, every_k_schedule=2)
    update = jax.jit(multi.update)
    g1 = grads_at(params)
    g2 = jax.tree.map(lambda g: (0.5 * g).astype(g.dtype), g1)
    ms = multi.init(params)
    u1, ms = update(g1, ms, params)
    chex.assert_trees_all_equal(u1, jax.tree.map(jnp.zeros_like, params))
    u2, ms = update(g2, ms, params)
    chex.assert_trees_all_equal_dtypes(u2, params)
    mean = jax.tree.map(lambda a, b: (a + b) / 2, g1, g2)
    ref, _ = jax.jit(opt.update)(mean, state, params)
    tol = 1e-2 if dtype == jnp.bfloat16 else 1e-6
    chex.assert_trees_all_close(u2, ref, rtol=tol, atol=tol)


def _like_param(leaf, sharding):
    """The parameter's sharding where a state leaf can take it (same rank, divisible sizes),
    replicated otherwise (step counters, block indices, scalars); an ``optax.MaskedNode`` (a
    leaf another transform of an ``optax.partition`` holds) stays as it is."""
    if isinstance(leaf, optax.MaskedNode):
        return leaf
    spec = tuple(sharding.spec) + (None,) * (leaf.ndim - len(sharding.spec))
    mesh = sharding.mesh
    fits = len(spec) == leaf.ndim and all(
        axis is None or size % mesh.shape[axis] == 0 for axis, size in zip(spec, leaf.shape)
    )
    return sharding if fits else NamedSharding(mesh, P())


@pytest.mark.parametrize("name", NAMES)
def test_state_shards_like_the_parameters(name):
    assert jax.device_count() == 8
    # Auto axes, as jaxlib_ext.core.sharding.make_mesh: XLA propagates the shardings inside the step
    mesh = jax.make_mesh((2, 4), ("a", "b"), axis_types=(AxisType.Auto,) * 2)
    param_sh = {"v": NamedSharding(mesh, P()),
                "w": NamedSharding(mesh, P("a", "b"))}
    params = jax.device_put(params_like(), param_sh)
    opt = make(name)
    state = opt.init(params)
    # optax's own way of deriving the state's shardings (is_leaf: optax.partition's masks)
    state_sh = optax.tree.map_params(
        opt, _like_param, state, param_sh,
        transform_non_params=lambda _: NamedSharding(mesh, P()),
        is_leaf=lambda v: isinstance(v, optax.MaskedNode),
    )
    sharded = [sh for sh in jax.tree.leaves(state_sh) if sh.spec != P()]
    assert sharded, "no state leaf takes the parameters' sharding"
    state = jax.device_put(state, state_sh)

    @jax.jit
    def step(p, s):
        u, s = opt.update(grads_at(p), s, p)
        return optax.apply_updates(p, u), s

    sharded_step = jax.jit(step, in_shardings=(param_sh, state_sh),
                           out_shardings=(param_sh, state_sh))
    p1, s1 = sharded_step(params, state)
    p_ref, s_ref = step(params_like(), opt.init(params_like()))
    chex.assert_trees_all_close(p1, p_ref, rtol=1e-6)
    chex.assert_trees_all_close(s1, s_ref, rtol=1e-6)
    for leaf, sh in zip(jax.tree.leaves(s1), jax.tree.leaves(state_sh), strict=True):
        assert leaf.sharding.is_equivalent_to(sh, leaf.ndim)


def _poet_layer(dtype, n=8, m=8, b=4):
    """The five leaves of one POET layer (base weight, rotations, permutations)."""
    p = b * (b - 1) // 2
    w = np.random.default_rng(0).normal(size=(n, m))
    return {"poet_base": jnp.asarray(w, dtype), "theta_in": jnp.zeros((n // b, p), dtype),
            "theta_out": jnp.zeros((m // b, p), dtype),
            "perm_in": jnp.arange(n, dtype=jnp.int32), "perm_out": jnp.arange(m, dtype=jnp.int32)}


# POET-X's merge is a lax.cond traced only for trees that hold a POET layer.
EXTRA_LEAVES = {"poet_x": lambda dtype: {"poet": _poet_layer(dtype)}}


# POET-X's update (its merge a lax.cond) compiles for seconds per dtype pair: its bfloat16
# parameters (also run by test_multisteps_and_dtypes) with float32 gradients are a sweep
@pytest.mark.parametrize("name, param_dtype, grad_dtype", [
    pytest.param(name, p, g, id=f"{p.__name__}-{g.__name__}-{name}",
                 marks=[pytest.mark.slow] if (name, p) == ("poet_x", jnp.bfloat16) else [])
    for name in NAMES for p, g in ((jnp.bfloat16, jnp.float32), (jnp.float32, jnp.bfloat16))
])
def test_gradients_in_another_dtype_than_the_params(name, param_dtype, grad_dtype):
    """Mixed precision: gradients in another dtype than the params, plain and through
    ``MultiSteps`` (float32 accumulator), over a merge step for POET-X: the params keep their
    dtypes and end where gradients in the params' dtype take them."""
    params = {**params_like(param_dtype), **EXTRA_LEAVES.get(name, lambda _: {})(param_dtype)}
    target = {**TARGET, **{k: v for k, v in params.items() if k not in TARGET}}

    def run(opt, dtype, steps=2):
        update = jax.jit(opt.update)
        p, s = params, opt.init(params)
        for _ in range(steps):
            g = jax.tree.map(lambda p, t: (2.0 * (p - t)).astype(
                dtype if jnp.issubdtype(p.dtype, jnp.floating) else p.dtype), p, target)
            u, s = update(g, s, p)
            p = optax.apply_updates(p, u)
        return p

    # POET-X merges at step 2 (the lax.cond whose branches must agree)
    for opt in (make(name, **({"merge_every": 2} if name == "poet_x" else {})),
                optax.MultiSteps(make(name), every_k_schedule=2)):
        mixed, same = run(opt, grad_dtype), run(opt, param_dtype)
        chex.assert_trees_all_equal_dtypes(mixed, params)
        chex.assert_trees_all_close(mixed, same, rtol=1e-2, atol=1e-2)
        if name == "poet_x" and not isinstance(opt, optax.MultiSteps):
            np.testing.assert_array_equal(np.asarray(mixed["poet"]["theta_in"], np.float32), 0.0)
