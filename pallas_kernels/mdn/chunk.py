"""Momentum delta rule, chunkwise-parallel form (pure JAX).

Momentum DeltaNet, Huang et al., arXiv 2605.05838; notes ``shared/papers/models.md`` §1.2
("geometric reordering of the update coefficients"). Inside a chunk of length ``C`` with entering
states ``S_0, M_0``, chunk-local cumulative gates ``A_t = prod_{s<=t} alpha_s``,
``U_t = prod_{s<=t} mu_s``, ``c_i = beta_i U_i / A_i``, ``Gamma_t = sum_{i<=t} c_i``,
``k~_j = eta_j k_j`` and pseudo-values ``v~_j = v_j - S_{j-1}^T p_j``, unrolling the recurrence
and swapping the double sum gives::

    gamma_{t,j} = (A_t / U_j) (Gamma_t - Gamma_{j-1})                      (j <= t)   (5)
    b_t         = A_t Gamma_t                                                         (6)
    S_t = A_t S_0 - b_t M_0 + sum_{j<=t} gamma_{t,j} k~_j v~_j^T                       (7)
    M_t = U_t M_0 - sum_{j<=t} (U_t / U_j) k~_j v~_j^T                                (8)
    o_t = A_t (s q_t)^T S_0 - b_t (s q_t)^T M_0 + sum_{j<=t} gamma_{t,j} (s q_t . k~_j) v~_j   (9)

and the pseudo-values solve a unit-lower-triangular system (the UT/WY step)::

    (I + L) V~ = V - diag(A_{t-1}) P S_0 + diag(b_{t-1}) P M_0,
    L_{t,j} = gamma_{t-1,j} (p_t . k~_j)   (j < t)                                     (10)

so with ``X = (I + L)^{-1} [V, diag(A_{t-1}) P, diag(b_{t-1}) P] = [U, Y, Z]`` (computed for all
chunks at once; ``(I + L)^{-1}`` by recursive block inversion with matmuls only,
:func:`~jaxlib_ext.pallas_kernels._common.unit_lower_inverse`, rather than ``triangular_solve``,
whose batched CPU lowering is very slow for wide right-hand sides) the sequential part is only
``V~ = U - Y S_0 + Z M_0`` and eqs. (7)-(9), a ``lax.scan`` over chunks carrying ``(S, M)``.
The scan body is wrapped in ``jax.checkpoint`` so the backward pass keeps one ``(S, M)`` pair per
chunk (memory grows with ``T / C`` states, not ``T``) and recomputes the chunk's internals.

Numerical choice (the ``beta = 0`` epsilon of the notes). Written as (5), ``gamma`` needs
``log Gamma`` by a log-cumsum-exp of ``log c_i = log beta_i + log U_i - log A_i``, which is
``-inf`` at ``beta = 0`` (the PyTorch reference adds ``1e-6`` to ``beta``, so its chunk form is
not exact) and loses all precision when ``mu`` decays faster than ``alpha`` (``Gamma_t -
Gamma_{j-1}`` is then a tiny difference of huge numbers, multiplied by ``1 / U_j``). We use the
same geometric reordering but keep the reordered inner sum factored::

    gamma_{t,j} = sum_{i=j}^{t} (A_t / A_i) beta_i (U_i / U_j) = [G_A diag(beta) G_U]_{t,j}
    b_t         = sum_{i<=t} (A_t / A_i) beta_i U_i            = [G_A (beta * U)]_t

where ``G_A[t,i] = A_t / A_i`` and ``G_U[i,j] = U_i / U_j`` (lower triangular) are built from
log-space segment sums of ``log alpha`` and ``log mu``
(:func:`~jaxlib_ext.pallas_kernels._common.segsum`).
Every entry is a non-negative product of gates in ``[0, 1]``: no epsilon, no cancellation,
``beta = 0`` and ``mu = 0`` (``log_mu = -inf``) are exact, and float64 chunk and recurrent
outputs agree to rounding (about 3e-16 relative in our tests). The price is one extra
``C x C x C`` matmul per chunk and head. Segment sums are built by masked cumulative sums, not by
differences of prefix sums, so they carry no ``|sum of log-gates| * eps`` cancellation either.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxlib_ext.pallas_kernels._common import (
    chunk_inputs,
    compute_dtype,
    from_chunks,
    resolve_scale,
    segsum,
    unit_lower_inverse,
)


def _prepare(qs, kt, v, p, la, lm, beta):
    """Everything that does not depend on the entering states, for all chunks at once.

    Shapes: ``qs, kt, p`` ``[..., C, K]``; ``v`` ``[..., C, V]``; ``la, lm, beta`` ``[..., C]``.
    """
    G_A = jnp.exp(segsum(la))  # A_t / A_i for i <= t
    G_U = jnp.exp(segsum(lm))  # U_i / U_j for j <= i
    gamma = jnp.einsum("...ti,...ij->...tj", G_A, beta[..., :, None] * G_U)  # (5)
    logA = jnp.cumsum(la, axis=-1)
    A = jnp.exp(logA)
    U = jnp.exp(jnp.cumsum(lm, axis=-1))
    b = jnp.einsum("...ti,...i->...t", G_A, beta * U)  # (6)

    # Shift by one step for the pseudo-value system (10): A_0 = 1, b_0 = 0, gamma_{0,.} = 0.
    zero = jnp.zeros_like(la[..., :1])
    A_prev = jnp.exp(jnp.concatenate([zero, logA[..., :-1]], axis=-1))
    b_prev = jnp.concatenate([zero, b[..., :-1]], axis=-1)
    gamma_prev = jnp.concatenate([jnp.zeros_like(gamma[..., :1, :]), gamma[..., :-1, :]], axis=-2)
    L = gamma_prev * jnp.einsum("...tk,...jk->...tj", p, kt)  # (10), strictly lower
    rhs = jnp.concatenate([v, A_prev[..., None] * p, b_prev[..., None] * p], axis=-1)
    sol = unit_lower_inverse(L) @ rhs  # [U, Y, Z] of (10)
    Vdim = v.shape[-1]
    Kdim = p.shape[-1]
    Uv = sol[..., :Vdim]
    Y = sol[..., Vdim : Vdim + Kdim]
    Z = sol[..., Vdim + Kdim :]

    Qk = jnp.einsum("...tk,...jk->...tj", qs, kt) * gamma  # intra-chunk part of (9)
    wS = gamma[..., -1, :, None] * kt  # gamma_{C,j} k~_j, for (7) at t = C
    wM = G_U[..., -1, :, None] * kt  # (U_C / U_j) k~_j, for (8) at t = C
    return dict(
        Uv=Uv,
        Y=Y,
        Z=Z,
        qs=qs,
        Qk=Qk,
        A=A,
        b=b,
        wS=wS,
        wM=wM,
        A_end=A[..., -1],
        b_end=b[..., -1],
        U_end=U[..., -1],
    )


def _chunk_step(carry, x):
    """One chunk of eqs. (7)-(9) given the precomputed chunk quantities ``x``."""
    S, M = carry  # [B, H, K, V]
    Vt = (
        x["Uv"]
        - jnp.einsum("bhck,bhkv->bhcv", x["Y"], S)
        + jnp.einsum("bhck,bhkv->bhcv", x["Z"], M)
    )
    o = (
        x["A"][..., None] * jnp.einsum("bhck,bhkv->bhcv", x["qs"], S)
        - x["b"][..., None] * jnp.einsum("bhck,bhkv->bhcv", x["qs"], M)
        + jnp.einsum("bhcj,bhjv->bhcv", x["Qk"], Vt)
    )  # (9)
    S_new = (
        x["A_end"][..., None, None] * S
        - x["b_end"][..., None, None] * M
        + jnp.einsum("bhck,bhcv->bhkv", x["wS"], Vt)
    )  # (7)
    M_new = x["U_end"][..., None, None] * M - jnp.einsum("bhck,bhcv->bhkv", x["wM"], Vt)  # (8)
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
    """Chunkwise-parallel momentum delta rule (module docstring, eqs. (5)-(10)).

    Same arguments and results as
    :func:`jaxlib_ext.pallas_kernels.mdn.reference.momentum_delta_rule_recurrent`, plus
    ``chunk_size`` (any positive int works here; the public op allows 16, 32, 64, 128). ``T`` need
    not be a multiple of ``chunk_size``: the sequence is zero-padded, and a padded step
    (``alpha = mu = 1``, ``beta = eta = 0``, zero vectors) leaves ``(S, M)`` unchanged, so the
    final state is the state at step ``T``. No validation (the public op does it).
    """
    dt = compute_dtype(q, k, v, p, log_alpha, log_mu, beta, eta, initial_state)
    B, T, H, K = q.shape
    V = v.shape[-1]
    C = int(chunk_size)
    scale = resolve_scale(scale, K)
    qc, kc, vc, pc, lac, lmc, bc, ec = chunk_inputs(
        dt, C, q, k, v, p, log_alpha, log_mu, beta, eta
    )
    x = _prepare(qc * jnp.asarray(scale, dt), kc * ec[..., None], vc, pc, lac, lmc, bc)

    if initial_state is None:
        S0 = jnp.zeros((B, H, K, V), dt)
        M0 = jnp.zeros((B, H, K, V), dt)
    else:
        S0 = initial_state[0].astype(dt)
        M0 = initial_state[1].astype(dt)

    (S, M), o = jax.lax.scan(jax.checkpoint(_chunk_step), (S0, M0), x)
    # o: [N, B, H, C, V] -> [B, N*C, H, V]
    o = from_chunks(o, T)
    final = jnp.stack([S, M]) if output_final_state else None
    return o.astype(q.dtype), final
