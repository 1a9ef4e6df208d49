import jax
import optax
import pytest
from flax import nnx

from jaxlib_ext.core import sharding
from jaxlib_ext.models import build_transformer


def test_parse_mesh_spec():
    assert sharding.parse_mesh_spec(None, 8) == {"data": 8}
    assert sharding.parse_mesh_spec("data=2,fsdp=4", 8) == {"data": 2, "fsdp": 4}
    assert sharding.parse_mesh_spec("data=-1,tensor=2", 8) == {"data": 4, "tensor": 2}


@pytest.mark.parametrize("spec", ["data=3", "data", "pipe=8", "data=2,data=4", "data=-1,fsdp=-1",
                                  "data=x", "data=0,fsdp=8"])
def test_bad_mesh_specs_name_the_argument(spec):
    with pytest.raises(ValueError, match="^spec: "):
        sharding.parse_mesh_spec(spec, 8)


def test_logical_rules_respect_divisibility():
    mesh = sharding.make_mesh("data=2,fsdp=2,tensor=2")
    assert sharding.logical_to_spec(("embed", "mlp"), (128, 64), mesh) == jax.P("fsdp", "tensor")
    assert sharding.logical_to_spec(("embed", "mlp"), (127, 64), mesh) == jax.P(None, "tensor")
    assert sharding.logical_to_spec(None, (4, 4), mesh) == jax.P()
    assert sharding.data_parallel_size(mesh) == 4


def test_param_and_optimizer_state_shardings():
    mesh = sharding.make_mesh("data=2,fsdp=4")
    model = build_transformer("tiny", rngs=nnx.Rngs(0))
    params = nnx.state(model, nnx.Param)
    p_sh = sharding.param_shardings(params, mesh)
    placed = jax.device_put(params, p_sh)
    emb = placed["embed"]["embedding"].get_value()
    assert emb.sharding.spec == jax.P(None, "fsdp")
    assert len(emb.addressable_shards) == 8
    opt_shapes = jax.eval_shape(optax.adam(1e-3).init, params)
    o_sh = sharding.state_shardings(opt_shapes, params, p_sh, mesh)
    mu_emb = o_sh[0].mu["embed"]["embedding"]
    assert mu_emb.get_value().spec == jax.P(None, "fsdp")
    assert o_sh[0].count.spec == jax.P()
