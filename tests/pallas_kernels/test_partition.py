"""batch_and_head_parallel: kernels run on each device's batch rows and heads, other axes
whole; vmap folds the mapped axis into the batch."""

import contextlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

from jaxlib_ext.pallas_kernels._partition import batch_and_head_parallel


def mesh_2x2():
    return jax.make_mesh((2, 2), ("data", "tensor"), axis_types=(AxisType.Auto,) * 2)


def local_batch_and_prefix(x, w):
    """x [B, T, H], w [B, H]. The first result depends on the batch size the call sees."""
    return x * x.shape[0] + w[:, None, :], jnp.cumsum(x, axis=1)


f = batch_and_head_parallel(local_batch_and_prefix, ["b t h", "b h"], ["b t h", "b t h"])


def test_runs_on_each_devices_rows_and_heads_without_collectives():
    mesh = mesh_2x2()
    x = jnp.arange(4 * 6 * 2, dtype=jnp.float32).reshape(4, 6, 2)
    w = jnp.ones((4, 2))
    xs = jax.device_put(x, NamedSharding(mesh, P("data", None, "tensor")))
    ws = jax.device_put(w, NamedSharding(mesh, P("data", "tensor")))
    scaled, prefix = jax.jit(f)(xs, ws)
    np.testing.assert_array_equal(scaled, x * 2 + 1)  # each device saw 2 of the 4 rows
    np.testing.assert_array_equal(prefix, jnp.cumsum(x, axis=1))
    assert scaled.sharding.spec == P("data", None, "tensor")
    hlo = jax.jit(f).lower(xs, ws).compile().as_text()
    assert "all-gather" not in hlo and "all-reduce" not in hlo


def test_explicit_axes_shard_map_from_the_types():
    mesh = jax.make_mesh((2, 2), ("data", "tensor"), axis_types=(AxisType.Explicit,) * 2)
    x = jnp.arange(4 * 6 * 2, dtype=jnp.float32).reshape(4, 6, 2)
    with jax.set_mesh(mesh):
        xs = jax.device_put(x, NamedSharding(mesh, P("data", None, "tensor")))
        ws = jax.device_put(jnp.ones((4, 2)), NamedSharding(mesh, P("data", "tensor")))
        scaled, prefix = jax.jit(f)(xs, ws)
        assert jax.typeof(scaled).sharding.spec == P("data", None, "tensor")
        # T split too: resharded (gathered over T) before the call
        xt = jax.device_put(x, NamedSharding(mesh, P(None, "data", "tensor")))
        _, prefix_t = jax.jit(f)(xt, ws)
    np.testing.assert_array_equal(np.asarray(scaled), x * 2 + 1)  # 2 of the 4 rows per call
    np.testing.assert_array_equal(np.asarray(prefix), np.cumsum(x, axis=1))
    np.testing.assert_array_equal(np.asarray(prefix_t), np.cumsum(x, axis=1))


def test_inside_shard_map_the_function_sees_the_local_block():
    mesh = mesh_2x2()
    x = jnp.arange(4 * 6 * 2, dtype=jnp.float32).reshape(4, 6, 2)
    w = jnp.ones((4, 2))
    with jax.set_mesh(mesh):
        xs = jax.device_put(x, NamedSharding(mesh, P("data", None, "tensor")))
        ws = jax.device_put(w, NamedSharding(mesh, P("data", "tensor")))
        manual = jax.shard_map(  # every axis manual: rows and heads local
            lambda x, w: f(x, w)[0],
            in_specs=(P("data", None, "tensor"), P("data", "tensor")),
            out_specs=P("data", None, "tensor"),
        )
        partial = jax.shard_map(  # only data manual: heads gathered by XLA
            lambda x, w: f(x, w)[0],
            in_specs=(P("data"), P("data")),
            out_specs=P("data"),
            axis_names={"data"},
        )
        local = jax.jit(manual)(xs, ws)
        part = jax.jit(partial)(xs, ws)
    np.testing.assert_array_equal(np.asarray(local), x * 2 + 1)
    np.testing.assert_array_equal(np.asarray(part), x * 2 + 1)


def test_other_axes_are_gathered_first():
    mesh = mesh_2x2()
    x = jax.random.normal(jax.random.key(0), (4, 8, 2))
    xs = jax.device_put(x, NamedSharding(mesh, P(None, "data", "tensor")))  # T split
    _, prefix = jax.jit(f)(xs, jnp.zeros((4, 2)))
    np.testing.assert_allclose(prefix, jnp.cumsum(x, axis=1), rtol=1e-6)


def test_unsharded_call_sees_the_whole_batch():
    x = jnp.ones((4, 6, 2))
    scaled, _ = jax.jit(f)(x, jnp.zeros((4, 2)))
    np.testing.assert_array_equal(scaled, 4 * x)
    mesh = jax.make_mesh((1,), ("x",), devices=jax.devices()[:1])
    with jax.set_mesh(mesh):  # one device: the function itself, no custom_partitioning
        scaled, _ = jax.jit(f)(x, jnp.zeros((4, 2)))
    np.testing.assert_array_equal(scaled, 4 * x)


@pytest.mark.parametrize("one_device", [False, True])
def test_vmap_folds_the_mapped_axis_into_the_batch(one_device):
    x = jax.random.normal(jax.random.key(1), (4, 6, 2))
    xs = jnp.stack([x, 2 * x, 3 * x])  # mapped axis 0
    w = jnp.arange(8.0).reshape(4, 2)  # not mapped: broadcast
    mesh = jax.make_mesh((1,), ("x",), devices=jax.devices()[:1]) if one_device else None
    with jax.set_mesh(mesh) if mesh else contextlib.nullcontext():
        scaled, prefix = jax.jit(jax.vmap(f, in_axes=(0, None)))(xs, w)
        # mapped axis last: moved to the front first
        scaled_t, _ = jax.vmap(f, in_axes=(2, None))(jnp.moveaxis(xs, 0, 2), w)
    np.testing.assert_allclose(scaled, xs * 12 + w[:, None, :], rtol=1e-6)  # one call, B = 12
    np.testing.assert_allclose(scaled_t, scaled, rtol=1e-6)
    np.testing.assert_allclose(prefix, jnp.cumsum(xs, axis=2), rtol=1e-6)


def test_bad_layouts():
    with pytest.raises(ValueError, match="in_layouts"):
        batch_and_head_parallel(local_batch_and_prefix, ["b t", "b h"], ["b t h"])
    with pytest.raises(ValueError, match="layout"):
        batch_and_head_parallel(local_batch_and_prefix, ["t h", "b h"], ["b t h"])
