"""The momentum delta rule's Pallas path: the public entry point and its custom VJP.

Computes the same as ``mdn.reference`` (eqs. (1)-(4)) chunkwise, in Pallas kernels, forward
and backward (equations (5)-(11) of ``_chunk_algebra``):

* forward: ``prep.py`` (chunk-parallel: (5), (6), the inverse of (9), the right-hand sides of
  (11) and the coefficients of (7), (8), (10)), ``state.py`` (sequential over chunks per batch
  row, head and V-block: (11), (7), (8); or ``mosaic.py``, the Mosaic GPU version) and
  ``output.py`` (chunk-parallel: (10));
* backward (``jax.custom_vjp``): the preparation again (nothing but the inputs, Vt and the
  states entering each chunk is kept from the forward), the reverse state recurrence
  (``state.py``) and the chunk-parallel parameter gradients (``prep_bwd.py``).

Conventions: inputs are zero-padded to ``T % chunk_size == 0`` with gates ``log_alpha =
log_mu = 0``, ``beta = eta = 0`` (a padded step leaves (S, M) unchanged) and K, V to
``_common.pow2`` (a power of two >= 16, as Triton's block dimensions must be). Accumulation
is float32. In-kernel dots: bfloat16 inputs take bfloat16 operands (bf16 MMA) and store the
intermediates that only feed dots in bfloat16; float32 inputs take 3xTF32
(``DotAlgorithmPreset.TF32_TF32_F32_X3``, about float32 accuracy on the tensor cores) when
compiled and ``Precision.HIGHEST`` in interpret mode.

Sharding: every (batch row, head) is independent; the forward and the backward carry a rule
(``_partition.batch_and_head_parallel``) so that under ``jit`` with inputs sharded over batch
and heads each device runs the kernels on its own rows and heads with no collective.
``jax.vmap`` folds the mapped axis into B. Inside ``jax.shard_map`` every input of the custom VJP
(the zero initial states too) takes the varying axes of all of them, so the cotangents have the
inputs' types.

Memory: the forward keeps Vt [B, T, H, V] and the states entering every chunk,
2 x [B, H, T/C, K, V], for the backward; everything else is recomputed.

Limits: the Pallas Triton backend is deprecated from JAX 0.11 on (a DeprecationWarning at
lowering); only the forward state recurrence has a Mosaic GPU version. Compiled with float32
inputs and padded K > 64, chunk_size must be at most 32 (at 64 the fused backward kernel
needs more than an H200's 227 KiB of shared memory).
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

from jaxlib_ext.pallas_kernels._common import check_token_layout, like_varying, pow2
from jaxlib_ext.pallas_kernels._partition import batch_and_head_parallel, with_shardings_of
from jaxlib_ext.pallas_kernels.mdn._chunk_algebra import F32, ChunkPrep, inverse_fn, prep_xla
from jaxlib_ext.pallas_kernels.mdn.config import MDNKernelConfig, launch_params
from jaxlib_ext.pallas_kernels.mdn.output import out_call
from jaxlib_ext.pallas_kernels.mdn.prep import prep_call
from jaxlib_ext.pallas_kernels.mdn.prep_bwd import (
    chunk_bwd_call,
    chunk_bwd_split_call,
    param_cotangents_xla,
)
from jaxlib_ext.pallas_kernels.mdn.state import state_bwd_call, state_fwd_call

__all__ = ["MDNKernelConfig", "momentum_delta_rule_pallas"]


class _Settings(NamedTuple):
    """The static settings of one call (``nondiff_argnums`` of the custom VJP)."""

    chunk: int
    scale: float
    precision: object  # lax.Precision or DotAlgorithmPreset of the in-kernel dots
    inverse: object  # the in-kernel triangular inverse of (9) (``inverse_fn``)
    config: MDNKernelConfig  # every field set


def _forward(args, st):
    q, k, v, p, la, lm, beta, eta, s0, m0 = args
    cfg = st.config
    kw = dict(chunk=st.chunk, precision=st.precision, config=cfg)
    prep = prep_call(q, k, v, p, la, lm, beta, eta, scale=st.scale, inverse=st.inverse, **kw)
    if cfg.state_kernel == "mosaic_gpu":
        from jaxlib_ext.pallas_kernels.mdn.mosaic import state_fwd_mosaic

        _, stages = launch_params("mdn_state_fwd_mosaic", q.shape[-1], cfg.launch)
        state = state_fwd_mosaic(
            prep, s0, m0, chunk=st.chunk, block_v=cfg.block_v, stages=stages,
            interpret=cfg.interpret,
        )  # fmt: skip
    else:
        state = state_fwd_call(prep, s0, m0, block_v=cfg.block_v, **kw)
    vt, hs, hm, s_end, m_end = state
    o = out_call(prep, hs, hm, vt, q.dtype, block_v=cfg.block_v, **kw)
    return (o, s_end, m_end), (vt, hs, hm)


# Layouts of the padded arrays for ``batch_and_head_parallel`` (n: N * Kp stacked states).
_ARG_LAYOUTS = ("b t h k", "b t h k", "b t h v", "b t h k") + ("b t h",) * 4 + ("b h k v",) * 2
_OUT_LAYOUTS = ("b t h v", "b h k v", "b h k v")
_RES_LAYOUTS = ("b t h v", "b h n v", "b h n v")  # Vt and the per-chunk states


def _forward_sharded(args, st):
    """``_forward`` partitioned over batch and heads (``_partition.py``)."""

    def forward(*args):
        out, res = _forward(args, st)
        return out + res

    if not (st.config.interpret and st.config.state_kernel == "mosaic_gpu"):
        # (GPU interpret mode's callbacks carry ordered effects, which custom_partitioning
        # cannot lower; interpreted kernels are plain XLA ops that XLA partitions itself.)
        forward = batch_and_head_parallel(forward, _ARG_LAYOUTS, _OUT_LAYOUTS + _RES_LAYOUTS)
    outs = forward(*args)
    return outs[:3], outs[3:]


@functools.partial(jax.custom_vjp, nondiff_argnums=(1,))
def _mdn_core(args, st):
    return _forward_sharded(args, st)[0]


def _mdn_core_fwd(args, st):
    out, res = _forward_sharded(args, st)
    return out, (args, res)


def _mdn_core_bwd(st, residuals, cotangents):
    args, res = residuals

    def backward(*arrays):
        return _backward(arrays, st)

    layouts = _ARG_LAYOUTS + _RES_LAYOUTS + _OUT_LAYOUTS
    grads = batch_and_head_parallel(backward, layouts, _ARG_LAYOUTS)(*args, *res, *cotangents)
    return (with_shardings_of(grads, args),)


def _backward(arrays, st):
    """Gradients of the ten padded inputs from the inputs, the residuals and the cotangents of
    (o, S_T, M_T)."""
    args, (vt, hs, hm, do, ds_end, dm_end) = arrays[:10], arrays[10:]
    q, k, v, p, la, lm, beta, eta, s0, m0 = args
    cfg = st.config
    kw = dict(chunk=st.chunk, precision=st.precision, config=cfg)
    if cfg.backward != "xla":
        prep = prep_call(q, k, v, p, la, lm, beta, eta, scale=st.scale, inverse=st.inverse, **kw)
    else:
        prep_fn = functools.partial(
            prep_xla, chunk=st.chunk, scale=st.scale, precision=st.precision
        )
        prep, prep_vjp = jax.vjp(prep_fn, q, k, v, p, la, lm, beta, eta)
    dvt, dhs, dhm, ds0, dm0 = state_bwd_call(
        prep, do, ds_end.astype(F32), dm_end.astype(F32), block_v=cfg.block_v, **kw
    )
    if cfg.backward in ("pallas", "pallas_split"):
        call = chunk_bwd_call if cfg.backward == "pallas" else chunk_bwd_split_call
        grads = call(
            args[:8], do, vt, dvt, hs, hm, dhs, dhm,
            block_v=cfg.block_v, scale=st.scale, inverse=st.inverse, **kw,
        )  # fmt: skip
    else:
        cts = param_cotangents_xla(do, vt, dvt, hs, hm, dhs, dhm, st.chunk, st.precision)
        # dVt comes from the state kernel in the dot dtype (bf16 on the bf16 path); the XLA
        # mirror's outputs, whose cotangents these are, are float32
        grads = prep_vjp(ChunkPrep(*(c.astype(x.dtype) for c, x in zip(cts, prep, strict=True))))
    grads = tuple(g.astype(a.dtype) for g, a in zip(grads, args[:8], strict=True))
    return grads + (ds0, dm0)


_mdn_core.defvjp(_mdn_core_fwd, _mdn_core_bwd)


def _check_chunk_size(chunk_size, dtype, kp, config):
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int):
        raise ValueError(f"chunk_size: expected a power of two >= 16, got {chunk_size!r}")
    if chunk_size < 16 or chunk_size & (chunk_size - 1):
        raise ValueError(f"chunk_size: expected a power of two >= 16, got {chunk_size}")
    if not config.interpret and jnp.dtype(dtype) == F32 and kp > 64 and chunk_size > 32:
        raise ValueError(
            f"chunk_size: {chunk_size} does not fit compiled with float32 inputs and K padded to "
            f"{kp} > 64 (the fused backward kernel would need more than an H200's 227 KiB of "
            "shared memory); use chunk_size 16 or 32, or bfloat16 inputs"
        )


def _check_mosaic_state_kernel(dtype, t, kp, chunk_size, config):
    """Raise ValueError, naming the argument, where ``state_kernel="mosaic_gpu"`` cannot run
    (``mosaic.check_supported`` on the padded sizes). Any input dtype but float32 takes
    bfloat16 dot operands."""
    from jaxlib_ext.pallas_kernels.mdn.mosaic import check_supported

    check_supported(
        dot_dtype=F32 if jnp.dtype(dtype) == F32 else jnp.bfloat16,
        chunk=chunk_size,
        kp=kp,
        block_v=config.block_v,
        n_chunks=-(-t // chunk_size),
        stages=launch_params("mdn_state_fwd_mosaic", kp, config.launch)[1],
    )


@functools.partial(
    jax.jit, static_argnames=("scale", "output_final_state", "chunk_size", "config")
)
def momentum_delta_rule_pallas(
    q, k, v, p, log_alpha, log_mu, beta, eta, *,
    scale, initial_state=None, output_final_state=False, chunk_size=64, config=None,
):  # fmt: skip
    """Momentum delta rule, chunkwise, in Pallas kernels (the module docstring).

    Args:
      q, k, p: [B, T, H, K] float32 or bfloat16.
      v: [B, T, H, V], same dtype family.
      log_alpha, log_mu, beta, eta: [B, T, H] gates (``alpha = exp(log_alpha)``, likewise mu;
        ``log_mu`` finite).
      scale: query scale (a Python float; the public op fills in ``K**-0.5``).
      initial_state: [2, B, H, K, V] holding (S, M), or None for zeros.
      output_final_state: also return the final (S, M) as float32 [2, B, H, K, V].
      chunk_size: chunk length, a power of two >= 16; at most 32 when compiled with float32
        inputs and padded K > 64.
      config: an ``MDNKernelConfig``; None: ``MDNKernelConfig.default(K, V)``. Its ``None``
        fields take the defaults for K and V.

    Returns:
      ``(o, final_state)``: o [B, T, H, V] in q's dtype; final_state float32 or None.

    Raises:
      ValueError: bad shapes or dtypes, an unsupported ``chunk_size``, or a config field that
        cannot run at these sizes (the message names the argument or field).
    """
    gates = {"log_alpha": log_alpha, "log_mu": log_mu, "beta": beta, "eta": eta}
    b, t, h, kdim, vdim = check_token_layout(
        q, v, {"k": k, "p": p}, gates, initial_state, ("2", "B", "H", "K", "V")
    )
    kp, vp = pow2(kdim), pow2(vdim)
    config = (config or MDNKernelConfig()).for_shape(kdim, vdim)
    _check_chunk_size(chunk_size, q.dtype, kp, config)
    if vp % config.block_v:
        raise ValueError(f"block_v: expected a power of two dividing {vp}, got {config.block_v}")
    if config.state_kernel == "mosaic_gpu":
        _check_mosaic_state_kernel(q.dtype, t, kp, chunk_size, config)
    f32_grade = (
        lax.Precision.HIGHEST if config.interpret else lax.DotAlgorithmPreset.TF32_TF32_F32_X3
    )
    precision = f32_grade if q.dtype == F32 else lax.Precision.DEFAULT  # DEFAULT: bf16 operands
    tp = -(-t // chunk_size) * chunk_size

    def pad_tok(x, d):
        return jnp.pad(x, ((0, 0), (0, tp - t), (0, 0), (0, d - x.shape[-1])))

    def pad_gate(x):
        return jnp.pad(x.astype(F32), ((0, 0), (0, tp - t), (0, 0)))

    if initial_state is None:
        s0 = m0 = jnp.zeros((b, h, kp, vp), F32)
    else:
        init = jnp.pad(initial_state.astype(F32), ((0, 0),) * 3 + ((0, kp - kdim), (0, vp - vdim)))
        s0, m0 = init[0], init[1]
    args = (
        pad_tok(q, kp), pad_tok(k, kp), pad_tok(v, vp), pad_tok(p, kp),
        pad_gate(log_alpha), pad_gate(log_mu), pad_gate(beta), pad_gate(eta), s0, m0,
    )  # fmt: skip
    args = like_varying(args, args)
    settings = _Settings(
        chunk=chunk_size,
        scale=float(scale),
        precision=precision,
        inverse=inverse_fn(config.inverse, f32_grade),
        config=config,
    )
    o, s_end, m_end = _mdn_core(args, settings)
    o = o[:, :t, :, :vdim]
    if not output_final_state:
        return o, None
    return o, jnp.stack([s_end, m_end])[:, :, :, :kdim, :vdim]
