"""The ``pallas_call`` wrapper of the momentum delta rule's Pallas Triton kernels.

Launch parameters come from ``config.launch_params`` (the table and the caller's overrides), a
register bound from ``config.register_bound`` (compiled kernels only). With
``MDNKernelConfig.poison_outputs`` every output buffer starts as NaN (an aliased input), so an
element a kernel never writes stays NaN and a test sees it.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from jaxlib_ext.pallas_kernels._common import like_varying, run_interpreted
from jaxlib_ext.pallas_kernels._registers import max_registers
from jaxlib_ext.pallas_kernels.mdn.config import launch_params, register_bound

F32 = jnp.float32


def shape_dtype(shape, dtype=F32) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(shape, dtype)


def launch(kernel, args, in_specs, out_specs, out_shape, *, grid, name, kp, config, chunk=None):
    """``pl.pallas_call`` of ``kernel`` named ``name`` under ``config`` (an
    ``MDNKernelConfig`` with ``interpret`` set); ``kp``: the padded K and ``chunk`` the chunk
    size, which select the launch parameters and the register bound. Under ``jax.shard_map``
    every output varies over the manual axes of the inputs (interpreted:
    ``_common.run_interpreted``)."""
    interpret = config.interpret
    warps, stages = launch_params(name, kp, config.launch)
    compiler_params = plgpu.CompilerParams(num_warps=warps, num_stages=stages)
    if not interpret and (registers := register_bound(name, chunk)) is not None:
        kernel = _bounded(kernel, registers)
    n_in, n_out = len(args), len(out_shape)

    def call(*args):
        shapes = like_varying(list(out_shape), *args)
        if not config.poison_outputs:
            return pl.pallas_call(
                kernel,
                out_shape=shapes,
                grid=grid,
                in_specs=in_specs,
                out_specs=out_specs,
                compiler_params=compiler_params,
                interpret=interpret,
                name=name,
            )(*args)
        bufs = like_varying([jnp.full(s.shape, jnp.nan, s.dtype) for s in shapes], *args)

        def poisoned(*refs):
            kernel(*refs[:n_in], *refs[n_in + n_out :])

        return pl.pallas_call(
            poisoned,
            out_shape=shapes,
            grid=grid,
            in_specs=list(in_specs) + list(out_specs),
            out_specs=out_specs,
            input_output_aliases={n_in + i: i for i in range(n_out)},
            compiler_params=compiler_params,
            interpret=interpret,
            name=name,
        )(*args, *bufs)

    return run_interpreted(call, *args) if interpret else call(*args)


def _bounded(kernel, registers):
    def bounded(*refs):
        max_registers(registers)
        kernel(*refs)

    return bounded
