"""Chunk-parallel half of the momentum delta rule's backward (Pallas Triton), after the reverse
state recurrence (``state.py``).

Per (chunk, batch row, head), from the inputs, Vt, its cotangent dVt, the states entering the
chunk and the cotangents of the chunk-end states: the state-side products summed over
V-blocks (``_chunk_algebra.VSums``), contracted with the chunk's coefficients
(``reduce_sums``), then the hand-written reverse of the preparation (``chunk_prep_bwd``: the
chain rule through (5), (6), (9)-(11)) gives dq, dk, dv = T^T dVt, dp and the four gate
gradients. Three variants (``MDNKernelConfig.backward``):

* ``"pallas"``: one fused kernel (mdn_chunk_bwd). Only T is live across the V loop; the other
  forward parts are recomputed after it from inputs loaded again.
* ``"pallas_split"``: mdn_chunk_bwd_v contracts over V-blocks with only the chunk's gate
  vectors (no triangular inverse) and writes the eleven ``Reduced`` arrays to HBM;
  mdn_prep_bwd recomputes the chunk's parts, forms dv and runs the reverse of the
  preparation. Less shared memory per kernel, one round trip through HBM.
* ``"xla"``: ``param_cotangents_xla`` (batched einsums) and ``jax.vjp`` of the XLA mirror of
  the preparation: an independent check of the hand-written reverse.

Below chunk size ``BARE_SUMS_MIN_CHUNK`` the V loops apply the chunk's coefficients to each
block's products (fewer register spills there); from it on they sum bare products and reduce
once after the loop. Both give the same sums.
"""

from __future__ import annotations

import functools

import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from jaxlib_ext.pallas_kernels.mdn._chunk_algebra import (
    F32,
    GRAD_NAMES,
    Reduced,
    VSums,
    chunk_coefficients,
    chunk_decay_tiles,
    chunk_parts,
    chunk_prep_bwd,
    matmul,
    reduce_sums,
)
from jaxlib_ext.pallas_kernels.mdn._launch import launch, shape_dtype


def _total(x):
    """Sum of a 2-D tile as two single-axis reductions (the Triton lowering's multi-axis path
    trips over sharded avals when lowering under an abstract mesh)."""
    return jnp.sum(jnp.sum(x, axis=-1), axis=-1)


# Below this chunk size the V loops apply the chunk's coefficients to each block's products;
# from it on they sum bare products and reduce once (the module docstring).
BARE_SUMS_MIN_CHUNK = 64


def _contract_over_v(refs, *, block_v, precision, on_block=None, coefficients=None):
    """One chunk's state-side products summed over V-blocks: ``VSums``, or with
    ``coefficients`` (the chunk's ``_Parts`` or ``_Coefficients``) each block's products
    reduced first (``reduce_sums`` is linear) and ``Reduced`` accumulated.

    ``refs``: (v, do, Vt, dVt, S, M, dS, dM) refs, the states being those entering the chunk
    ([K, V]) and the cotangents those of the chunk-end states. ``on_block(sv, dvt)``, if given,
    runs once per V-block (the fused kernel writes dV = T^T dVt there)."""
    v_ref, do_ref, vt_ref, dvt_ref, hs_ref, hm_ref, dhs_ref, dhm_ref = refs
    mm = functools.partial(matmul, tb=True, precision=precision)
    c, kp = do_ref.shape[0], hs_ref.shape[0]
    zk = jnp.zeros((c, kp), F32)
    zc = jnp.zeros((c, c), F32)
    zv = jnp.zeros((c,), F32)
    zs = jnp.zeros((), F32)

    def body(j, acc):
        sv = pl.ds(j * block_v, block_v)
        do = do_ref[:, sv].astype(F32)
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
            tv=mm(dvt, v_ref[:, sv].astype(F32)),
            ss=_total(hs * dhs),
            ms=_total(hm * dhs),
            mm=_total(hm * dhm),
        )
        if coefficients is not None:
            products = reduce_sums(coefficients, VSums(**products))._asdict()
        return type(acc)(**{name: getattr(acc, name) + x for name, x in products.items()})

    if coefficients is None:
        init = VSums(zk, zk, zk, zk, zk, zk, zc, zc, zs, zs, zs)
    else:
        init = Reduced(zk, zv, zv, zv, zc, zc, zk, zk, zk, zv, zv)
    return lax.fori_loop(0, v_ref.shape[-1] // block_v, body, init)


def _chunk_parts_from_refs(q_ref, la_ref, lm_ref, k, p, beta, eta, *, scale, precision, inverse):
    """``_chunk_parts`` inside a kernel: q and the log-gates loaded from their refs."""
    ld = lambda r: r[...].astype(F32)
    return chunk_parts(
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
    ld = lambda r: r[...].astype(F32)
    return chunk_coefficients(
        *(ld(r) for r in (q_ref, k_ref, la_ref, lm_ref, beta_ref, eta_ref)), scale=scale
    )


def _store_dv(dv_ref, sv, tinv, dvt, precision):
    """dV = T^T dVt (11) for the V-block ``sv``."""
    dv_ref[:, sv] = matmul(tinv, dvt, ta=True, precision=precision).astype(dv_ref.dtype)




def _store_to(refs):
    """``emit`` for ``chunk_prep_bwd``: store each gradient into its output ref; ``refs`` in
    the order of ``GRAD_NAMES``."""
    by_name = dict(zip(GRAD_NAMES, refs, strict=True))

    def emit(name, value):
        by_name[name][...] = value.astype(by_name[name].dtype)

    return emit


def _reverse_prep(f, r, refs, beta, eta, *, scale, precision, emit):
    """``chunk_prep_bwd`` in a kernel, with what it reads late (the keys, p and the decay
    tiles) loaded again from ``refs`` = (k, p, la, lm, beta) where it is used."""
    k_ref, p_ref, la_ref, lm_ref, beta_ref = refs
    ld = lambda r: r[...].astype(F32)
    chunk_prep_bwd(
        f,
        r,
        lambda: ld(k_ref),
        lambda: ld(p_ref),
        lambda: chunk_decay_tiles(ld(la_ref), ld(lm_ref), ld(beta_ref)),
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
    triangular inverse T, the state-side products summed over V-blocks (``VSums``, with
    dV = T^T dVt written per block), then the chunk's other forward parts, the contraction
    into ``Reduced`` and the hand-written reverse of the preparation.

    Only T is live across the V loop: the other parts are recomputed after it from inputs
    loaded again (a load after the loop's stores is not merged with the one before it), and
    the decay tiles once more where the reverse needs them. The extra work is two [C, C]
    products (T's right-hand side), against a V loop whose per-block elementwise scaling and
    row reductions are gone. Below ``BARE_SUMS_MIN_CHUNK`` the V loop applies the
    coefficients per block."""
    ld = lambda r: r[...].astype(F32)
    gates = lambda: (ld(beta_ref), ld(eta_ref))
    parts = functools.partial(
        _chunk_parts_from_refs, q_ref, la_ref, lm_ref, scale=scale, precision=precision
    )
    tinv = parts(ld(k_ref), ld(p_ref), *gates(), inverse=inverse).tinv
    per_block = q_ref.shape[0] < BARE_SUMS_MIN_CHUNK
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
        sums if per_block else reduce_sums(f, sums),
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
    ``Reduced`` arrays. After the sum it needs only gate vectors, ``s q`` and ``kt`` of the
    chunk (``_chunk_coefficients``: no triangular inverse, no dot), so its registers go to the
    accumulators. ``refs``: the inputs (do, Vt, dVt, S, M, dS, dM), then the outputs."""
    state_refs, reduced_refs = refs[:7], refs[7:]
    chunk_inputs = (q_ref, k_ref, la_ref, lm_ref, beta_ref, eta_ref)
    coefficients = lambda: _chunk_coefficients_from_refs(*chunk_inputs, scale=scale)
    contract = functools.partial(
        _contract_over_v, (v_ref, *state_refs), block_v=block_v, precision=precision
    )
    if q_ref.shape[0] < BARE_SUMS_MIN_CHUNK:
        reduced = contract(coefficients=coefficients())
    else:
        reduced = reduce_sums(coefficients(), contract())
    for ref, val in zip(reduced_refs, reduced, strict=True):
        ref[...] = val.astype(ref.dtype)


class _LoadOnRead:
    """Attribute ``name`` loads ``refs[name]`` as float32 where it is read, so each input of
    ``chunk_prep_bwd`` is loaded next to its use rather than all of them at the start."""

    def __init__(self, refs):
        self._refs = refs

    def __getattr__(self, name):
        return self._refs[name][...].astype(F32)


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
    forward parts, dV = T^T dVt over V-blocks, then ``chunk_prep_bwd`` from the ``Reduced``
    arrays the first half wrote (each loaded where it is used). ``refs``: the eleven reduced
    inputs, then the eight outputs (dq, dk, dv, dp, dla, dlm, dbeta, deta)."""
    n_red = len(Reduced._fields)
    reduced_refs, (dq_ref, dk_ref, dv_ref, dp_ref, *gate_refs) = refs[:n_red], refs[n_red:]
    ld = lambda r: r[...].astype(F32)
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
        _LoadOnRead(dict(zip(Reduced._fields, reduced_refs, strict=True))),
        (k_ref, p_ref, la_ref, lm_ref, beta_ref),
        beta,
        eta,
        scale=scale,
        precision=precision,
        emit=_store_to((dq_ref, dk_ref, dp_ref, *gate_refs)),
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
    tok_shape = lambda d: shape_dtype((b, tp, h, d))
    out_shape = [tok_shape(kp), tok_shape(kp), tok_shape(vp), tok_shape(kp)]
    return out_specs, out_shape + [shape_dtype((b, tp, h))] * 4


def chunk_bwd_call(
    args, do, vt, dvt, hs, hm, dhs, dhm, *, chunk, block_v, scale, precision, inverse, config
):
    """``backward="pallas"``: the fused chunk-parallel backward (mdn_chunk_bwd).

    Args:
      args: the op's inputs ``(q, k, v, p, la, lm, beta, eta)`` on [B, Tp, H, *] arrays: q, k,
        p [B, Tp, H, Kp]; v [B, Tp, H, Vp]; the log decays, beta and eta [B, Tp, H].
      do: the output cotangent, [B, Tp, H, Vp].
      vt, dvt: the pseudo-values Vt and their cotangent, [B, Tp, H, Vp].
      hs, hm: the states entering each chunk, [B, H, N*Kp, Vp].
      dhs, dhm: the chunk-end state cotangents, [B, H, N*Kp, Vp].
      chunk: the chunk size C.
      block_v: the V-tile of the kernel's loop over V, dividing Vp.
      scale: the query scale.
      precision: the ``lax.Precision`` of the in-kernel dots.
      inverse: the in-kernel unit-lower-triangular inverse of (9), ``"substitution"`` or
        ``"neumann"``.
      config: the ``MDNKernelConfig`` (with ``interpret`` set).

    Returns:
      The gradients ``(dq, dk, dv, dp, dla, dlm, dbeta, deta)``, float32: dq, dk, dp
      [B, Tp, H, Kp], dv [B, Tp, H, Vp], the four gate gradients [B, Tp, H].
    """
    q, k, v, p, la, lm, beta, eta = args
    b, tp, h, kp = q.shape
    vp = v.shape[-1]
    tok, gate, state = _chunk_tile_specs(h, kp, vp, chunk)
    in_specs = [tok(kp), tok(kp), tok(vp), tok(kp)] + [gate] * 4 + [tok(vp)] * 3 + [state] * 4
    out_specs, out_shape = _grad_specs(b, tp, h, kp, vp, tok, gate)
    kernel = functools.partial(
        _chunk_bwd_kernel, scale=scale, precision=precision, block_v=block_v, inverse=inverse
    )
    return launch(
        kernel,
        (q, k, v, p, la, lm, beta, eta, do, vt, dvt, hs, hm, dhs, dhm),
        in_specs,
        out_specs,
        out_shape,
        grid=(tp // chunk, b, h),
        config=config,
        name="mdn_chunk_bwd",
        chunk=chunk,
        kp=kp,
    )


def chunk_bwd_split_call(
    args, do, vt, dvt, hs, hm, dhs, dhm, *, chunk, block_v, scale, precision, inverse, config
):
    """``backward="pallas_split"``: the chunk-parallel backward in two kernels.

    mdn_chunk_bwd_v writes the ``Reduced`` cotangents (float32: [C, K] x 4, [C, C] x 2, [C] x 5
    per chunk), mdn_prep_bwd turns them into the gradients.

    Args:
      args: the op's inputs ``(q, k, v, p, la, lm, beta, eta)`` on [B, Tp, H, *] arrays: q, k,
        p [B, Tp, H, Kp]; v [B, Tp, H, Vp]; the log decays, beta and eta [B, Tp, H].
      do: the output cotangent, [B, Tp, H, Vp].
      vt, dvt: the pseudo-values Vt and their cotangent, [B, Tp, H, Vp].
      hs, hm: the states entering each chunk, [B, H, N*Kp, Vp].
      dhs, dhm: the chunk-end state cotangents, [B, H, N*Kp, Vp].
      chunk: the chunk size C.
      block_v: the V-tile of the kernel's loop over V, dividing Vp.
      scale: the query scale.
      precision: the ``lax.Precision`` of the in-kernel dots.
      inverse: the in-kernel unit-lower-triangular inverse of (9), ``"substitution"`` or
        ``"neumann"``.
      config: the ``MDNKernelConfig`` (with ``interpret`` set).

    Returns:
      The gradients ``(dq, dk, dv, dp, dla, dlm, dbeta, deta)``, float32: dq, dk, dp
      [B, Tp, H, Kp], dv [B, Tp, H, Vp], the four gate gradients [B, Tp, H].
    """
    q, k, v, p, la, lm, beta, eta = args
    b, tp, h, kp = q.shape
    vp = v.shape[-1]
    tok, gate, state = _chunk_tile_specs(h, kp, vp, chunk)
    width = {"k": kp, "c": chunk}
    red_kind = dict(
        dsq="k", davec="", dbvec="", duvec="", dattn="c", dtinv_v="c",
        dy="k", dz="k", dkt="k", dg_last="", du_last="",
    )  # fmt: skip
    kinds = [red_kind[name] for name in Reduced._fields]
    red_specs = [tok(width[x]) if x else gate for x in kinds]
    red_shape = [shape_dtype((b, tp, h, width[x])) if x else shape_dtype((b, tp, h)) for x in kinds]
    grid = (tp // chunk, b, h)
    kw = dict(scale=scale, precision=precision, block_v=block_v)
    reduced = launch(
        functools.partial(_chunk_bwd_v_kernel, **kw),
        (q, k, v, la, lm, beta, eta, do, vt, dvt, hs, hm, dhs, dhm),
        [tok(kp), tok(kp), tok(vp)] + [gate] * 4 + [tok(vp)] * 3 + [state] * 4,
        red_specs,
        red_shape,
        grid=grid,
        config=config,
        name="mdn_chunk_bwd_v",
        chunk=chunk,
        kp=kp,
    )
    out_specs, out_shape = _grad_specs(b, tp, h, kp, vp, tok, gate)
    return launch(
        functools.partial(_prep_bwd_kernel, inverse=inverse, **kw),
        (q, k, p, la, lm, beta, eta, dvt, *reduced),
        [tok(kp), tok(kp), tok(kp)] + [gate] * 4 + [tok(vp)] + red_specs,
        out_specs,
        out_shape,
        grid=grid,
        config=config,
        name="mdn_prep_bwd",
        chunk=chunk,
        kp=kp,
    )



def param_cotangents_xla(do, vt, dvt, hs, hm, dhs, dhm, chunk, precision):
    """Cotangents of the preparation outputs from the state-side quantities, as batched XLA einsums.

    The ``backward="xla"`` path; the Pallas path does this inside _chunk_bwd_kernel.

    Args:
      do: the output cotangent, [B, Tp, H, Vp].
      vt, dvt: the pseudo-values Vt and their cotangent, [B, Tp, H, Vp].
      hs, hm: the states entering each chunk, [B, H, N*Kp, Vp].
      dhs, dhm: the chunk-end state cotangents, [B, H, N*Kp, Vp].
      chunk: the chunk size C (Tp a multiple of it).
      precision: the ``lax.Precision`` of the einsums.

    Returns:
      The cotangents of the ``ChunkPrep`` fields in their order (uv, y, z, kgs, kgm, qa, qb,
      attn, a, b, u): ``dvt`` itself for uv, float32 [B, Tp, H, Kp] for y .. qb,
      [B, Tp, H, C] for attn and [B, Tp, H] for a, b, u (zero but at each chunk's last step).
    """
    b, tp, h, vp = vt.shape
    kp = hs.shape[2] // (tp // chunk)
    n = tp // chunk
    tok = lambda x: x.astype(F32).reshape(b, n, chunk, h, x.shape[-1])
    st = lambda x: x.reshape(b, h, n, kp, vp)
    do_c, vt_c, dvt_c = tok(do), tok(vt), tok(dvt)
    hs_c, hm_c, dhs_c, dhm_c = st(hs), st(hm), st(dhs), st(dhm)
    ein = functools.partial(jnp.einsum, precision=precision, preferred_element_type=F32)
    d_qa = ein("bnchv,bhnkv->bnchk", do_c, hs_c)
    d_qb = -ein("bnchv,bhnkv->bnchk", do_c, hm_c)
    d_attn = ein("bnchv,bnehv->bnche", do_c, vt_c)
    d_y = -ein("bnchv,bhnkv->bnchk", dvt_c, hs_c)
    d_z = ein("bnchv,bhnkv->bnchk", dvt_c, hm_c)
    d_kgs = ein("bnchv,bhnkv->bnchk", vt_c, dhs_c)
    d_kgm = -ein("bnchv,bhnkv->bnchk", vt_c, dhm_c)

    def at_last(x):  # [B, H, N] chunk-end scalar -> [B, N, C, H], zero but at the last step
        zeros = jnp.zeros((b, n, chunk, h), F32)
        return zeros.at[:, :, -1, :].set(jnp.moveaxis(x, 1, 2))

    d_av = at_last(jnp.sum(hs_c * dhs_c, axis=(-2, -1)))
    d_bv = at_last(-jnp.sum(hm_c * dhs_c, axis=(-2, -1)))
    d_uvec = at_last(jnp.sum(hm_c * dhm_c, axis=(-2, -1)))
    flat = lambda x: x.reshape((b, tp, h) + x.shape[4:])
    cts = (dvt,) + tuple(flat(c) for c in (d_y, d_z, d_kgs, d_kgm, d_qa, d_qb, d_attn))
    return cts + tuple(flat(c) for c in (d_av, d_bv, d_uvec))
