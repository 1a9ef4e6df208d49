"""Decoding kernel of the momentum delta rule (Momentum DeltaNet, arXiv 2605.05838): one
token against the cached (S, M), equations (1)-(4) of ``mdn.reference``::

    w = S^T p - v,   M' = mu M + eta k w^T,   S' = alpha S - beta M',   o = S'^T (scale q)
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from jaxlib_ext.pallas_kernels._common import like_varying, pow2, run_interpreted
from jaxlib_ext.pallas_kernels._partition import batch_and_head_parallel
from jaxlib_ext.pallas_kernels.mdn._launch import shape_dtype
from jaxlib_ext.pallas_kernels.mdn.config import launch_params

__all__ = ["momentum_delta_rule_step_pallas"]

_F32 = jnp.float32


def _step_kernel(q_ref, k_ref, v_ref, p_ref, g_ref, s_ref, m_ref, o_ref, s_out, m_out, *, scale):
    """One (batch, head, V-block): equations (1)-(4) for a single step, reading S and M once.

    The four gates arrive packed in a 16-wide row (alpha, mu, beta, eta in columns 0..3)."""
    g = g_ref[...].astype(_F32)
    col = jnp.arange(g.shape[-1])
    pick = lambda i: jnp.sum(jnp.where(col == i, g, 0.0))
    log_alpha, log_mu, beta, eta = pick(0), pick(1), pick(2), pick(3)
    s = s_ref[...]
    m = m_ref[...]
    w = jnp.sum(s * p_ref[...].astype(_F32)[:, None], axis=0) - v_ref[...].astype(_F32)  # (1)
    m = jnp.exp(log_mu) * m + eta * (k_ref[...].astype(_F32)[:, None] * w[None, :])  # (2)
    s = jnp.exp(log_alpha) * s - beta * m  # (3)
    o = jnp.sum(s * (scale * q_ref[...].astype(_F32))[:, None], axis=0)  # (4)
    o_ref[...] = o.astype(o_ref.dtype)
    s_out[...] = s
    m_out[...] = m


@functools.partial(jax.jit, static_argnames=("scale", "interpret", "block_v"))
def momentum_delta_rule_step_pallas(
    q, k, v, p, log_alpha, log_mu, beta, eta, state, *, scale, interpret=False, block_v=None
):
    """One decoding step of the momentum delta rule as a single Pallas kernel (no autodiff).

    Args:
      q, k, p: [B, H, K]; v: [B, H, V]; log_alpha, log_mu, beta, eta: [B, H];
      state: [2, B, H, K, V] float32 (S, M) before the step; scale: Python float.

    Returns:
      ``(o, new_state)``: o [B, H, V] in q's dtype, new_state float32 [2, B, H, K, V].

    Each program owns a [K, block_v] column block of S and M (the columns of (1)-(4) are
    independent), so the state is read once and written once, which is what a memory-bound step
    needs; XLA's version reads S again for the output. Sharded over batch and heads, each
    device runs the kernel on its own rows and heads (``_partition.batch_and_head_parallel``).
    """
    b, h, kdim = q.shape
    vdim = v.shape[-1]
    if state.shape != (2, b, h, kdim, vdim):
        raise ValueError(f"state: expected shape {(2, b, h, kdim, vdim)}, got {state.shape}")
    kp, vp = pow2(kdim), pow2(vdim)
    if block_v is None:
        block_v = min(vp, 64 if kp <= 128 else 32)
    pad_k = lambda x: jnp.pad(x, ((0, 0), (0, 0), (0, kp - kdim)))
    gates = jnp.stack([x.astype(_F32) for x in (log_alpha, log_mu, beta, eta)], axis=-1)
    gates = jnp.pad(gates, ((0, 0), (0, 0), (0, 12)))
    st = jnp.pad(state.astype(_F32), ((0, 0),) * 3 + ((0, kp - kdim), (0, vp - vdim)))
    vec_k = pl.BlockSpec((None, None, kp), lambda i, j, l: (i, j, 0))
    vec_v = pl.BlockSpec((None, None, block_v), lambda i, j, l: (i, j, l))
    vec_g = pl.BlockSpec((None, None, 16), lambda i, j, l: (i, j, 0))
    blk = pl.BlockSpec((None, None, kp, block_v), lambda i, j, l: (i, j, 0, l))
    warps, stages = launch_params("mdn_step", kp)

    def kernel(*args):
        b, h = args[0].shape[:2]  # this device's rows and heads
        return pl.pallas_call(
            functools.partial(_step_kernel, scale=float(scale)),
            out_shape=like_varying(
                [shape_dtype((b, h, vp), q.dtype)] + [shape_dtype((b, h, kp, vp))] * 2, *args
            ),
            grid=(b, h, vp // block_v),
            in_specs=[vec_k, vec_k, vec_v, vec_k, vec_g, blk, blk],
            out_specs=[vec_v, blk, blk],
            compiler_params=plgpu.CompilerParams(num_warps=warps, num_stages=stages),
            interpret=interpret,
            name="mdn_step",
        )(*args)

    def step(*args):
        return run_interpreted(kernel, *args) if interpret else kernel(*args)

    in_layouts = ["b h k"] * 2 + ["b h v", "b h k", "b h g", "b h k v", "b h k v"]
    out_layouts = ["b h v", "b h k v", "b h k v"]
    o, s, m = batch_and_head_parallel(step, in_layouts, out_layouts)(
        pad_k(q),
        pad_k(k),
        jnp.pad(v, ((0, 0), (0, 0), (0, vp - vdim))),
        pad_k(p),
        gates,
        st[0],
        st[1],
    )
    return o[..., :vdim], jnp.stack([s, m])[:, :, :, :kdim, :vdim]
