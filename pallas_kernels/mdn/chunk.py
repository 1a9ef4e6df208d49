"""Momentum delta rule, chunkwise-parallel form (pure JAX).

Momentum DeltaNet, Huang et al., arXiv 2605.05838: the chunk form of its recurrence, eqs.
(1)-(4) of ``mdn.reference``, with the update coefficients reordered geometrically. Inside a
chunk of length ``C`` with entering states ``S_0, M_0``, chunk-local cumulative gates
``A_t = prod_{s<=t} alpha_s``, ``U_t = prod_{s<=t} mu_s``, ``kt_j = eta_j k_j`` and
pseudo-values ``vt_j = v_j - S_{j-1}^T p_j``, unrolling the recurrence gives::

    gamma_{t,j} = sum_{i=j}^{t} (A_t / A_i) beta_i (U_i / U_j) = [D1 diag(beta) D2]_{t,j}   (5)
    b_t         = sum_{i<=t} (A_t / A_i) beta_i U_i            = [D1 (beta * U)]_t          (6)
    S_t = A_t S_0 - b_t M_0 + sum_{j<=t} gamma_{t,j} kt_j vt_j^T                           (7)
    M_t = U_t M_0 - sum_{j<=t} (U_t / U_j) kt_j vt_j^T                                     (8)

where ``D1[t,i] = A_t / A_i`` (i <= t) and ``D2[i,j] = U_i / U_j`` (j <= i), and the
pseudo-values solve a unit-lower-triangular system (the UT/WY step)::

    (I + L) Vt = V - diag(A_{t-1}) P S_0 + diag(b_{t-1}) P M_0,
    L_{t,j} = gamma_{t-1,j} (p_t . kt_j)   (j < t)                                         (9)
    o_t = A_t (s q_t)^T S_0 - b_t (s q_t)^T M_0 + sum_{j<=t} gamma_{t,j} (s q_t . kt_j) vt_j   (10)
    Vt = uv - y S_0 + z M_0,   [uv, y, z] = (I + L)^{-1} [V, diag(A_{t-1}) P, diag(b_{t-1}) P]  (11)

Everything but the entering states is computed for all chunks at once (``(I + L)^{-1}`` by
recursive block inversion with matmuls only,
:func:`~jaxlib_ext.pallas_kernels._common.unit_lower_inverse`, rather than ``triangular_solve``,
whose batched CPU lowering is slow for wide right-hand sides); the sequential part is (11),
(10) and (7), (8) at ``t = C``, a ``lax.scan`` over chunks carrying ``(S, M)``. The scan body is
wrapped in ``jax.checkpoint``, so the backward pass keeps one ``(S, M)`` pair per chunk (memory
grows with ``T / C`` states, not ``T``) and recomputes the chunk's internals. The per-chunk
quantities have the names of the Pallas path (``_chunk_algebra.ChunkPrep``): ``uv, y, z``,
``attn = gamma * (sQ Kt^T)``, ``kgs``, ``kgm`` (the key products of (7), (8) at ``t = C``) and
the chunk-end gates ``a_end, b_end, u_end``.

Numerics: ``D1`` and ``D2`` are built from log-space segment sums of ``log alpha`` and ``log mu``
(:func:`~jaxlib_ext.pallas_kernels._common.segsum`), so every entry is a product of gates in
``[0, 1]``: no epsilon, no cancellation, ``beta = 0`` and ``mu = 0`` (``log_mu = -inf``) are
exact, and float64 chunk and recurrent outputs agree to rounding. The closed form
``gamma_{t,j} = (A_t / U_j) (Gamma_t - Gamma_{j-1})`` with ``Gamma_t = sum_{i<=t} beta_i U_i /
A_i`` is not used: it is undefined at ``beta = 0`` in log space and cancels catastrophically
when ``mu`` decays faster than ``alpha``. The price is one ``C x C x C`` matmul per chunk and
head.
"""

from __future__ import annotations

import functools

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


def chunk_prepare(qs, kt, v, p, la, lm, beta, *, precision=None):
    """Everything that does not depend on the entering states, for all chunks at once.

    The one XLA chunk preparation (the Pallas path's differentiable mirror runs it too).

    Args:
      qs: ``[..., C, K]`` scaled queries ``scale q``.
      kt: ``[..., C, K]`` scaled keys ``eta k``.
      v: ``[..., C, V]`` values.
      p: ``[..., C, K]`` momentum keys.
      la: ``[..., C]`` log state decays ``log alpha``.
      lm: ``[..., C]`` log momentum decays ``log mu``.
      beta: ``[..., C]`` write strengths.
      precision: that of every matmul.

    Returns:
      A dict of the per-chunk quantities named as in the module docstring, plus ``u`` (``U_t``).
    """
    einsum = functools.partial(jnp.einsum, precision=precision)
    D1 = jnp.exp(segsum(la))  # A_t / A_i for i <= t
    D2 = jnp.exp(segsum(lm))  # U_i / U_j for j <= i
    gamma = einsum("...ti,...ij->...tj", D1, beta[..., :, None] * D2)  # (5)
    logA = jnp.cumsum(la, axis=-1)
    A = jnp.exp(logA)
    U = jnp.exp(jnp.cumsum(lm, axis=-1))
    b = einsum("...ti,...i->...t", D1, beta * U)  # (6)

    # Shift by one step for the pseudo-value system (9): A_0 = 1, b_0 = 0, gamma_{0,.} = 0.
    zero = jnp.zeros_like(la[..., :1])
    A_prev = jnp.exp(jnp.concatenate([zero, logA[..., :-1]], axis=-1))
    b_prev = jnp.concatenate([zero, b[..., :-1]], axis=-1)
    gamma_prev = jnp.concatenate([jnp.zeros_like(gamma[..., :1, :]), gamma[..., :-1, :]], axis=-2)
    L = gamma_prev * einsum("...tk,...jk->...tj", p, kt)  # (9), strictly lower
    rhs = jnp.concatenate([v, A_prev[..., None] * p, b_prev[..., None] * p], axis=-1)
    sol = jnp.matmul(unit_lower_inverse(L), rhs, precision=precision)  # [uv, y, z] of (11)
    Vdim = v.shape[-1]
    Kdim = p.shape[-1]
    return dict(
        uv=sol[..., :Vdim],
        y=sol[..., Vdim : Vdim + Kdim],
        z=sol[..., Vdim + Kdim :],
        qs=qs,
        attn=einsum("...tk,...jk->...tj", qs, kt) * gamma,  # intra-chunk part of (10)
        a=A,
        b=b,
        u=U,
        kgs=gamma[..., -1, :, None] * kt,  # gamma_{C,j} kt_j, for (7) at t = C
        kgm=D2[..., -1, :, None] * kt,  # (U_C / U_j) kt_j, for (8) at t = C
        a_end=A[..., -1],
        b_end=b[..., -1],
        u_end=U[..., -1],
    )


def _chunk_step(carry, x):
    """One chunk of eqs. (11), (10), (7), (8) given the precomputed chunk quantities ``x``."""
    S, M = carry  # [B, H, K, V]
    Vt = (
        x["uv"]
        - jnp.einsum("bhck,bhkv->bhcv", x["y"], S)
        + jnp.einsum("bhck,bhkv->bhcv", x["z"], M)
    )  # (11)
    o = (
        x["a"][..., None] * jnp.einsum("bhck,bhkv->bhcv", x["qs"], S)
        - x["b"][..., None] * jnp.einsum("bhck,bhkv->bhcv", x["qs"], M)
        + jnp.einsum("bhcj,bhjv->bhcv", x["attn"], Vt)
    )  # (10)
    S_new = (
        x["a_end"][..., None, None] * S
        - x["b_end"][..., None, None] * M
        + jnp.einsum("bhck,bhcv->bhkv", x["kgs"], Vt)
    )  # (7)
    M_new = x["u_end"][..., None, None] * M - jnp.einsum("bhck,bhcv->bhkv", x["kgm"], Vt)  # (8)
    return (S_new, M_new), o


def momentum_delta_rule_chunk(
    q,
    k,
    v,
    p,
    log_alpha,
    log_mu,
    beta,
    eta,
    *,
    scale=None,
    initial_state=None,
    output_final_state=False,
    chunk_size=64,
):
    """Chunkwise-parallel momentum delta rule (module docstring, eqs. (5)-(11)).

    Same arguments and results as
    :func:`jaxlib_ext.pallas_kernels.mdn.reference.momentum_delta_rule_recurrent`, plus
    ``chunk_size``. ``T`` need not be a multiple of ``chunk_size``: the sequence is zero-padded,
    and a padded step (``alpha = mu = 1``, ``beta = eta = 0``, zero vectors) leaves ``(S, M)``
    unchanged, so the final state is the state at step ``T``. No validation (the public op does
    it).

    Args:
      q, k, p: ``[B, T, H, K]`` queries, keys and momentum keys.
      v: ``[B, T, H, V]`` values.
      log_alpha, log_mu, beta, eta: ``[B, T, H]`` gates.
      scale: query scale; ``None`` means ``K ** -0.5``.
      initial_state: ``[2, B, H, K, V]`` holding ``(S_0, M_0)``, or ``None`` for zeros.
      output_final_state: also return ``(S_T, M_T)`` stacked as ``[2, B, H, K, V]``.
      chunk_size: chunk length; any positive int works here (the public op allows 16, 32, 64,
        128).

    Returns:
      ``(o, final_state)``: ``o`` ``[B, T, H, V]`` in ``q.dtype``; ``final_state`` in the compute
      dtype (float32, or float64 when any input is float64), or ``None``.
    """
    dt = compute_dtype(q, k, v, p, log_alpha, log_mu, beta, eta, initial_state)
    B, T, H, K = q.shape
    V = v.shape[-1]
    C = int(chunk_size)
    scale = resolve_scale(scale, K)
    qc, kc, vc, pc, lac, lmc, bc, ec = chunk_inputs(
        dt, C, q, k, v, p, log_alpha, log_mu, beta, eta
    )
    x = chunk_prepare(qc * jnp.asarray(scale, dt), kc * ec[..., None], vc, pc, lac, lmc, bc)

    if initial_state is None:
        S0 = jnp.zeros((B, H, K, V), dt)
        M0 = jnp.zeros((B, H, K, V), dt)
    else:
        S0 = initial_state[0].astype(dt)
        M0 = initial_state[1].astype(dt)
    S0, M0 = like_varying((S0, M0), x)  # the scan body's type under shard_map

    (S, M), o = jax.lax.scan(jax.checkpoint(_chunk_step), (S0, M0), x)
    # o: [N, B, H, C, V] -> [B, N*C, H, V]
    o = from_chunks(o, T)
    final = jnp.stack([S, M]) if output_final_state else None
    return o.astype(q.dtype), final
