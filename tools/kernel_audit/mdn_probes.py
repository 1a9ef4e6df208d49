"""The momentum delta rule's Pallas op as the tools drive it: options as flat keywords.

``pallas_op`` calls ``momentum_delta_rule_pallas`` with ``chunk_size`` and the fields of
``MDNKernelConfig`` given as keyword arguments, the form the tuning candidates are written in
(``candidates.py``). Compiled with float32 inputs and padded K > 64 it runs at chunk size 32 at
most (the op refuses more: the fused backward kernel would not fit shared memory), so a sweep
over shapes and dtypes keeps one ``--chunk``. ``mosaic_state_kernel_applies`` asks the op
itself, by tracing it, whether the Mosaic GPU state kernel runs at a shape.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp

from jaxlib_ext.pallas_kernels._common import pow2
from jaxlib_ext.pallas_kernels.mdn import MDNKernelConfig, momentum_delta_rule_pallas

OPTION_NAMES = ("chunk_size", *(f.name for f in dataclasses.fields(MDNKernelConfig)))


def pallas_op(*args, chunk_size=64, scale, initial_state=None, output_final_state=False, **fields):
    """``momentum_delta_rule_pallas(*args, ...)`` with ``MDNKernelConfig(**fields)``."""
    q = args[0]
    if not fields.get("interpret", False) and q.dtype == jnp.float32 and pow2(q.shape[-1]) > 64:
        chunk_size = min(chunk_size, 32)
    return momentum_delta_rule_pallas(
        *args,
        scale=scale,
        initial_state=initial_state,
        output_final_state=output_final_state,
        chunk_size=chunk_size,
        config=MDNKernelConfig(**fields),
    )


def mosaic_state_kernel_applies(dtype, t, kdim, vdim, chunk_size, block_v, launch=()):
    """Whether ``state_kernel="mosaic_gpu"`` with this ``block_v`` (which must divide the
    padded V) and ``launch`` runs for inputs of ``dtype`` at sequence length ``t`` and head
    sizes ``kdim``, ``vdim``: the op's own checks, run by tracing it."""
    if pow2(vdim) % block_v:
        return False
    sds = jax.ShapeDtypeStruct
    tok = lambda d: sds((1, t, 1, d), dtype)
    args = [tok(kdim), tok(kdim), tok(vdim), tok(kdim)] + [sds((1, t, 1), jnp.float32)] * 4
    op = functools.partial(
        pallas_op, scale=1.0, chunk_size=chunk_size, state_kernel="mosaic_gpu", block_v=block_v,
        launch=launch,
    )  # fmt: skip
    try:
        jax.eval_shape(op, *args)
    except ValueError:
        return False
    return True
