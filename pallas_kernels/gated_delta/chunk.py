"""Gated delta rule, chunkwise-parallel form (pure JAX).

Gated DeltaNet (arXiv 2412.06464), the WY/UT chunk form in the notation of ``mdn.chunk`` (whose
momentum form it is at ``mu = 0``). Inside a chunk of length ``C``
with entering state ``S_0``, ``A_t = prod_{s<=t} alpha_s`` and pseudo-values
``v~_t = v_t - alpha_t S_{t-1}^T k_t``, unrolling eqs. (1)-(2) of the reference gives::

    S_t = A_t S_0 + sum_{j<=t} (A_t / A_j) beta_j k_j v~_j^T                          (4)
    o_t = A_t (s q_t)^T S_0 + sum_{j<=t} (A_t / A_j) beta_j (s q_t . k_j) v~_j        (5)
    (I + L) V~ = V - diag(A) K S_0,   L_{t,j} = (A_t / A_j) beta_j (k_t . k_j), j < t   (6)

With ``[uv, y] = (I + L)^{-1} [V, diag(A) K]`` for all chunks at once (the inverse by
matmul-only block inversion, :func:`~jaxlib_ext.pallas_kernels._common.unit_lower_inverse`), the
sequential part is ``V~ = uv - y S_0`` and eqs. (4)-(5), a ``lax.scan`` over chunks with a
``jax.checkpoint``-ed body (one state kept per chunk for the backward pass). ``A_t / A_j`` comes
from log-space segment sums of ``g = log alpha``
(:func:`~jaxlib_ext.pallas_kernels._common.segsum`), so every decay factor is in ``[0, 1]``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxlib_ext.pallas_kernels._common import (
    chunk_inputs,
    compute_dtype,
    from_chunks,
    like_varying,
    resolve_scale,
    segsum,
    unit_lower_inverse,
)


def _prepare(qs, k, v, g, beta):
    G = jnp.exp(segsum(g))  # A_t / A_j, j <= t
    A = jnp.exp(jnp.cumsum(g, axis=-1))
    Gb = G * beta[..., None, :]  # (A_t / A_j) beta_j
    kk = jnp.einsum("...tk,...jk->...tj", k, k)
    L = jnp.tril(Gb * kk, -1)  # (6)
    rhs = jnp.concatenate([v, A[..., None] * k], axis=-1)
    sol = unit_lower_inverse(L) @ rhs  # [uv, y] of (6)
    Vdim = v.shape[-1]
    return dict(
        uv=sol[..., :Vdim],
        y=sol[..., Vdim:],
        qs=qs,
        a=A,
        attn=jnp.einsum("...tk,...jk->...tj", qs, k) * Gb,  # (5), Gb is lower triangular
        kgs=Gb[..., -1, :, None] * k,  # (4) at t = C
        a_end=A[..., -1],
    )


def _chunk_step(S, x):
    Vt = x["uv"] - jnp.einsum("bhck,bhkv->bhcv", x["y"], S)
    o = x["a"][..., None] * jnp.einsum("bhck,bhkv->bhcv", x["qs"], S) + jnp.einsum(
        "bhcj,bhjv->bhcv", x["attn"], Vt
    )  # (5)
    S = x["a_end"][..., None, None] * S + jnp.einsum("bhck,bhcv->bhkv", x["kgs"], Vt)  # (4)
    return S, o


def gated_delta_rule_chunk(
    q, k, v, g, beta, *, scale=None, initial_state=None, output_final_state=False, chunk_size=64
):
    """Chunkwise gated delta rule; same contract as ``gated_delta_rule_recurrent``.

    ``T`` is zero-padded to a multiple of ``chunk_size``; a padded step (``g = 0``, ``beta = 0``,
    zero vectors) leaves the state unchanged. No validation (the public op does it).

    Args:
      q, k: ``[B, T, H, K]`` queries and keys.
      v: ``[B, T, H, V]`` values.
      g: ``[B, T, H]`` log decay ``log alpha``.
      beta: ``[B, T, H]`` write strengths.
      scale: query scale; ``None`` means ``K ** -0.5``.
      initial_state: ``[B, H, K, V]`` or ``None`` for zeros.
      output_final_state: also return ``S_T`` (``[B, H, K, V]``).
      chunk_size: chunk length, a positive int.

    Returns:
      ``(o, final_state)``: ``o`` ``[B, T, H, V]`` in ``q.dtype``; ``final_state`` float32
      (float64 when any input is float64) or ``None``.
    """
    dt = compute_dtype(q, k, v, g, beta, initial_state)
    B, T, H, K = q.shape
    V = v.shape[-1]
    C = int(chunk_size)
    scale = resolve_scale(scale, K)
    qc, kc, vc, gc, bc = chunk_inputs(dt, C, q, k, v, g, beta)
    x = _prepare(qc * jnp.asarray(scale, dt), kc, vc, gc, bc)
    S0 = jnp.zeros((B, H, K, V), dt) if initial_state is None else initial_state.astype(dt)
    S0 = like_varying(S0, x)  # the scan body's type under shard_map
    S, o = jax.lax.scan(jax.checkpoint(_chunk_step), S0, x)
    o = from_chunks(o, T)
    return o.astype(q.dtype), (S if output_final_state else None)
