"""kernel_audit.inputs and .target: shapes and domains of the op's inputs, the shape argument,
the limits."""

import argparse

import chex
import jax
import jax.numpy as jnp
import kernel_audit
import pytest
from kernel_audit import inputs
from kernel_audit.target import H200_TARGET_CONFIG


def test_parse_shape():
    assert inputs.parse_shape("8,4096,6,128,256") == inputs.DEFAULT_SHAPE
    for bad in ("8,4096,6,128", "8,4096,6,128,0", "8,x,6,128,256"):
        with pytest.raises(argparse.ArgumentTypeError, match="B,T,H,K,V"):
            inputs.parse_shape(bad)


def test_abstract_inputs_shapes_and_dtypes():
    seq, one = inputs.abstract_inputs((2, 5, 3, 4, 6), "bfloat16")
    chex.assert_shape(seq, [(2, 5, 3, 4)] * 2 + [(2, 5, 3, 6), (2, 5, 3, 4)] + [(2, 5, 3)] * 4)
    state = (2, 2, 3, 4, 6)  # [2, B, H, K, V]
    chex.assert_shape(one, [(2, 3, 4)] * 2 + [(2, 3, 6), (2, 3, 4)] + [(2, 3)] * 4 + [state])
    assert [x.dtype for x in seq] == [jnp.bfloat16] * 4 + [jnp.float32] * 4
    assert one[-1].dtype == jnp.float32


def test_random_inputs_dtypes():
    toks = jax.eval_shape(lambda: inputs.random_inputs(1, 4, 1, 8, 4, jnp.bfloat16))
    assert [x.dtype for x in toks] == [jnp.bfloat16] * 4 + [jnp.float32] * 4


@pytest.mark.slow  # compiling the random draws costs seconds; the check tests use them anyway
def test_random_inputs_lie_in_the_ops_domain():
    make = jax.jit(inputs.random_inputs, static_argnums=range(6))  # one compile, not one per op
    q, k, v, p, la, lm, beta, eta = make(2, 16, 3, 8, 4, jnp.float32)
    chex.assert_trees_all_close(jnp.linalg.norm(q, axis=-1), jnp.ones((2, 16, 3)), atol=1e-5)
    chex.assert_trees_all_close(p, jnp.exp(la)[..., None] * k)
    assert bool(jnp.all(la < 0)) and bool(jnp.all(lm < 0))
    assert bool(jnp.all((beta > 0) & (beta < 0.5))) and bool(jnp.all((eta > 0) & (eta < 2)))


def test_limits():
    assert kernel_audit.SHARED_LIMIT == 227 * 1024 and kernel_audit.MAX_REGISTERS == 255
    assert "shared_memory_per_block_optin: 232448" in H200_TARGET_CONFIG

