"""The helpers every op shares (``pallas_kernels._common``): the varying-axes type of values an
op creates inside ``shard_map``, interpreted kernels there, ``pow2``, the kernel-config
protocol the three configs follow and the one ``method`` vocabulary."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from jaxlib_ext.pallas_kernels import _common
from jaxlib_ext.pallas_kernels._common import KernelConfig, like_varying, pow2, run_interpreted
from jaxlib_ext.pallas_kernels.mdn.config import MDNKernelConfig
from jaxlib_ext.pallas_kernels.moe.config import GMMKernelConfig
from jaxlib_ext.pallas_kernels.poet.config import PoetKernelConfig


@pytest.fixture(scope="module")
def mesh():
    if jax.device_count() < 8:
        pytest.skip("needs 8 devices (tests/conftest.py sets JAX_NUM_CPU_DEVICES)")
    return jax.make_mesh((4, 2), ("a", "b"))


def test_like_varying_is_a_no_op_outside_shard_map():
    x = jnp.ones(3)
    struct = jax.ShapeDtypeStruct((2,), jnp.float32)
    out = like_varying((x, struct), x)
    assert out[0] is x and out[1] is struct
    assert jax.jit(lambda x: like_varying(x * 2, x))(x).shape == (3,)


def test_like_varying_gives_the_union_of_the_references_axes(mesh):
    seen = {}

    def body(xa, xb, rep):
        zeros = like_varying(jnp.zeros(3), xa, xb)  # lacks both axes
        partly = like_varying(xb, xa)  # has "b" already: only "a" is cast
        struct = like_varying(jax.ShapeDtypeStruct((3,), jnp.float32), xb)
        invariant = like_varying(rep, rep)
        seen.update(zeros=jax.typeof(zeros).mat.varying, partly=jax.typeof(partly).mat.varying,
                    struct=struct.manual_axis_type.varying,
                    invariant=jax.typeof(invariant).mat.varying)
        return xa.sum() + xb.sum() + zeros.sum() + partly.sum() + invariant.sum()

    specs = (P("a", "b"), P(None, "b"), P())
    f = jax.shard_map(lambda *a: body(*a)[None, None], mesh=mesh, in_specs=specs,
                      out_specs=P("a", "b"))
    args = [jax.device_put(np.ones((8, 4), np.float32), NamedSharding(mesh, s)) for s in specs]
    jax.jit(f)(*args)
    assert seen == dict(zeros={"a", "b"}, partly={"a", "b"}, struct={"b"}, invariant=set())


def test_cast_weight_gradient_is_summed_over_devices(mesh):
    """A replicated operand cast to varying gets the sum of the devices' cotangents."""
    w = jnp.arange(4.0)
    x = jax.device_put(np.ones((8, 4), np.float32), NamedSharding(mesh, P(("a", "b"))))

    def loss(w, x):
        body = lambda w, x: jnp.sum(like_varying(w, x) * x)[None]  # noqa: E731
        f = jax.shard_map(body, mesh=mesh, in_specs=(P(), P(("a", "b"))), out_specs=P(("a", "b")))
        return f(w, x).sum()

    np.testing.assert_allclose(jax.jit(jax.grad(loss))(w, x), np.full(4, 8.0))


def test_run_interpreted_equals_the_unsharded_kernel(mesh):
    from jax.experimental import pallas as pl

    def double(x):
        def kernel(x_ref, o_ref):
            o_ref[...] = 2 * x_ref[...]

        shape = like_varying(jax.ShapeDtypeStruct(x.shape, x.dtype), x)
        return pl.pallas_call(kernel, out_shape=shape, interpret=True)(x)

    x = np.arange(32.0, dtype=np.float32).reshape(8, 4)
    f = jax.shard_map(lambda x: run_interpreted(double, x), mesh=mesh, in_specs=P("a", "b"),
                      out_specs=P("a", "b"))
    np.testing.assert_array_equal(jax.jit(f)(jax.device_put(x, NamedSharding(mesh, P("a", "b")))),
                                  2 * x)
    np.testing.assert_array_equal(run_interpreted(double, x), 2 * x)  # outside: the call itself


def test_pow2():
    assert [pow2(n) for n in (1, 16, 17, 64, 65)] == [16, 16, 32, 64, 128]
    assert pow2(3, minimum=1) == 4


CONFIGS = {
    MDNKernelConfig: ((64, 20), "block_v", 24),
    GMMKernelConfig: ((20, 24), "block_m", 24),
    PoetKernelConfig: ((32,), "num_warps", 0),
}


@pytest.mark.parametrize("cls", list(CONFIGS), ids=lambda c: c.__name__)
def test_every_kernel_config_follows_the_protocol(cls, monkeypatch):
    shape, field, bad = CONFIGS[cls]
    config = cls.default(*shape)
    assert isinstance(config, KernelConfig)
    assert dataclasses.is_dataclass(cls) and cls.__dataclass_params__.frozen
    hash(config)  # a static argument of the kernels
    assert config.for_shape(*shape) == config  # every field set
    with pytest.raises(ValueError, match=field):
        cls(**{field: bad})
    with pytest.raises(ValueError, match="interpret"):
        cls(interpret="yes")
    for backend, interpret in (("cpu", True), ("tpu", True), ("gpu", False)):
        monkeypatch.setattr(jax, "default_backend", lambda backend=backend: backend)
        assert cls(interpret=None).for_shape(*shape).interpret is interpret
        assert cls.default(*shape, interpret=None).interpret is interpret


def test_kernel_config_defaults():
    """The defaults the kernels have always had."""
    assert MDNKernelConfig().interpret is False and MDNKernelConfig.default(64, 20).block_v == 32
    assert GMMKernelConfig() == GMMKernelConfig(64, 64, 32, 4, 2, False)
    assert GMMKernelConfig().for_shape(20, 24) == GMMKernelConfig(64, 32, 32, 4, 2, False)
    assert GMMKernelConfig().for_shape(300, 96) == GMMKernelConfig()
    poet = PoetKernelConfig.default(48, interpret=True)
    assert (poet.block_tokens, poet.block_cols, poet.block_k) == (64, 16, 16)
    with pytest.raises(ValueError, match="block_cols"):
        PoetKernelConfig(block_cols=32).for_shape(48)


def test_default_interpret_is_off_only_on_a_gpu(monkeypatch):
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    assert _common.default_interpret() is False
    monkeypatch.setattr(jax, "default_backend", lambda: "cpu")
    assert _common.default_interpret() is True


def test_one_method_vocabulary_checked_by_every_op():
    """``check_method``: a method of the vocabulary an op lacks, and any other value, raise a
    ValueError naming ``method``; ``check_form`` names its argument."""
    assert _common.METHODS == ("auto", "reference", "xla", "pallas")
    offered = ("auto", "reference", "xla")
    for method in offered:
        assert _common.check_method(method, offered, op="mlstm") == method
    with pytest.raises(ValueError, match="method 'pallas' is not offered by mlstm"):
        _common.check_method("pallas", offered, op="mlstm")
    for bad in ("chunk", "recurrent", "ragged", None, 3):
        with pytest.raises(ValueError, match="method must be one of"):
            _common.check_method(bad)
    assert _common.check_form("xla_form", "chunk", ("chunk", "parallel")) == "chunk"
    with pytest.raises(ValueError, match="xla_form must be one of"):
        _common.check_form("xla_form", "tiled", ("chunk", "parallel"))
