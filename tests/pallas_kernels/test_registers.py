"""max_registers: a Pallas Triton kernel bounds its own registers (PTX ``.maxnreg``) through
the Triton module attribute ``ttg.maxnreg``; elsewhere it is a no-op. The MDN backward kernels
take the bound below chunk size 64 (``mdn.config.register_bound``)."""

import jax
import jax.numpy as jnp
import pytest
from jax.experimental import pallas as pl

from jaxlib_ext.pallas_kernels import _registers
from jaxlib_ext.pallas_kernels._registers import max_registers
from jaxlib_ext.pallas_kernels.mdn import MDNKernelConfig, momentum_delta_rule_pallas
from jaxlib_ext.pallas_kernels.mdn.config import register_bound


def doubled(x, *, interpret, registers=255):
    def kernel(x_ref, o_ref):
        max_registers(registers)
        o_ref[...] = 2 * x_ref[...]

    return pl.pallas_call(
        kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype), interpret=interpret
    )(x)


def test_rule_is_registered():
    assert _registers.AVAILABLE  # the JAX this project pins still has the table


def test_interpret_mode_is_unaffected():
    x = jnp.arange(16 * 16, dtype=jnp.float32).reshape(16, 16)
    assert jnp.array_equal(jax.jit(lambda x: doubled(x, interpret=True))(x), 2 * x)


def test_triton_module_carries_the_bound(lower_for_h200):
    sds = jax.ShapeDtypeStruct((16, 16), jnp.float32)
    text = lower_for_h200(lambda x: doubled(x, interpret=False), [sds])
    assert "triton" in text and "ttg.maxnreg" in text


def test_bad_bound():
    with pytest.raises(ValueError, match="registers must be in"):
        doubled(jnp.ones((16, 16)), interpret=True, registers=300)


def test_mdn_backward_kernels_bounded_below_chunk_64(lower_for_h200):
    """The chunk-parallel backward kernels get ``.maxnreg 255`` at C = 32 (where ptxas fell
    back to 32 registers) and no bound at C = 64; the other kernels never."""
    assert register_bound("mdn_chunk_bwd", 32) == 255
    assert register_bound("mdn_prep_bwd", 16) == 255
    assert register_bound("mdn_chunk_bwd_v", 64) is None
    assert register_bound("mdn_prep", 32) is None
    B, T, H, K, V = 1, 64, 1, 32, 32
    sds = lambda s, d=jnp.bfloat16: jax.ShapeDtypeStruct(s, d)
    args = [sds((B, T, H, K)), sds((B, T, H, K)), sds((B, T, H, V)), sds((B, T, H, K))]
    args += [sds((B, T, H), jnp.float32)] * 4

    def grads(chunk, backward):
        def loss(*a):
            o, _ = momentum_delta_rule_pallas(
                *a, scale=K**-0.5, chunk_size=chunk, config=MDNKernelConfig(backward=backward)
            )
            return jnp.sum(o.astype(jnp.float32))

        return jax.grad(loss, argnums=tuple(range(8)))

    for backward in ("pallas", "pallas_split"):
        assert "ttg.maxnreg" in lower_for_h200(grads(32, backward), args)
        assert "ttg.maxnreg" not in lower_for_h200(grads(64, backward), args)
