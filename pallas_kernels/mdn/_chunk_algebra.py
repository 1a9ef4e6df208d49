"""The in-chunk algebra of the momentum delta rule's Pallas path (arXiv 2605.05838).

Pure functions on float32 [C, *] tiles, run inside the Pallas kernels (``prep.py``,
``prep_bwd.py``): the preparation ``chunk_prep`` and its hand-written reverse
``chunk_prep_bwd``. ``prep_xla`` gives the same outputs from the one XLA chunk preparation
(``mdn.chunk.chunk_prepare``), differentiably: ``backward="xla"`` takes its ``jax.vjp``.

Equations, as numbered in ``mdn.reference`` (recurrence (1)-(4)) and ``mdn.chunk`` (chunk form):
inside a chunk of length C with entering states ``(S_0, M_0)``, ``A_t = prod_{s<=t} alpha_s``,
``U_t = prod_{s<=t} mu_s``, ``Kt = diag(eta) K`` and the masked decay matrices
``D1[t, i] = A_t / A_i`` (i <= t), ``D2[i, j] = U_i / U_j`` (j <= i)::

    gamma = D1 diag(beta) D2                                             (5)
    b     = D1 (beta * U)                                                (6)
    S_C   = A_C S_0 - b_C M_0 + sum_j gamma_{C,j} kt_j vt_j^T            (7) at t = C
    M_C   = U_C M_0 - sum_j (U_C / U_j) kt_j vt_j^T                      (8) at t = C
    (I + L) Vt = V - diag(A_{t-1}) P S_0 + diag(b_{t-1}) P M_0,
        L[t, j] = gamma_{t-1, j} (p_t . kt_j), j < t                     (9)
    O = diag(A) sQ S_0 - diag(b) sQ M_0 + (gamma * (sQ Kt^T)) Vt         (10)
    Vt = Uv - Y S_0 + Z M_0,  [Uv, Y, Z] = (I + L)^{-1} [V, diag(A_{t-1}) P, diag(b_{t-1}) P]  (11)

Names (``ChunkPrep``, shared with ``mdn.chunk``): ``uv, y, z`` of (11); ``kgs = gamma_{C,:} Kt``
and ``kgm = (U_C / U_:) Kt``, the key products of (7) and (8) at t = C; ``qa = diag(A) sQ``,
``qb = diag(b) sQ`` and ``attn = gamma * (sQ Kt^T)`` of (10); ``a, b, u``: ``A_t, b_t, U_t``.
Every decay factor is a product of gates in [0, 1] (no exponent is positive), so nothing
overflows and ``beta = 0`` is exact.

The unit-lower-triangular inverse of (9) has one XLA form, ``_common.unit_lower_inverse``
(recursive block inversion by batched matmuls; ``mdn.chunk``, ``gated_delta.chunk`` and the
mirror ``prep_xla`` use it), and two in-kernel forms, because a kernel sees one [C, C] tile and
Triton lowers neither XLA's slicing nor its triangular solve there: forward substitution (the
default; masked selects and reductions) and the Neumann product (matmuls only, for the tensor
cores; a ``MDNKernelConfig.inverse`` option).
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

from jaxlib_ext.pallas_kernels.mdn.chunk import chunk_prepare

F32 = jnp.float32


def dot_dtype(precision):
    """Operand dtype of the in-kernel dots (see ``matmul``); intermediates that only feed dots are
    stored in it, which halves their HBM traffic on the bfloat16 path at no cost in accuracy."""
    return jnp.bfloat16 if precision == lax.Precision.DEFAULT else F32


def matmul(a, b, *, ta=False, tb=False, precision=None):
    """Matrix product over the last two axes (leading axes batched), float32 accumulation.

    ``Precision.DEFAULT`` (the bfloat16-input path) rounds both operands to bfloat16 first, so
    the tensor cores run bf16 MMAs with float32 accumulation and the operands take half the
    shared memory of TF32 ones; any other precision (float32 inputs) keeps float32 operands.
    This is what fla's Triton kernels do for bf16 (states and the triangular inverse cast to
    the input dtype before ``tl.dot``); it stays within the 1e-2 bfloat16 tolerance against the
    float32 recurrence and halves the operands' shared memory.
    """
    ca = a.ndim - 2 if ta else a.ndim - 1
    cb = b.ndim - 1 if tb else b.ndim - 2
    batch = tuple(range(a.ndim - 2))
    dot = dot_dtype(precision)
    a, b = a.astype(dot), b.astype(dot)
    return lax.dot_general(
        a, b, (((ca,), (cb,)), (batch, batch)), precision=precision, preferred_element_type=F32
    )


# --------------------------------------------------------------------------------------------
# Chunk math shared by the kernel body (2-D tiles) and the XLA mirror (leading batch axes).
# --------------------------------------------------------------------------------------------


def _identity(c):
    """The float32 [c, c] identity from iotas (lowers in Triton kernels and in XLA)."""
    rows = lax.broadcasted_iota(jnp.int32, (c, c), 0)
    return jnp.where(rows == lax.broadcasted_iota(jnp.int32, (c, c), 1), 1.0, 0.0).astype(F32)


def _inverse_forward_substitution(lmat):
    """(I + L)^{-1} for strictly lower L [C, C] by forward substitution, row by row.

    Row r of the inverse is ``e_r - L[r, :] @ T`` where only rows < r of T are used (L is
    strictly lower). Only masked selects and reductions: lowers to Triton and to XLA.
    """
    c = lmat.shape[-1]
    rows = lax.broadcasted_iota(jnp.int32, (c, c), 0)
    eye = _identity(c)

    def body(r, tinv):
        lrow = jnp.sum(jnp.where(rows == r, lmat, 0.0), axis=0)  # L[r, :]
        acc = jnp.sum(lrow[:, None] * tinv, axis=0)  # sum_j L[r, j] T[j, :]
        return jnp.where(rows == r, eye - acc[None, :], tinv)

    return lax.fori_loop(1, c, body, eye)


def _inverse_neumann(lmat, precision=None):
    """(I + L)^{-1} for strictly lower L [C, C], C a power of two, by matmuls only.

    L is nilpotent (L^C = 0), so the Neumann series is finite and factors as
    ``sum_{n<C} (-L)^n = (I - L)(I + L^2)(I + L^4) ... (I + L^{C/2})``: log2(C) - 1 squarings
    and as many products, (2 log2(C) - 2) C^3 multiply-adds on the tensor cores, where forward
    substitution makes C - 1 dependent row updates, each two cross-thread reductions.
    ``precision`` should be float32-grade (3xTF32 compiled, HIGHEST interpreted): the powers
    of L are not rounded to bfloat16 on the bfloat16 path.
    """
    c = lmat.shape[-1]
    if c & (c - 1):
        raise ValueError(f"_inverse_neumann: C must be a power of two, got {c}")
    power = -lmat  # (-L)^(2^j)
    inv = _identity(c) + power  # I - L
    for _ in range(c.bit_length() - 2):  # static: log2(C) - 1 more factors
        power = matmul(power, power, precision=precision)
        inv = inv + matmul(inv, power, precision=precision)  # inv (I + power)
    return inv


def inverse_fn(name, precision):
    """The in-kernel ``inverse(lmat)`` for ``MDNKernelConfig.inverse``."""
    if name == "neumann":
        return functools.partial(_inverse_neumann, precision=precision)
    return _inverse_forward_substitution


def _masked_decay(row_log, col_log, mask):
    """exp(row_log[t] - col_log[i]) where mask, else 0; the exponent is clamped first so the
    masked-out (positive, possibly huge) entries never overflow and carry no gradient."""
    d = row_log[..., :, None] - col_log[..., None, :]
    return jnp.where(mask, jnp.exp(jnp.where(mask, d, 0.0)), 0.0)


class _Parts(NamedTuple):
    """Forward intermediates of one chunk (recomputed by the backward kernel; its decay
    tiles are not kept: the reverse recomputes them where it needs them, ``_DecayTiles``)."""

    incl: jax.Array
    last: jax.Array
    gam: jax.Array
    gam_prev: jax.Array
    u_vec: jax.Array
    bu: jax.Array
    a_vec: jax.Array
    a_prev: jax.Array
    b_vec: jax.Array
    b_prev: jax.Array
    kt: jax.Array
    kp_mat: jax.Array
    tinv: jax.Array
    sq: jax.Array
    qk: jax.Array
    g_last: jax.Array
    u_last: jax.Array


class _Decays(NamedTuple):
    """Masks, cumulative log-gates and the two masked decay matrices of a chunk."""

    incl: jax.Array  # i <= t
    strict: jax.Array  # i < t
    last: jax.Array  # row t = C
    log_a: jax.Array  # log A_t
    log_u: jax.Array  # log U_t
    log_a_prev: jax.Array  # log A_{t-1}
    d1: jax.Array  # A_t / A_i, i <= t
    d2: jax.Array  # U_i / U_j, j <= i


def _chunk_decays(la, lm):
    c = la.shape[-1]
    t_idx = lax.broadcasted_iota(jnp.int32, (c, c), 0)
    i_idx = lax.broadcasted_iota(jnp.int32, (c, c), 1)
    incl = t_idx >= i_idx

    def cumsum(x):  # inclusive prefix sum along the chunk as a masked reduction
        return jnp.sum(jnp.where(incl, x[..., None, :], 0.0), axis=-1)

    log_a = cumsum(la)
    log_u = cumsum(lm)
    return _Decays(
        incl=incl,
        strict=t_idx > i_idx,
        last=t_idx == c - 1,
        log_a=log_a,
        log_u=log_u,
        log_a_prev=log_a - la,
        d1=_masked_decay(log_a, log_a, incl),
        d2=_masked_decay(log_u, log_u, incl),
    )


class _DecayTiles(NamedTuple):
    """The four [C, C] decay tiles that (5) and (6) multiply."""

    d1: jax.Array  # A_t / A_i, i <= t
    d1p: jax.Array  # A_{t-1} / A_i, i < t
    d2: jax.Array  # U_i / U_j, j <= i
    bd2: jax.Array  # beta_i U_i / U_j


def _decay_tiles(dec, beta):
    d1p = _masked_decay(dec.log_a_prev, dec.log_a, dec.strict)
    return _DecayTiles(d1=dec.d1, d1p=d1p, d2=dec.d2, bd2=beta[..., :, None] * dec.d2)


def chunk_decay_tiles(la, lm, beta):
    """``_DecayTiles`` from the chunk's log-gates and beta alone (elementwise work, no dot)."""
    return _decay_tiles(_chunk_decays(la, lm), beta)


def chunk_parts(q, k, p, la, lm, beta, eta, *, scale, precision, inverse):
    """Gate products (5), (6), the triangular inverse of (9) and the dot products of a chunk."""
    dec = _chunk_decays(la, lm)
    d1, d1p, d2, bd2 = _decay_tiles(dec, beta)
    gam = matmul(d1, bd2, precision=precision)  # (5) gamma_{t,j}
    gam_prev = matmul(d1p, bd2, precision=precision)  # gamma_{t-1,j}
    u_vec = jnp.exp(dec.log_u)
    bu = beta * u_vec
    b_vec = jnp.sum(d1 * bu[..., None, :], axis=-1)  # (6) b_t
    b_prev = jnp.sum(d1p * bu[..., None, :], axis=-1)  # b_{t-1}
    kt = eta[..., :, None] * k
    kp_mat = matmul(p, kt, tb=True, precision=precision)
    tinv = inverse(gam_prev * kp_mat)  # (9): L strictly lower
    sq = scale * q
    qk = matmul(sq, kt, tb=True, precision=precision)
    return _Parts(
        incl=dec.incl,
        last=dec.last,
        gam=gam,
        gam_prev=gam_prev,
        u_vec=u_vec,
        bu=bu,
        a_vec=jnp.exp(dec.log_a),
        a_prev=jnp.exp(dec.log_a_prev),
        b_vec=b_vec,
        b_prev=b_prev,
        kt=kt,
        kp_mat=kp_mat,
        tinv=tinv,
        sq=sq,
        qk=qk,
        g_last=jnp.sum(jnp.where(dec.last, gam, 0.0), axis=-2),  # gamma_{C,j}
        u_last=jnp.sum(jnp.where(dec.last, d2, 0.0), axis=-2),  # U_C / U_j
    )


class _Coefficients(NamedTuple):
    """The per-chunk factors that multiply the state-side cotangents (a subset of ``_Parts``,
    with the same names, so ``reduce_sums`` takes either)."""

    a_vec: jax.Array
    b_vec: jax.Array
    sq: jax.Array
    kt: jax.Array
    g_last: jax.Array
    u_last: jax.Array


def chunk_coefficients(q, k, la, lm, beta, eta, *, scale):
    """``_Coefficients`` without the triangular inverse or any dot: gamma_{C,j} of (5) as
    sum_i (A_C / A_i) beta_i (U_i / U_j), a masked column reduction."""
    dec = _chunk_decays(la, lm)
    bu = beta * jnp.exp(dec.log_u)
    d1_last = jnp.sum(jnp.where(dec.last, dec.d1, 0.0), axis=-2)  # A_C / A_i
    return _Coefficients(
        a_vec=jnp.exp(dec.log_a),
        b_vec=jnp.sum(dec.d1 * bu[..., None, :], axis=-1),  # (6)
        sq=scale * q,
        kt=eta[..., :, None] * k,
        g_last=jnp.sum((d1_last * beta)[..., :, None] * dec.d2, axis=-2),  # (5) at t = C
        u_last=jnp.sum(jnp.where(dec.last, dec.d2, 0.0), axis=-2),  # U_C / U_j
    )


class ChunkPrep(NamedTuple):
    """Per-chunk outputs of the preparation (module docstring): [..., C, V] ``uv``;
    [..., C, K] ``y, z, kgs, kgm, qa, qb``; [..., C, C] ``attn``; [..., C] ``a, b, u``
    (``A_t, b_t, U_t``; the state recurrence uses their last entry)."""

    uv: jax.Array
    y: jax.Array
    z: jax.Array
    kgs: jax.Array
    kgm: jax.Array
    qa: jax.Array
    qb: jax.Array
    attn: jax.Array
    a: jax.Array
    b: jax.Array
    u: jax.Array


def chunk_prep(q, k, v, p, la, lm, beta, eta, *, scale, precision, inverse):
    """Per-chunk quantities of equations (5), (6), (9), (10), (11).

    Shapes: q, k, p [..., C, K]; v [..., C, V]; gates [..., C]; all float32.
    Returns (uv, y, z, kgs, kgm, qa, qb, attn, avec, bvec, uvec):
      uv [..., C, V]; y, z, kgs, kgm, qa, qb [..., C, K]; attn [..., C, C];
      avec = A_t, bvec = b_t, uvec = U_t [..., C] (the recurrence uses their last entry).
    """
    f = chunk_parts(q, k, p, la, lm, beta, eta, scale=scale, precision=precision, inverse=inverse)
    uv = matmul(f.tinv, v, precision=precision)  # (11)
    y = matmul(f.tinv, f.a_prev[..., :, None] * p, precision=precision)
    z = matmul(f.tinv, f.b_prev[..., :, None] * p, precision=precision)
    attn = f.gam * f.qk  # (10), intra-chunk part
    qa = f.a_vec[..., :, None] * f.sq
    qb = f.b_vec[..., :, None] * f.sq
    kgs = f.g_last[..., :, None] * f.kt  # (7) at t = C
    kgm = f.u_last[..., :, None] * f.kt  # (8) at t = C
    return ChunkPrep(uv, y, z, kgs, kgm, qa, qb, attn, f.a_vec, f.b_vec, f.u_vec)


GRAD_NAMES = ("dq", "dk", "dp", "dla", "dlm", "dbeta", "deta")  # what chunk_prep_bwd emits


class Reduced(NamedTuple):
    """Cotangents of ``chunk_prep``'s outputs, already contracted with the forward parts
    they multiply, so the V axis is gone (``reduce_sums`` forms them from ``VSums``).

    dsq: from qa, qb (a_t dqa + b_t dqb); davec, dbvec, duvec: the gate vectors (incl. qa, qb);
    dattn; dtinv_v = duv v^T; dy, dz; dkt: from kgs, kgm; dg_last, du_last."""

    dsq: jax.Array
    davec: jax.Array
    dbvec: jax.Array
    duvec: jax.Array
    dattn: jax.Array
    dtinv_v: jax.Array
    dy: jax.Array
    dz: jax.Array
    dkt: jax.Array
    dg_last: jax.Array
    du_last: jax.Array


class VSums(NamedTuple):
    """One chunk's state-side products, summed over V. With S, M the states entering the chunk
    and dS, dM the cotangents of the chunk-end states ([K, V]), dO and dVt the cotangents of
    the output and of the pseudo-values ([C, V]):

    qs = dO S^T, qm = dO M^T, ks = Vt dS^T, km = Vt dM^T, ys = dVt S^T, ym = dVt M^T  [C, K]
    attn = dO Vt^T, tv = dVt V^T  [C, C];  ss = <S, dS>, ms = <M, dS>, mm = <M, dM>  scalars

    Each is a bare sum of dots, so a kernel accumulating them over V-blocks keeps every sum in
    its MMA accumulator (``acc + dot`` is one instruction) and does no per-block elementwise
    work; ``reduce_sums`` applies the chunk's coefficients once, after the sum."""

    qs: jax.Array
    qm: jax.Array
    ks: jax.Array
    km: jax.Array
    ys: jax.Array
    ym: jax.Array
    attn: jax.Array
    tv: jax.Array
    ss: jax.Array
    ms: jax.Array
    mm: jax.Array


def reduce_sums(f, s):
    """``VSums`` -> ``Reduced``: the cotangents of ``chunk_prep``'s outputs (qa, qb through
    the state terms of (10), kgs, kgm through (7), (8) at t = C, Y, Z and Uv through (11),
    attn), contracted with the forward parts ``f`` (``_Parts`` or ``_Coefficients``) they
    multiply. The chunk-end state terms enter the gate vectors at t = C."""
    row = lambda x: jnp.sum(x, axis=-1)
    is_last = jnp.arange(f.kt.shape[-2]) == f.kt.shape[-2] - 1
    at_last = lambda x: jnp.where(is_last, x[..., None], 0.0)
    return Reduced(
        dsq=f.a_vec[..., :, None] * s.qs - f.b_vec[..., :, None] * s.qm,
        davec=row(s.qs * f.sq) + at_last(s.ss),
        dbvec=-row(s.qm * f.sq) - at_last(s.ms),
        duvec=at_last(s.mm),
        dattn=s.attn,
        dtinv_v=s.tv,
        dy=-s.ys,
        dz=s.ym,
        dkt=f.g_last[..., :, None] * s.ks - f.u_last[..., :, None] * s.km,
        dg_last=row(s.ks * f.kt),
        du_last=-row(s.km * f.kt),
    )


def chunk_prep_bwd(f, r, load_k, load_p, load_decays, beta, eta, *, scale, precision, emit):
    """Reverse mode of ``chunk_prep`` by hand (chain rule through (5), (6), (9)-(11)).

    ``emit(name, value)`` receives each gradient of ``GRAD_NAMES`` as soon as it is final, so
    a kernel stores it there and its registers are free for the rest (dv = T^T duv is formed
    by the caller). ``load_k()`` gives the chunk's keys, needed only for deta, and
    ``load_p()`` the chunk's p, needed for dy, dz and the key gradient through P Kt^T: loading
    them again where they are used keeps them out of registers in between; likewise
    ``load_decays()`` gives the chunk's ``_DecayTiles``, needed only at the end (the reverse
    of (5) and (6)), so four [C, C] tiles are recomputed there instead of held through the
    middle.
    """
    mm = functools.partial(matmul, precision=precision)
    row = lambda x: jnp.sum(x, axis=-1)
    col = lambda x: jnp.sum(x, axis=-2)
    # kgs, kgm, attn
    dgam = jnp.where(f.last, r.dg_last[..., None, :], 0.0) + r.dattn * f.qk
    dd2 = jnp.where(f.last, r.du_last[..., None, :], 0.0)
    dqk = r.dattn * f.gam
    emit("dq", scale * (r.dsq + mm(dqk, f.kt)))
    dkt = r.dkt + mm(dqk, f.sq, ta=True)
    # y = T diag(A_{t-1}) P, z = T diag(b_{t-1}) P, uv = T V
    p = load_p()
    ap_p = f.a_prev[..., :, None] * p
    bp_p = f.b_prev[..., :, None] * p
    dtinv = r.dtinv_v + mm(r.dy, ap_p, tb=True) + mm(r.dz, bp_p, tb=True)
    dap_p = mm(f.tinv, r.dy, ta=True)
    dbp_p = mm(f.tinv, r.dz, ta=True)
    dp = f.a_prev[..., :, None] * dap_p + f.b_prev[..., :, None] * dbp_p
    da_prev = row(dap_p * p)
    db_prev = row(dbp_p * p)
    # T = (I + L)^{-1}: dL = -T^T dT T^T; L = gamma_prev * (P Kt^T)
    dl = -mm(mm(f.tinv, dtinv, ta=True), f.tinv, tb=True)
    dgam_prev = dl * f.kp_mat
    dkp = dl * f.gam_prev
    emit("dp", dp + mm(dkp, f.kt))
    dkt = dkt + mm(dkp, load_p(), ta=True)
    emit("dk", eta[..., :, None] * dkt)
    emit("deta", row(dkt * load_k()))
    # gamma = D1 diag(beta) D2, gamma_prev = D1p diag(beta) D2, b = D1 bu, b_prev = D1p bu
    d1, d1p, d2, bd2 = load_decays()
    dd1 = mm(dgam, bd2, tb=True) + r.dbvec[..., :, None] * f.bu[..., None, :]
    dd1p = mm(dgam_prev, bd2, tb=True) + db_prev[..., :, None] * f.bu[..., None, :]
    dbd2 = mm(d1, dgam, ta=True) + mm(d1p, dgam_prev, ta=True)
    dbu = col(d1 * r.dbvec[..., :, None]) + col(d1p * db_prev[..., :, None])
    dbeta = row(dbd2 * d2) + dbu * f.u_vec
    dd2 = dd2 + beta[..., :, None] * dbd2
    dlog_u = (r.duvec + dbu * beta) * f.u_vec
    dlog_a = r.davec * f.a_vec
    dlog_a_prev = da_prev * f.a_prev
    x = dd1 * d1
    dlog_a = dlog_a + row(x) - col(x)
    x = dd1p * d1p
    dlog_a_prev = dlog_a_prev + row(x)
    dlog_a = dlog_a - col(x)
    x = dd2 * d2
    dlog_u = dlog_u + row(x) - col(x)

    def rcumsum(x):  # sum_{t >= s} x_t, the transpose of the prefix sum
        return col(jnp.where(f.incl, x[..., :, None], 0.0))

    emit("dbeta", dbeta)
    emit("dla", rcumsum(dlog_a + dlog_a_prev) - dlog_a_prev)
    emit("dlm", rcumsum(dlog_u))


def prep_xla(q, k, v, p, la, lm, beta, eta, *, chunk, scale, precision):
    """The preparation kernel's outputs (``prep.py``) computed by XLA on [B, Tp, H, ...] arrays,
    differentiably: ``mdn.chunk.chunk_prepare`` (the one XLA chunk preparation) in float32,
    arranged as ``ChunkPrep``. Its matmuls run at float32 grade, so on the bfloat16 path it is
    the more precise of the two."""
    b, tp, h, _ = q.shape
    n = tp // chunk

    def to_chunks(x):  # [B, Tp, H, ...] -> [B, N, H, C, ...]
        x = x.astype(F32).reshape((b, n, chunk, h) + x.shape[3:])
        return jnp.moveaxis(x, 2, 3)

    def from_chunks(x):  # [B, N, H, C, ...] -> [B, Tp, H, ...]
        x = jnp.moveaxis(x, 3, 2)
        return x.reshape((b, tp, h) + x.shape[4:])

    q, k, v, p, la, lm, beta, eta = (to_chunks(x) for x in (q, k, v, p, la, lm, beta, eta))
    if precision == lax.Precision.DEFAULT:  # the bfloat16 path's dots; the mirror stays float32
        precision = lax.Precision.HIGHEST
    x = chunk_prepare(
        scale * q, eta[..., None] * k, v, p, la, lm, beta, precision=precision
    )
    qa = x["a"][..., None] * x["qs"]
    qb = x["b"][..., None] * x["qs"]
    outs = ChunkPrep(
        x["uv"], x["y"], x["z"], x["kgs"], x["kgm"], qa, qb, x["attn"], x["a"], x["b"], x["u"]
    )
    return ChunkPrep(*(from_chunks(y) for y in outs))
