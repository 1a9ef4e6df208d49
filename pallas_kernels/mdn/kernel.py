"""Pallas kernels for the momentum delta rule (Momentum DeltaNet, arXiv 2605.05838).

Recurrence (per batch row and head; notes ``models.md`` section 1.1)::

    w_t = S_{t-1}^T p_t - v_t                       (1)
    M_t = mu_t M_{t-1} + eta_t k_t w_t^T             (2)
    S_t = alpha_t S_{t-1} - beta_t M_t               (3)
    o_t = S_t^T (scale q_t)                          (4)

Chunkwise form (notes section 1.2). Inside a chunk of length C with entering states (S_0, M_0),
``A_t = prod_{s<=t} alpha_s``, ``U_t = prod_{s<=t} mu_s``, ``kt_j = eta_j k_j`` and
pseudo-values ``vt_j = v_j - S_{j-1}^T p_j``::

    gamma_{t,j} = sum_{i=j..t} (A_t / A_i) beta_i (U_i / U_j)          (5)
    b_t         = sum_{i<=t}   (A_t / A_i) beta_i U_i                  (6)
    S_t = A_t S_0 - b_t M_0 + sum_{j<=t} gamma_{t,j} kt_j vt_j^T       (7)
    M_t = U_t M_0 - sum_{j<=t} (U_t / U_j) kt_j vt_j^T                 (8)
    (I + L) Vt = V - diag(A_{t-1}) P S_0 + diag(b_{t-1}) P M_0,
        L_{t,j} = gamma_{t-1,j} (p_t . kt_j), j < t                    (9)
    o_t = A_t (s q_t)^T S_0 - b_t (s q_t)^T M_0
          + sum_{j<=t} gamma_{t,j} (s q_t . kt_j) vt_j                 (10)

With ``T = (I + L)^{-1}``: ``Uv = T V``, ``Y = T diag(A_{t-1}) P``, ``Z = T diag(b_{t-1}) P``,
so that ``Vt = Uv - Y S_0 + Z M_0`` (11).

Choice (differs from the notes' log-cumsum-exp form, same mathematics): (5) and (6) are
evaluated as products of two masked decay matrices, ``gamma = D1 diag(beta) D2`` with
``D1[t,i] = exp(logA_t - logA_i)`` (i <= t) and ``D2[i,j] = exp(logU_i - logU_j)`` (j <= i).
Every exponent is <= 0, so nothing overflows, ``beta = 0`` is exact (no ``+1e-6``), and the
two products run on the tensor cores.

What runs where:

* forward, all Pallas kernels: ``_prep_kernel`` (chunk-parallel: cumulative gates, (5), (6),
  the unit-lower-triangular inverse by in-kernel forward substitution, or with
  ``inverse="neumann"`` by a product of matmuls (``_inverse_neumann``), Uv, Y, Z and the output
  coefficients), ``_state_fwd_kernel`` (grid over batch, heads and V-blocks, sequential loop over
  chunks: (11), (7), (8) at t = C; stores the state entering each chunk) and ``_out_kernel``
  (chunk-parallel: (10)).
* backward (``backward="pallas"``, the default for padded K <= 128), all Pallas kernels, wired
  with ``jax.custom_vjp``: the preparation kernel is re-run (rematerialised, nothing but the
  inputs, Vt and the per-chunk states is kept from the forward), ``_state_bwd_kernel`` (grid
  over batch, heads and V-blocks, reverse loop over chunks) carries the state cotangents
  (dS, dM) backwards through (11), (7), (8) and the state terms of (10), storing dVt and the
  chunk-end state cotangents, and ``_chunk_bwd_kernel`` (chunk-parallel) recomputes a chunk's
  forward parts, contracts the state-side cotangents over V-blocks and runs the hand-written
  reverse of the preparation (``_chunk_prep_bwd``) to give dq, dk, dv, dp and the four gate
  gradients. The only XLA left is padding/slicing and the dtype casts around the kernels.
* ``backward="pallas_split"`` (the default for padded K > 128) runs the chunk-parallel part as
  two kernels: ``_chunk_bwd_v_kernel`` contracts over V-blocks with only the chunk's gate
  vectors (no triangular inverse) and writes the contracted cotangents (``_Reduced``) to HBM;
  ``_prep_bwd_kernel`` recomputes the chunk's parts, forms dv and runs the reverse of the
  preparation. Less shared memory per kernel, one extra round trip (``_default_backward``).
* ``backward="xla"`` keeps ``_state_bwd_kernel`` but does the chunk-parallel part with batched
  XLA einsums and ``jax.vjp`` of ``_prep_xla`` (the same chunk math in plain jnp, with
  ``triangular_solve`` instead of forward substitution): an independent check of the
  hand-written reverse, and a fallback.

* decode: ``decode.momentum_delta_rule_step_pallas`` is one kernel for a single token
  against the cached (S, M) (forward only).
* ``state_kernel="mosaic_gpu"`` swaps ``_state_fwd_kernel`` for its Pallas Mosaic GPU
  version (``mosaic.py``, Hopper: TMA-pipelined chunk tiles, wgmma dots), same inputs and
  outputs; every other kernel stays Triton.

Precision and storage: with bfloat16 inputs every in-kernel dot takes bfloat16 operands and
accumulates in float32 (``_mm``), and the intermediates that only feed dots (Y, Z, the chunk-end
key products, the query coefficients, the intra-chunk attention, Vt, the per-chunk states and
their cotangents) are stored in bfloat16; the running (S, M) and (dS, dM), Uv, the gates and
the final state stay float32. With float32 inputs everything is float32 and the dots run
3xTF32 when compiled (IEEE in interpret mode).

Sharding: every (batch row, head) is independent, so the forward and the backward each carry
a sharding rule (``pallas_kernels/_partition.py``, ``custom_partitioning`` with a Shardy rule):
under ``jit`` with inputs sharded over batch and heads, each device runs the kernels on its
own rows and heads with no collective; an axis sharded otherwise (sequence, K, V) is gathered
first. On a mesh with ``Explicit`` axes the same split is a ``shard_map`` read off the input
types; inside a ``shard_map`` the kernels run on the local blocks. Without the rule XLA
all-gathers every input and each device runs the kernels on the whole batch (XLA compile for
a 2 x 2 mesh of H200s, ``benchmarks/xla_aot.py``). With one device the rule is left out (no
``custom_partitioning``), so lowering against an ``AbstractMesh`` works there. ``jax.vmap``
folds the mapped axis into B (the same module's vmap rule): the kernels run once on the
larger batch.

Memory: the forward keeps Vt [B, T, H, V] and the states entering every chunk,
2 x [B, H, T/C, K, V] (bfloat16 for bfloat16 inputs), for the backward; everything else is
recomputed.

Launch parameters (warps, stages, the V-tile) come from XLA's own compile of the programs for
an H200 without a GPU (``benchmarks/xla_aot.py``: jaxlib's Triton, then ptxas): every kernel
stays under the H200's 227 KB of shared memory per block; see ``_launch._launch_params``.

Modules: this one holds the forward and backward kernels, their ``pallas_call`` wrappers, the
custom VJP and the public op; ``_chunk_algebra.py`` the in-chunk algebra the kernels run on
tiles (and its XLA mirror ``_prep_xla``); ``_launch.py`` the launch defaults and the
``pallas_call`` wrapper; ``mosaic.py`` the Mosaic GPU state kernel; ``decode.py`` the
single-token step.

Limits (as of this version): the Pallas Triton backend is deprecated from JAX 0.11 on (a
DeprecationWarning at lowering) and only the forward state recurrence has a Mosaic GPU
version so far. Checked on CPU with JAX 0.12.0.1 and 0.11.2 in interpret mode, and
compiled by XLA of both versions for an H200 (deviceless, down to SASS: every program
compiles, every kernel fits; and on a 2 x 2 mesh of H200s, sharded over batch and heads);
not yet run or timed on a GPU.

Triton constraints honoured by the wrapper (interpret mode does not enforce them): every block
dimension is a power of two and >= 16 (K and V are zero-padded to ``max(16, next_pow2)``, the
chunk size is a power of two >= 16), grids have at most three axes, dots are 2-D.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from jaxlib_ext.pallas_kernels._partition import batch_and_head_parallel, with_shardings_of
from jaxlib_ext.pallas_kernels.mdn._chunk_algebra import (
    _INVERSES,
    _chunk_coefficients,
    _chunk_decay_tiles,
    _chunk_parts,
    _chunk_prep,
    _chunk_prep_bwd,
    _dot_dtype,
    _inverse_fn,
    _mm,
    _pow2,
    _prep_xla,
    _reduce_sums,
    _Reduced,
    _VSums,
)
from jaxlib_ext.pallas_kernels.mdn._launch import (
    _check_launch,
    _default_backward,
    _default_block_v,
    _launch,
    _launch_params,
    _Run,
    _sds,
)

__all__ = ["momentum_delta_rule_pallas"]

_F32 = jnp.float32


# --------------------------------------------------------------------------------------------
# Kernels
# --------------------------------------------------------------------------------------------


def _prep_kernel(*refs, scale, precision, inverse):
    """One (batch, head, chunk) tile: equations (5), (6), (9), (10), (11). ``refs``: the eight
    inputs (q, k, v, p, log-gates, beta, eta), then the outputs of ``_chunk_prep``."""
    outs = _chunk_prep(
        *(r[...].astype(_F32) for r in refs[:8]),
        scale=scale,
        precision=precision,
        inverse=inverse,
    )
    for ref, val in zip(refs[8:], outs, strict=True):
        ref[...] = val.astype(ref.dtype)


def _last(vec_ref, sl, chunk):
    """The last entry of a chunk's slice of a [Tp] coefficient vector, as a scalar."""
    vec = vec_ref[sl].astype(_F32)
    return jnp.sum(jnp.where(jnp.arange(chunk) == chunk - 1, vec, 0.0))


def _state_fwd_kernel(
    uv_ref,
    y_ref,
    z_ref,
    kgs_ref,
    kgm_ref,
    av_ref,
    bv_ref,
    uvec_ref,
    s0_ref,
    m0_ref,
    vt_ref,
    hs_ref,
    hm_ref,
    st_ref,
    mt_ref,
    *,
    chunk,
    n_chunks,
    kp,
    precision,
):
    """One (batch, head, V-block): sequential loop over chunks carrying (S, M) [K, BV]."""

    def body(n, carry):
        s, m = carry
        sl = pl.ds(n * chunk, chunk)
        hsl = pl.ds(n * kp, kp)
        hs_ref[hsl, :] = s.astype(hs_ref.dtype)
        hm_ref[hsl, :] = m.astype(hm_ref.dtype)
        vt = (
            uv_ref[sl, :]
            - _mm(y_ref[sl, :], s, precision=precision)
            + _mm(z_ref[sl, :], m, precision=precision)
        )  # (11)
        vt_ref[sl, :] = vt.astype(vt_ref.dtype)
        a = _last(av_ref, sl, chunk)
        bb = _last(bv_ref, sl, chunk)
        u = _last(uvec_ref, sl, chunk)
        s_new = a * s - bb * m + _mm(kgs_ref[sl, :], vt, ta=True, precision=precision)  # (7)
        m_new = u * m - _mm(kgm_ref[sl, :], vt, ta=True, precision=precision)  # (8)
        return s_new, m_new

    s, m = lax.fori_loop(0, n_chunks, body, (s0_ref[...], m0_ref[...]))
    st_ref[...] = s
    mt_ref[...] = m


def _out_kernel(qa_ref, qb_ref, attn_ref, hs_ref, hm_ref, vt_ref, o_ref, *, precision):
    """One (batch, head, chunk, V-block) tile of equation (10)."""
    o = (
        _mm(qa_ref[...], hs_ref[...], precision=precision)
        - _mm(qb_ref[...], hm_ref[...], precision=precision)
        + _mm(attn_ref[...], vt_ref[...], precision=precision)
    )
    o_ref[...] = o.astype(o_ref.dtype)


def _state_bwd_kernel(
    do_ref,
    qa_ref,
    qb_ref,
    attn_ref,
    y_ref,
    z_ref,
    kgs_ref,
    kgm_ref,
    av_ref,
    bv_ref,
    uvec_ref,
    dst_ref,
    dmt_ref,
    dvt_ref,
    dhs_ref,
    dhm_ref,
    ds0_ref,
    dm0_ref,
    *,
    chunk,
    n_chunks,
    kp,
    precision,
):
    """One (batch, head, V-block): reverse loop over chunks carrying (dS, dM), the cotangents
    of the state leaving the current chunk. Transposes (11), (7), (8) and the state terms of
    (10); stores dVt and the chunk-end state cotangents for the chunk-parallel parameter
    gradients."""

    def body(i, carry):
        ds, dm = carry
        n = n_chunks - 1 - i
        sl = pl.ds(n * chunk, chunk)
        hsl = pl.ds(n * kp, kp)
        dhs_ref[hsl, :] = ds.astype(dhs_ref.dtype)
        dhm_ref[hsl, :] = dm.astype(dhm_ref.dtype)
        do = do_ref[sl, :].astype(_F32)
        dvt = (
            _mm(attn_ref[sl, :], do, ta=True, precision=precision)
            + _mm(kgs_ref[sl, :], ds, precision=precision)
            - _mm(kgm_ref[sl, :], dm, precision=precision)
        )
        dvt_ref[sl, :] = dvt.astype(dvt_ref.dtype)
        a = _last(av_ref, sl, chunk)
        bb = _last(bv_ref, sl, chunk)
        u = _last(uvec_ref, sl, chunk)
        ds_new = (
            a * ds
            - _mm(y_ref[sl, :], dvt, ta=True, precision=precision)
            + _mm(qa_ref[sl, :], do, ta=True, precision=precision)
        )
        dm_new = (
            u * dm
            - bb * ds
            + _mm(z_ref[sl, :], dvt, ta=True, precision=precision)
            - _mm(qb_ref[sl, :], do, ta=True, precision=precision)
        )
        return ds_new, dm_new

    ds, dm = lax.fori_loop(0, n_chunks, body, (dst_ref[...], dmt_ref[...]))
    ds0_ref[...] = ds
    dm0_ref[...] = dm


def _total(x):
    """Sum of a 2-D tile as two single-axis reductions (the Triton lowering's multi-axis path
    trips over sharded avals when lowering under an abstract mesh)."""
    return jnp.sum(jnp.sum(x, axis=-1), axis=-1)


# Below this chunk size the V loops apply the chunk's coefficients to each block's products
# (``_contract_over_v(..., coefficients=f)``) instead of summing bare products: at C = 32
# the bare sums spill far more (XLA's compile for an H200, jaxlib 0.11.2, B=8 T=4096 H=6
# K=128 V=256, spill traffic per thread, loops weighted by trip count, both with the register
# bound of ``_launch._max_registers``; bf16: mdn_chunk_bwd 55.7 KB against 6.0 KB,
# mdn_chunk_bwd_v 45.4 KB against 16 B; float32: 218 and 173 KB against 67 and 26 KB). At
# C = 64 (bf16) the bare sums' V loop runs 539 instructions per block against 1256 (no
# per-block scaling or cross-thread row sums) for about the same spill traffic (mdn_chunk_bwd
# 12.2 KB against 11.3 KB; mdn_chunk_bwd_v 1.7 KB against 5.1 KB).
_BARE_SUMS_MIN_CHUNK = 64


def _contract_over_v(refs, *, block_v, precision, on_block=None, coefficients=None):
    """One chunk's state-side products summed over V-blocks: ``_VSums``, or with
    ``coefficients`` (the chunk's ``_Parts`` or ``_Coefficients``) each block's products
    reduced first (``_reduce_sums`` is linear) and ``_Reduced`` accumulated.

    ``refs``: (v, do, Vt, dVt, S, M, dS, dM) refs, the states being those entering the chunk
    ([K, V]) and the cotangents those of the chunk-end states. ``on_block(sv, dvt)``, if given,
    runs once per V-block (the fused kernel writes dV = T^T dVt there)."""
    v_ref, do_ref, vt_ref, dvt_ref, hs_ref, hm_ref, dhs_ref, dhm_ref = refs
    mm = functools.partial(_mm, tb=True, precision=precision)
    c, kp = do_ref.shape[0], hs_ref.shape[0]
    zk = jnp.zeros((c, kp), _F32)
    zc = jnp.zeros((c, c), _F32)
    zv = jnp.zeros((c,), _F32)
    zs = jnp.zeros((), _F32)

    def body(j, acc):
        sv = pl.ds(j * block_v, block_v)
        do = do_ref[:, sv].astype(_F32)
        vt, dvt = vt_ref[:, sv], dvt_ref[:, sv]
        hs, hm, dhs, dhm = hs_ref[:, sv], hm_ref[:, sv], dhs_ref[:, sv], dhm_ref[:, sv]
        if on_block is not None:
            on_block(sv, dvt)
        products = dict(
            qs=mm(do, hs),
            qm=mm(do, hm),
            ks=mm(vt, dhs),
            km=mm(vt, dhm),
            ys=mm(dvt, hs),
            ym=mm(dvt, hm),
            attn=mm(do, vt),
            tv=mm(dvt, v_ref[:, sv].astype(_F32)),
            ss=_total(hs * dhs),
            ms=_total(hm * dhs),
            mm=_total(hm * dhm),
        )
        if coefficients is not None:
            products = _reduce_sums(coefficients, _VSums(**products))._asdict()
        return type(acc)(**{name: getattr(acc, name) + x for name, x in products.items()})

    if coefficients is None:
        init = _VSums(zk, zk, zk, zk, zk, zk, zc, zc, zs, zs, zs)
    else:
        init = _Reduced(zk, zv, zv, zv, zc, zc, zk, zk, zk, zv, zv)
    return lax.fori_loop(0, v_ref.shape[-1] // block_v, body, init)


def _chunk_parts_from_refs(q_ref, la_ref, lm_ref, k, p, beta, eta, *, scale, precision, inverse):
    """``_chunk_parts`` inside a kernel: q and the log-gates loaded from their refs."""
    ld = lambda r: r[...].astype(_F32)
    return _chunk_parts(
        ld(q_ref),
        k,
        p,
        ld(la_ref),
        ld(lm_ref),
        beta,
        eta,
        scale=scale,
        precision=precision,
        inverse=inverse,
    )


def _chunk_coefficients_from_refs(q_ref, k_ref, la_ref, lm_ref, beta_ref, eta_ref, *, scale):
    """``_chunk_coefficients`` inside a kernel, every input loaded from its ref."""
    ld = lambda r: r[...].astype(_F32)
    return _chunk_coefficients(
        *(ld(r) for r in (q_ref, k_ref, la_ref, lm_ref, beta_ref, eta_ref)), scale=scale
    )


def _store_dv(dv_ref, sv, tinv, dvt, precision):
    """dV = T^T dVt (11) for the V-block ``sv``."""
    dv_ref[:, sv] = _mm(tinv, dvt, ta=True, precision=precision).astype(dv_ref.dtype)


_GRAD_NAMES = ("dq", "dk", "dp", "dla", "dlm", "dbeta", "deta")  # what _chunk_prep_bwd emits


def _store_to(refs):
    """``emit`` for ``_chunk_prep_bwd``: store each gradient into its output ref; ``refs`` in
    the order of ``_GRAD_NAMES``."""
    by_name = dict(zip(_GRAD_NAMES, refs, strict=True))

    def emit(name, value):
        by_name[name][...] = value.astype(by_name[name].dtype)

    return emit


def _reverse_prep(f, r, refs, beta, eta, *, scale, precision, emit):
    """``_chunk_prep_bwd`` in a kernel, with what it reads late (the keys, p and the decay
    tiles) loaded again from ``refs`` = (k, p, la, lm, beta) where it is used."""
    k_ref, p_ref, la_ref, lm_ref, beta_ref = refs
    ld = lambda r: r[...].astype(_F32)
    _chunk_prep_bwd(
        f,
        r,
        lambda: ld(k_ref),
        lambda: ld(p_ref),
        lambda: _chunk_decay_tiles(ld(la_ref), ld(lm_ref), ld(beta_ref)),
        beta,
        eta,
        scale=scale,
        precision=precision,
        emit=emit,
    )


def _chunk_bwd_kernel(
    q_ref,
    k_ref,
    v_ref,
    p_ref,
    la_ref,
    lm_ref,
    beta_ref,
    eta_ref,
    do_ref,
    vt_ref,
    dvt_ref,
    hs_ref,
    hm_ref,
    dhs_ref,
    dhm_ref,
    dq_ref,
    dk_ref,
    dv_ref,
    dp_ref,
    dla_ref,
    dlm_ref,
    dbeta_ref,
    deta_ref,
    *,
    scale,
    precision,
    block_v,
    inverse,
):
    """One (batch, head, chunk) tile of the backward (``backward="pallas"``): the chunk's
    triangular inverse T, the state-side products summed over V-blocks (``_VSums``, with
    dV = T^T dVt written per block), then the chunk's other forward parts, the contraction
    into ``_Reduced`` and the hand-written reverse of the preparation.

    Only T is live across the V loop: the other parts are recomputed after it from inputs
    loaded again (a load after the loop's stores is not merged with the one before it), and
    the decay tiles once more where the reverse needs them. The extra work is two [C, C]
    products (T's right-hand side), against a V loop whose per-block elementwise scaling and
    row reductions are gone. XLA's compile for an H200 (jaxlib 0.11.2, B=8 T=4096 H=6 K=128
    V=256 bf16; ``benchmarks/xla_aot.py`` SASS columns, per thread, the loops weighted by their
    trip counts): before (parts held across the loop, coefficients applied per V-block)
    44.7 K instructions and 16.5 KB of local-memory spill traffic; after 31.8 K and 12.2 KB
    (K=256: 78.5 K and 73.8 KB to 49.3 K and 63.1 KB). With jaxlib 0.12.0.1 the traffic
    stays level, 14.0 to 13.7 KB (instructions 42.5 K to 31.3 K). Below C = 64 the V loop
    applies the coefficients per block (``_BARE_SUMS_MIN_CHUNK``)."""
    ld = lambda r: r[...].astype(_F32)
    gates = lambda: (ld(beta_ref), ld(eta_ref))
    parts = functools.partial(
        _chunk_parts_from_refs, q_ref, la_ref, lm_ref, scale=scale, precision=precision
    )
    tinv = parts(ld(k_ref), ld(p_ref), *gates(), inverse=inverse).tinv
    per_block = q_ref.shape[0] < _BARE_SUMS_MIN_CHUNK
    chunk_inputs = (q_ref, k_ref, la_ref, lm_ref, beta_ref, eta_ref)
    sums = _contract_over_v(
        (v_ref, do_ref, vt_ref, dvt_ref, hs_ref, hm_ref, dhs_ref, dhm_ref),
        block_v=block_v,
        precision=precision,
        on_block=lambda sv, dvt: _store_dv(dv_ref, sv, tinv, dvt, precision),
        coefficients=(
            _chunk_coefficients_from_refs(*chunk_inputs, scale=scale) if per_block else None
        ),
    )
    beta, eta = gates()
    f = parts(ld(k_ref), ld(p_ref), beta, eta, inverse=lambda _: tinv)
    _reverse_prep(
        f,
        sums if per_block else _reduce_sums(f, sums),
        (k_ref, p_ref, la_ref, lm_ref, beta_ref),
        beta,
        eta,
        scale=scale,
        precision=precision,
        emit=_store_to((dq_ref, dk_ref, dp_ref, dla_ref, dlm_ref, dbeta_ref, deta_ref)),
    )


def _chunk_bwd_v_kernel(
    q_ref, k_ref, v_ref, la_ref, lm_ref, beta_ref, eta_ref, *refs, scale, precision, block_v
):
    """First half of the split backward (``backward="pallas_split"``), one (batch, head,
    chunk) tile: the V-contraction of ``_chunk_bwd_kernel`` alone, written out as the eleven
    ``_Reduced`` arrays. After the sum it needs only gate vectors, ``s q`` and ``kt`` of the
    chunk (``_chunk_coefficients``: no triangular inverse, no dot), so its registers go to the
    accumulators. ``refs``: the inputs (do, Vt, dVt, S, M, dS, dM), then the outputs.

    Summing bare products and applying the coefficients once after the loop (instead of per
    V-block), XLA's compile for an H200 (jaxlib 0.11.2, B=8 T=4096 H=6 V=256 bf16, per
    thread, loops weighted by trip count) went from 12.4 K instructions and 6.9 KB of
    local-memory spill traffic to 6.5 K and 1.7 KB at K=128 (K=256: 48.2 K and 73.2 KB to
    17.3 K and 41.4 KB). Below C = 64 it applies them per block (``_BARE_SUMS_MIN_CHUNK``)."""
    state_refs, reduced_refs = refs[:7], refs[7:]
    chunk_inputs = (q_ref, k_ref, la_ref, lm_ref, beta_ref, eta_ref)
    coefficients = lambda: _chunk_coefficients_from_refs(*chunk_inputs, scale=scale)
    contract = functools.partial(
        _contract_over_v, (v_ref, *state_refs), block_v=block_v, precision=precision
    )
    if q_ref.shape[0] < _BARE_SUMS_MIN_CHUNK:
        reduced = contract(coefficients=coefficients())
    else:
        reduced = _reduce_sums(coefficients(), contract())
    for ref, val in zip(reduced_refs, reduced, strict=True):
        ref[...] = val.astype(ref.dtype)


class _LoadOnRead:
    """Attribute ``name`` loads ``refs[name]`` as float32 where it is read, so each input of
    ``_chunk_prep_bwd`` is loaded next to its use rather than all of them at the start."""

    def __init__(self, refs):
        self._refs = refs

    def __getattr__(self, name):
        return self._refs[name][...].astype(_F32)


def _prep_bwd_kernel(
    q_ref,
    k_ref,
    p_ref,
    la_ref,
    lm_ref,
    beta_ref,
    eta_ref,
    dvt_ref,
    *refs,
    scale,
    precision,
    block_v,
    inverse,
):
    """Second half of the split backward, one (batch, head, chunk) tile: recompute the chunk's
    forward parts, dV = T^T dVt over V-blocks, then ``_chunk_prep_bwd`` from the ``_Reduced``
    arrays the first half wrote (each loaded where it is used). ``refs``: the eleven reduced
    inputs, then the eight outputs (dq, dk, dv, dp, dla, dlm, dbeta, deta).

    Loading each reduced array where it is read and recomputing the decay tiles at the end
    took XLA's compile for an H200 (as in ``_chunk_bwd_v_kernel``) from 34.1 K instructions
    and 9.2 KB of spill traffic per thread to 32.4 K and 5.1 KB at K=128 (K=256: 38.3 K and
    18.0 KB to 36.9 K and 12.2 KB)."""
    n_red = len(_Reduced._fields)
    reduced_refs, (dq_ref, dk_ref, dv_ref, dp_ref, *gate_refs) = refs[:n_red], refs[n_red:]
    ld = lambda r: r[...].astype(_F32)
    beta, eta = ld(beta_ref), ld(eta_ref)
    f = _chunk_parts_from_refs(
        q_ref,
        la_ref,
        lm_ref,
        ld(k_ref),
        ld(p_ref),
        beta,
        eta,
        scale=scale,
        precision=precision,
        inverse=inverse,
    )

    def body(j, carry):
        sv = pl.ds(j * block_v, block_v)
        _store_dv(dv_ref, sv, f.tinv, dvt_ref[:, sv], precision)
        return carry

    lax.fori_loop(0, dvt_ref.shape[-1] // block_v, body, 0)
    _reverse_prep(
        f,
        _LoadOnRead(dict(zip(_Reduced._fields, reduced_refs, strict=True))),
        (k_ref, p_ref, la_ref, lm_ref, beta_ref),
        beta,
        eta,
        scale=scale,
        precision=precision,
        emit=_store_to((dq_ref, dk_ref, dp_ref, *gate_refs)),
    )


# --------------------------------------------------------------------------------------------
# Launchers
# --------------------------------------------------------------------------------------------

_BACKWARDS = ("pallas", "pallas_split", "xla")
_STATE_KERNELS = ("triton", "mosaic_gpu")


def _check_mosaic_state_kernel(dtype, t, kdim, chunk_size, block_v, launch=()):
    """Raise ValueError, naming the argument, where ``state_kernel="mosaic_gpu"`` cannot run
    for these arguments of ``momentum_delta_rule_pallas`` (input dtype, sequence length,
    unpadded K, the ``launch`` overrides): ``mosaic.check_supported`` on the padded sizes.
    Any input dtype but float32 takes bfloat16 dot operands (``_dot_dtype``)."""
    from jaxlib_ext.pallas_kernels.mdn.mosaic import check_supported

    kp = _pow2(kdim)
    check_supported(
        dot_dtype=_F32 if jnp.dtype(dtype) == _F32 else jnp.bfloat16,
        chunk=chunk_size,
        kp=kp,
        block_v=block_v,
        n_chunks=-(-t // chunk_size),
        stages=_launch_params("mdn_state_fwd_mosaic", kp, _check_launch(launch))[1],
    )


def _mosaic_state_kernel_applies(dtype, t, kdim, vdim, chunk_size, block_v, launch=()):
    """Whether ``state_kernel="mosaic_gpu"`` with this ``block_v`` (which must divide the
    padded V) and ``launch`` runs for these arguments; the benchmarks skip it where not."""
    if _pow2(vdim) % block_v:
        return False
    try:
        _check_mosaic_state_kernel(dtype, t, kdim, chunk_size, block_v, launch)
    except ValueError:
        return False
    return True


def _prep_call(q, k, v, p, la, lm, beta, eta, *, chunk, scale, precision, inverse, run):
    b, tp, h, kp = q.shape
    vp = v.shape[-1]
    n = tp // chunk
    tok = lambda d: pl.BlockSpec((None, chunk, None, d), lambda i, j, l: (j, i, l, 0))
    gate = pl.BlockSpec((None, chunk, None), lambda i, j, l: (j, i, l))
    in_specs = [tok(kp), tok(kp), tok(vp), tok(kp), gate, gate, gate, gate]
    out_specs = [tok(vp)] + [tok(kp)] * 6 + [tok(chunk), gate, gate, gate]
    dot = _dot_dtype(precision)  # y, z, kgs, kgm, qa, qb, attn only ever feed dots
    out_shape = (
        [_sds((b, tp, h, vp))]
        + [_sds((b, tp, h, kp), dot)] * 6
        + [_sds((b, tp, h, chunk), dot)]
        + [_sds((b, tp, h))] * 3
    )
    kernel = functools.partial(_prep_kernel, scale=scale, precision=precision, inverse=inverse)
    return _launch(
        kernel,
        (q, k, v, p, la, lm, beta, eta),
        in_specs,
        out_specs,
        out_shape,
        grid=(n, b, h),
        run=run,
        name="mdn_prep",
        kp=kp,
    )


def _sequence_specs(tp, kp, chunk, block_v, n):
    """BlockSpecs of the state-recurrence kernels, grid ``(B, H, V-blocks)``: whole sequences
    per (batch, head), the V-block of value-like tensors, one state tile and all chunk states.
    Returns ``(full_k, full_c, full_v, gate, state, states)``."""
    full_k = pl.BlockSpec((None, tp, None, kp), lambda i, j, l: (i, 0, j, 0))
    full_c = pl.BlockSpec((None, tp, None, chunk), lambda i, j, l: (i, 0, j, 0))
    full_v = pl.BlockSpec((None, tp, None, block_v), lambda i, j, l: (i, 0, j, l))
    gate = pl.BlockSpec((None, tp, None), lambda i, j, l: (i, 0, j))
    state = pl.BlockSpec((None, None, kp, block_v), lambda i, j, l: (i, j, 0, l))
    states = pl.BlockSpec((None, None, n * kp, block_v), lambda i, j, l: (i, j, 0, l))
    return full_k, full_c, full_v, gate, state, states


def _sequence_out_shapes(b, tp, h, kp, vp, n, dot):
    """Outputs of both state kernels: a value-like sequence, the per-chunk (S, M) (or their
    cotangents), all three stored in the dot dtype ``dot`` (they only feed dots and the
    chunk-end decay sums), and the final pair in float32."""
    return [
        _sds((b, tp, h, vp), dot),
        _sds((b, h, n * kp, vp), dot),
        _sds((b, h, n * kp, vp), dot),
        _sds((b, h, kp, vp)),
        _sds((b, h, kp, vp)),
    ]


def _state_fwd_call(prep, s0, m0, *, chunk, block_v, precision, run):
    uv, y, z, kgs, kgm, _, _, _, av, bv, uvec = prep
    b, tp, h, kp = y.shape
    vp = uv.shape[-1]
    n = tp // chunk
    nv = vp // block_v
    full_k, _, full_v, gate, state, states = _sequence_specs(tp, kp, chunk, block_v, n)
    in_specs = [full_v, full_k, full_k, full_k, full_k, gate, gate, gate, state, state]
    out_specs = [full_v, states, states, state, state]
    out_shape = _sequence_out_shapes(b, tp, h, kp, vp, n, _dot_dtype(precision))
    kernel = functools.partial(
        _state_fwd_kernel, chunk=chunk, n_chunks=n, kp=kp, precision=precision
    )
    return _launch(
        kernel,
        (uv, y, z, kgs, kgm, av, bv, uvec, s0, m0),
        in_specs,
        out_specs,
        out_shape,
        grid=(b, h, nv),
        run=run,
        name="mdn_state_fwd",
        kp=kp,
    )


def _out_call(prep, hs, hm, vt, out_dtype, *, chunk, block_v, precision, run):
    _, _, _, _, _, qa, qb, attn, _, _, _ = prep
    b, tp, h, kp = qa.shape
    vp = vt.shape[-1]
    n = tp // chunk
    nv = vp // block_v
    # grid (chunk, batch * head, V-block): at most three grid axes for Triton.
    tok_k = pl.BlockSpec((None, chunk, None, kp), lambda i, j, l: (j // h, i, j % h, 0))
    tok_c = pl.BlockSpec((None, chunk, None, chunk), lambda i, j, l: (j // h, i, j % h, 0))
    tok_v = pl.BlockSpec((None, chunk, None, block_v), lambda i, j, l: (j // h, i, j % h, l))
    state = pl.BlockSpec((None, None, kp, block_v), lambda i, j, l: (j // h, j % h, i, l))
    kernel = functools.partial(_out_kernel, precision=precision)
    (o,) = _launch(
        kernel,
        (qa, qb, attn, hs, hm, vt),
        [tok_k, tok_k, tok_c, state, state, tok_v],
        [tok_v],
        [_sds((b, tp, h, vp), out_dtype)],
        grid=(n, b * h, nv),
        run=run,
        name="mdn_out",
        kp=kp,
    )
    return o


def _state_bwd_call(prep, do, dst, dmt, *, chunk, block_v, precision, run):
    _, y, z, kgs, kgm, qa, qb, attn, av, bv, uvec = prep
    b, tp, h, kp = y.shape
    vp = do.shape[-1]
    n = tp // chunk
    nv = vp // block_v
    full_k, full_c, full_v, gate, state, states = _sequence_specs(tp, kp, chunk, block_v, n)
    in_specs = [full_v, full_k, full_k, full_c] + [full_k] * 4 + [gate] * 3 + [state, state]
    out_specs = [full_v, states, states, state, state]
    out_shape = _sequence_out_shapes(b, tp, h, kp, vp, n, _dot_dtype(precision))
    kernel = functools.partial(
        _state_bwd_kernel, chunk=chunk, n_chunks=n, kp=kp, precision=precision
    )
    return _launch(
        kernel,
        (do, qa, qb, attn, y, z, kgs, kgm, av, bv, uvec, dst, dmt),
        in_specs,
        out_specs,
        out_shape,
        grid=(b, h, nv),
        run=run,
        name="mdn_state_bwd",
        kp=kp,
    )


def _chunk_tile_specs(h, kp, vp, chunk):
    """BlockSpecs of the chunk-parallel backward kernels, grid ``(N, B, H)``: ``tok(d)`` a
    [C, d] token tile, ``gate`` a [C] gate tile, ``state`` the [K, V] state of the chunk."""
    tok = lambda d: pl.BlockSpec((None, chunk, None, d), lambda i, j, l: (j, i, l, 0))
    gate = pl.BlockSpec((None, chunk, None), lambda i, j, l: (j, i, l))
    state = pl.BlockSpec((None, None, kp, vp), lambda i, j, l: (j, l, i, 0))
    return tok, gate, state


def _grad_specs(b, tp, h, kp, vp, tok, gate):
    """Out specs and shapes of dq, dk, dv, dp, dla, dlm, dbeta, deta (float32)."""
    out_specs = [tok(kp), tok(kp), tok(vp), tok(kp)] + [gate] * 4
    out_shape = [_sds((b, tp, h, kp))] * 2 + [_sds((b, tp, h, vp)), _sds((b, tp, h, kp))]
    return out_specs, out_shape + [_sds((b, tp, h))] * 4


def _chunk_bwd_call(
    args, do, vt, dvt, hs, hm, dhs, dhm, *, chunk, block_v, scale, precision, inverse, run
):
    q, k, v, p, la, lm, beta, eta = args
    b, tp, h, kp = q.shape
    vp = v.shape[-1]
    tok, gate, state = _chunk_tile_specs(h, kp, vp, chunk)
    in_specs = [tok(kp), tok(kp), tok(vp), tok(kp)] + [gate] * 4 + [tok(vp)] * 3 + [state] * 4
    out_specs, out_shape = _grad_specs(b, tp, h, kp, vp, tok, gate)
    kernel = functools.partial(
        _chunk_bwd_kernel, scale=scale, precision=precision, block_v=block_v, inverse=inverse
    )
    return _launch(
        kernel,
        (q, k, v, p, la, lm, beta, eta, do, vt, dvt, hs, hm, dhs, dhm),
        in_specs,
        out_specs,
        out_shape,
        grid=(tp // chunk, b, h),
        run=run,
        name="mdn_chunk_bwd",
        chunk=chunk,
        kp=kp,
    )


def _chunk_bwd_split_call(
    args, do, vt, dvt, hs, hm, dhs, dhm, *, chunk, block_v, scale, precision, inverse, run
):
    """``backward="pallas_split"``: mdn_chunk_bwd_v writes the ``_Reduced`` cotangents
    (float32: [C, K] x 4, [C, C] x 2, [C] x 5 per chunk), mdn_prep_bwd turns them into the
    gradients."""
    q, k, v, p, la, lm, beta, eta = args
    b, tp, h, kp = q.shape
    vp = v.shape[-1]
    tok, gate, state = _chunk_tile_specs(h, kp, vp, chunk)
    width = {"k": kp, "c": chunk}
    red_kind = dict(
        dsq="k", davec="", dbvec="", duvec="", dattn="c", dtinv_v="c",
        dy="k", dz="k", dkt="k", dg_last="", du_last="",
    )  # fmt: skip
    kinds = [red_kind[name] for name in _Reduced._fields]
    red_specs = [tok(width[x]) if x else gate for x in kinds]
    red_shape = [_sds((b, tp, h, width[x])) if x else _sds((b, tp, h)) for x in kinds]
    grid = (tp // chunk, b, h)
    kw = dict(scale=scale, precision=precision, block_v=block_v)
    reduced = _launch(
        functools.partial(_chunk_bwd_v_kernel, **kw),
        (q, k, v, la, lm, beta, eta, do, vt, dvt, hs, hm, dhs, dhm),
        [tok(kp), tok(kp), tok(vp)] + [gate] * 4 + [tok(vp)] * 3 + [state] * 4,
        red_specs,
        red_shape,
        grid=grid,
        run=run,
        name="mdn_chunk_bwd_v",
        chunk=chunk,
        kp=kp,
    )
    out_specs, out_shape = _grad_specs(b, tp, h, kp, vp, tok, gate)
    return _launch(
        functools.partial(_prep_bwd_kernel, inverse=inverse, **kw),
        (q, k, p, la, lm, beta, eta, dvt, *reduced),
        [tok(kp), tok(kp), tok(kp)] + [gate] * 4 + [tok(vp)] + red_specs,
        out_specs,
        out_shape,
        grid=grid,
        run=run,
        name="mdn_prep_bwd",
        chunk=chunk,
        kp=kp,
    )


# --------------------------------------------------------------------------------------------
# custom_vjp core on padded arrays
# --------------------------------------------------------------------------------------------


class _Config(NamedTuple):
    """The static options of one call, resolved (``nondiff_argnums`` of the custom VJP)."""

    chunk: int
    block_v: int
    scale: float
    precision: object  # lax.Precision or DotAlgorithmPreset of the in-kernel dots (``_mm``)
    backward: str  # one of _BACKWARDS
    inverse: object  # the in-kernel triangular inverse (``_inverse_fn``)
    run: _Run
    state_kernel: str  # one of _STATE_KERNELS


def _forward(args, cfg):
    q, k, v, p, la, lm, beta, eta, s0, m0 = args
    chunk, block_v = cfg.chunk, cfg.block_v
    kw = dict(precision=cfg.precision, run=cfg.run)
    prep = _prep_call(
        q, k, v, p, la, lm, beta, eta, chunk=chunk, scale=cfg.scale, inverse=cfg.inverse, **kw
    )
    if cfg.state_kernel == "mosaic_gpu":
        from jaxlib_ext.pallas_kernels.mdn.mosaic import state_fwd_mosaic

        _, stages = _launch_params("mdn_state_fwd_mosaic", q.shape[-1], cfg.run.launch)
        state = state_fwd_mosaic(
            prep, s0, m0, chunk=chunk, block_v=block_v, stages=stages, interpret=cfg.run.interpret
        )
    else:
        state = _state_fwd_call(prep, s0, m0, chunk=chunk, block_v=block_v, **kw)
    vt, hs, hm, st, mt = state
    o = _out_call(prep, hs, hm, vt, q.dtype, chunk=chunk, block_v=block_v, **kw)
    return (o, st, mt), (vt, hs, hm)


# Layouts of the padded arrays for ``batch_and_head_parallel``: every (batch row, head) is
# independent, so the kernels run on each device's rows and heads (n: N * Kp stacked states).
_ARG_LAYOUTS = ("b t h k", "b t h k", "b t h v", "b t h k") + ("b t h",) * 4 + ("b h k v",) * 2
_OUT_LAYOUTS = ("b t h v", "b h k v", "b h k v")
_RES_LAYOUTS = ("b t h v", "b h n v", "b h n v")  # Vt and the per-chunk states


def _forward_sharded(args, cfg):
    """``_forward`` partitioned over batch and heads (``_partition.py``)."""

    def forward(*args):
        out, res = _forward(args, cfg)
        return out + res

    if not (cfg.run.interpret and cfg.state_kernel == "mosaic_gpu"):
        # (GPU interpret mode's callbacks carry ordered effects, which custom_partitioning
        # cannot lower; interpreted kernels are plain XLA ops that XLA partitions itself.)
        forward = batch_and_head_parallel(forward, _ARG_LAYOUTS, _OUT_LAYOUTS + _RES_LAYOUTS)
    outs = forward(*args)
    return outs[:3], outs[3:]


@functools.partial(jax.custom_vjp, nondiff_argnums=(1,))
def _mdn_core(args, cfg):
    return _forward_sharded(args, cfg)[0]


def _mdn_core_fwd(args, cfg):
    out, res = _forward_sharded(args, cfg)
    return out, (args, res)


def _mdn_core_bwd(cfg, residuals, cotangents):
    args, res = residuals

    def backward(*arrays):
        return _backward(arrays, cfg)

    layouts = _ARG_LAYOUTS + _RES_LAYOUTS + _OUT_LAYOUTS
    grads = batch_and_head_parallel(backward, layouts, _ARG_LAYOUTS)(*args, *res, *cotangents)
    return (with_shardings_of(grads, args),)


def _backward(arrays, cfg):
    """Gradients of the ten padded inputs from the inputs, the residuals and the cotangents of
    (o, S_T, M_T)."""
    chunk, block_v, scale, precision = cfg.chunk, cfg.block_v, cfg.scale, cfg.precision
    backward, inverse, run = cfg.backward, cfg.inverse, cfg.run
    args, (vt, hs, hm, do, dst, dmt) = arrays[:10], arrays[10:]
    q, k, v, p, la, lm, beta, eta, s0, m0 = args
    kw = dict(precision=precision, run=run)
    if backward != "xla":
        prep = _prep_call(
            q, k, v, p, la, lm, beta, eta, chunk=chunk, scale=scale, inverse=inverse, **kw
        )
    else:
        prep_fn = functools.partial(_prep_xla, chunk=chunk, scale=scale, precision=precision)
        prep, prep_vjp = jax.vjp(prep_fn, q, k, v, p, la, lm, beta, eta)
    dvt, dhs, dhm, ds0, dm0 = _state_bwd_call(
        prep, do, dst.astype(_F32), dmt.astype(_F32), chunk=chunk, block_v=block_v, **kw
    )
    if backward in ("pallas", "pallas_split"):
        call = _chunk_bwd_call if backward == "pallas" else _chunk_bwd_split_call
        grads = call(
            args[:8],
            do,
            vt,
            dvt,
            hs,
            hm,
            dhs,
            dhm,
            chunk=chunk,
            block_v=block_v,
            scale=scale,
            inverse=inverse,
            **kw,
        )
    else:
        cts = _param_cotangents_xla(do, vt, dvt, hs, hm, dhs, dhm, chunk, precision)
        # dVt comes from the state kernel in the dot dtype (bf16 on the bf16 path); the jnp
        # mirror's outputs, whose cotangents these are, are float32
        grads = prep_vjp(tuple(c.astype(p.dtype) for c, p in zip(cts, prep, strict=True)))
    grads = tuple(g.astype(a.dtype) for g, a in zip(grads, args[:8], strict=True))
    return grads + (ds0, dm0)


def _param_cotangents_xla(do, vt, dvt, hs, hm, dhs, dhm, chunk, precision):
    """Cotangents of the preparation outputs from the state-side quantities, as batched XLA
    einsums (the ``backward="xla"`` path; the Pallas path does this inside _chunk_bwd_kernel)."""
    b, tp, h, vp = vt.shape
    kp = hs.shape[2] // (tp // chunk)
    n = tp // chunk
    tok = lambda x: x.astype(_F32).reshape(b, n, chunk, h, x.shape[-1])
    st = lambda x: x.reshape(b, h, n, kp, vp)
    do_c, vt_c, dvt_c = tok(do), tok(vt), tok(dvt)
    hs_c, hm_c, dhs_c, dhm_c = st(hs), st(hm), st(dhs), st(dhm)
    ein = functools.partial(jnp.einsum, precision=precision, preferred_element_type=_F32)
    d_qa = ein("bnchv,bhnkv->bnchk", do_c, hs_c)
    d_qb = -ein("bnchv,bhnkv->bnchk", do_c, hm_c)
    d_attn = ein("bnchv,bnehv->bnche", do_c, vt_c)
    d_y = -ein("bnchv,bhnkv->bnchk", dvt_c, hs_c)
    d_z = ein("bnchv,bhnkv->bnchk", dvt_c, hm_c)
    d_kgs = ein("bnchv,bhnkv->bnchk", vt_c, dhs_c)
    d_kgm = -ein("bnchv,bhnkv->bnchk", vt_c, dhm_c)

    def at_last(x):  # [B, H, N] chunk-end scalar -> [B, N, C, H], zero but at the last step
        zeros = jnp.zeros((b, n, chunk, h), _F32)
        return zeros.at[:, :, -1, :].set(jnp.moveaxis(x, 1, 2))

    d_av = at_last(jnp.sum(hs_c * dhs_c, axis=(-2, -1)))
    d_bv = at_last(-jnp.sum(hm_c * dhs_c, axis=(-2, -1)))
    d_uvec = at_last(jnp.sum(hm_c * dhm_c, axis=(-2, -1)))
    flat = lambda x: x.reshape((b, tp, h) + x.shape[4:])
    cts = (dvt,) + tuple(flat(c) for c in (d_y, d_z, d_kgs, d_kgm, d_qa, d_qb, d_attn))
    return cts + tuple(flat(c) for c in (d_av, d_bv, d_uvec))


_mdn_core.defvjp(_mdn_core_fwd, _mdn_core_bwd)


# --------------------------------------------------------------------------------------------
# Public entry point
# --------------------------------------------------------------------------------------------


@functools.partial(
    jax.jit,
    static_argnames=(
        "scale",
        "output_final_state",
        "chunk_size",
        "interpret",
        "block_v",
        "poison_outputs",
        "backward",
        "launch",
        "inverse",
        "state_kernel",
    ),
)
def momentum_delta_rule_pallas(
    q,
    k,
    v,
    p,
    log_alpha,
    log_mu,
    beta,
    eta,
    *,
    scale,
    initial_state=None,
    output_final_state=False,
    chunk_size=64,
    interpret=False,
    block_v=None,
    poison_outputs=False,
    backward=None,
    launch=(),
    inverse="substitution",
    state_kernel="triton",
):
    """Momentum delta rule, chunkwise, in Pallas kernels (see the module docstring).

    Args:
      q, k, p: [B, T, H, K] float32 or bfloat16.
      v: [B, T, H, V], same dtype family.
      log_alpha, log_mu, beta, eta: [B, T, H] gates (``alpha = exp(log_alpha)``, likewise mu).
      scale: query scale (a Python float; the public op fills in ``K**-0.5``).
      initial_state: [2, B, H, K, V] holding (S, M), or None for zeros.
      output_final_state: also return the final (S, M) as float32 [2, B, H, K, V].
      chunk_size: chunk length, a power of two >= 16 (Triton dot tiles). Compiled with float32
        inputs and padded K > 64, chunks are capped at 32 (same algorithm, other rounding): at
        64 the fused backward kernel would need 352 KB of shared memory, beyond the H200's 227.
      interpret: run the kernels with the Pallas interpreter (the only option on CPU).
      block_v: V-tile of the state kernels (power of two); default 64 for padded K <= 64, 32
        up to 128, 16 beyond (``_default_block_v``): the two [K, block_v] float32 states stay
        in registers without spilling on Hopper.
      poison_outputs: testing aid: every kernel output buffer starts as NaN.
      launch: ``((kernel_name, num_warps, num_stages), ...)`` overriding the tuned defaults of
        ``_launch_params`` for the named kernels (``mdn_prep``, ``mdn_state_fwd``, ``mdn_out``,
        ``mdn_state_bwd``, ``mdn_chunk_bwd``, ``mdn_chunk_bwd_v``, ``mdn_prep_bwd``); for
        tuning on a GPU (``benchmarks/mdn_gpu.py --tune``). No effect in interpret mode, but
        for ``mdn_state_fwd_mosaic`` (4 warps; num_stages 2, the default, or 1: the slots of
        its pipeline and output buffers, see ``mosaic.py``).
      backward: how the chunk-parallel half of the backward runs, after the reverse state
        recurrence kernel: ``"pallas"``, one fused kernel (mdn_chunk_bwd); ``"pallas_split"``,
        two kernels (mdn_chunk_bwd_v, then mdn_prep_bwd) with the contracted cotangents
        round-tripping through HBM; ``"xla"``, XLA einsums and ``jax.vjp`` of the jnp mirror
        of the preparation. Default (None): ``_default_backward``, i.e. ``"pallas"`` for padded
        K <= 128 and ``"pallas_split"`` beyond, where the fused kernel needs up to 200 KiB of
        the H200's 227 KiB of shared memory (float32, C = 32).
      inverse: how the kernels form the unit-lower-triangular inverse T of (9):
        ``"substitution"`` (default), forward substitution, C - 1 dependent row updates with
        masked reductions; ``"neumann"``, the nilpotent Neumann series in product form,
        2 log2(C) - 2 chained C x C matmuls on the tensor cores in float32-grade precision
        (3xTF32 compiled, HIGHEST interpreted), also on the bfloat16 path. Both agree to float32
        rounding (tests); which is faster on a GPU is for ``benchmarks/mdn_gpu.py --tune``.
      state_kernel: the forward state recurrence (mdn_state_fwd) in ``"triton"`` (default,
        Pallas Triton like every other kernel) or ``"mosaic_gpu"``, the Pallas Mosaic GPU
        variant for Hopper (``mosaic.py``: TMA pipelining of the chunk tiles, wgmma dots). The
        Mosaic kernel needs bfloat16 inputs, chunk_size 64 (or a multiple), K padded to a
        multiple of 64 and a block_v whose tiles fit shared memory (32 at K = 128, or 64 with
        one pipeline stage, see ``launch``); it raises a ValueError otherwise. Same results as
        the Triton kernel (tests, interpret mode); ``benchmarks/mdn_gpu.py --tune`` times it.
        The backward kernels are Triton either way.

    Returns:
      ``(o, final_state)``: o [B, T, H, V] in q's dtype; final_state float32 or None.

    Inputs are zero-padded to ``T % chunk_size == 0`` with gates ``log_alpha = log_mu = 0``,
    ``beta = eta = 0`` (the padded steps leave (S, M) unchanged) and to power-of-two K, V.
    Accumulation is float32 throughout. In-kernel dots: bfloat16 inputs use bfloat16 operands
    (bf16 MMA); float32 inputs use 3xTF32 (``DotAlgorithmPreset.TF32_TF32_F32_X3``, about
    float32 accuracy on the tensor cores) when compiled, ``Precision.HIGHEST`` in interpret
    mode. IEEE float32 dots compile to FMA loops that spill 17-118 KB per thread (ptxas for
    sm_90a) and take minutes to compile.
    """
    if chunk_size < 16 or chunk_size & (chunk_size - 1):
        raise ValueError(f"chunk_size: expected a power of two >= 16, got {chunk_size}")
    if q.ndim != 4:
        raise ValueError(f"q: expected rank 4 [B, T, H, K], got shape {q.shape}")
    b, t, h, kdim = q.shape
    for name, x, want in (
        ("k", k, q.shape),
        ("p", p, q.shape),
        ("v", v, (b, t, h, v.shape[-1] if v.ndim == 4 else -1)),
        ("log_alpha", log_alpha, (b, t, h)),
        ("log_mu", log_mu, (b, t, h)),
        ("beta", beta, (b, t, h)),
        ("eta", eta, (b, t, h)),
    ):
        if tuple(x.shape) != tuple(want):
            raise ValueError(f"{name}: expected shape {tuple(want)}, got {tuple(x.shape)}")
    if initial_state is not None and initial_state.shape != (2, b, h, kdim, v.shape[-1]):
        raise ValueError(
            f"initial_state: expected shape {(2, b, h, kdim, v.shape[-1])}, "
            f"got {initial_state.shape}"
        )
    vdim = v.shape[-1]
    kp, vp = _pow2(kdim), _pow2(vdim)
    if q.dtype != jnp.float32:
        precision = lax.Precision.DEFAULT  # bf16 operands, f32 accumulation (see _mm)
    elif interpret:
        precision = lax.Precision.HIGHEST
    else:  # 3xTF32 on the tensor cores: ~fp32 accuracy; IEEE f32 dots become FMA loops that
        # spill 30-120 KB per thread and take minutes in ptxas (triton_resources.py)
        precision = lax.DotAlgorithmPreset.TF32_TF32_F32_X3
        if kp > 64:  # at C = 64 the fused backward kernel needs 352 KB of shared memory
            chunk_size = min(chunk_size, 32)
    tp = -(-t // chunk_size) * chunk_size
    if block_v is None:
        block_v = min(vp, _default_block_v(kp))
    if block_v & (block_v - 1) or vp % block_v:
        raise ValueError(f"block_v: expected a power of two dividing {vp}, got {block_v}")
    if backward is None:
        backward = _default_backward(kp)
    if backward not in _BACKWARDS:
        raise ValueError(f"backward: expected None or one of {_BACKWARDS}, got {backward!r}")
    if inverse not in _INVERSES:
        raise ValueError(f"inverse: expected one of {_INVERSES}, got {inverse!r}")
    if state_kernel not in _STATE_KERNELS:
        raise ValueError(f"state_kernel: expected one of {_STATE_KERNELS}, got {state_kernel!r}")
    if state_kernel == "mosaic_gpu":
        _check_mosaic_state_kernel(q.dtype, t, kdim, chunk_size, block_v, launch)
    f32_grade = lax.Precision.HIGHEST if interpret else lax.DotAlgorithmPreset.TF32_TF32_F32_X3

    def pad_tok(x, d):
        return jnp.pad(x, ((0, 0), (0, tp - t), (0, 0), (0, d - x.shape[-1])))

    def pad_gate(x):
        return jnp.pad(x.astype(_F32), ((0, 0), (0, tp - t), (0, 0)))

    if initial_state is None:
        s0 = jnp.zeros((b, h, kp, vp), _F32)
        m0 = s0
    else:
        init = jnp.pad(initial_state.astype(_F32), ((0, 0),) * 3 + ((0, kp - kdim), (0, vp - vdim)))
        s0, m0 = init[0], init[1]
    args = (
        pad_tok(q, kp),
        pad_tok(k, kp),
        pad_tok(v, vp),
        pad_tok(p, kp),
        pad_gate(log_alpha),
        pad_gate(log_mu),
        pad_gate(beta),
        pad_gate(eta),
        s0,
        m0,
    )
    run = _Run(interpret, poison_outputs, _check_launch(launch))
    cfg = _Config(
        chunk=chunk_size,
        block_v=block_v,
        scale=float(scale),
        precision=precision,
        backward=backward,
        inverse=_inverse_fn(inverse, f32_grade),
        run=run,
        state_kernel=state_kernel,
    )
    o, st, mt = _mdn_core(args, cfg)
    o = o[:, :t, :, :vdim]
    if not output_final_state:
        return o, None
    final = jnp.stack([st, mt])[:, :, :, :kdim, :vdim]
    return o, final


def flops_forward(b, t, h, kdim, vdim, chunk=64):
    """Matmul FLOPs of one forward pass of this chunkwise algorithm (for benchmark TFLOP/s)."""
    n = -(-t // chunk)
    c = chunk
    per_chunk = (
        2 * c * c * c * 2  # gamma and gamma_prev
        + 2 * c * c * kdim * 2  # P Kt^T, sQ Kt^T
        + 2 * c * c * vdim  # T V
        + 2 * c * c * kdim * 2  # T (A P), T (b P)
        + 2 * c * kdim * vdim * 4  # Y S, Z M, KgS^T Vt, KgM^T Vt
        + 2 * c * kdim * vdim * 2  # Qa S, Qb M
        + 2 * c * c * vdim  # Attn Vt
    )
    return b * h * n * per_chunk
