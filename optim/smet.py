r"""SMET: dynamic sparse training with compact, per-slot Adam state (arXiv 2606.00888).

Xiao, Wu, Okanovic, Sternal, van Keulen, Mocanu, Pechenizkiy, Mocanu, Hoefler, "Memory-Efficient
LLM(s) Training with Dynamic Sparsity: From Stability to Practical Scaling", ICML 2026. Semantics
follow the released ``Adam_block`` optimizer and ``Masking`` controller (github.com/QiaoXiao7282/
SMET, ``sparselearning/``), which produced the published numbers, with the paper-text variants as
options. Equations (1)-(4) are numbered in this docstring.

**State.** Every sparse tensor is cut into blocks of ``block_size`` consecutive entries (row-major
order, i.e. along the last axis, the contiguous one of a Flax ``(in, out)`` kernel) and keeps a
fixed number :math:`K = \max(1, \mathrm{round}(d\cdot n_\text{blocks}))` of active blocks, so all
shapes are static under ``jit``: the active block indices ``idx`` (int32[K]), one step counter per
slot (int16[K], clamped at 32765 as the reference code, where the bias corrections are 1 to
float precision) and the moments of the active entries only (``[K, block_size]`` each). Dense leaves
(embeddings, LM head, norms, biases by default) keep ordinary Adam moments and the global count.

**Step** (per slot :math:`k` with its own step :math:`t_k`, gradient :math:`g` gathered at the
active entries only, so inactive gradients never reach the state):

.. math::

   t_k &\leftarrow t_k + 1, \quad m \leftarrow \beta_1 m + (1-\beta_1) g,
        \quad v \leftarrow \beta_2 v + (1-\beta_2) g^2                   && \text{(1) slot Adam} \\
   m &\leftarrow m \cdot \min(t_k / T_w, 1) \quad (\texttt{warmup\_mode="code"}, T_w > 1)
                                                                     && \text{(2) warm-up} \\
   u &= d^{-p}\; \frac{m / (1-\beta_1^{t_k})}{\sqrt{v / (1-\beta_2^{t_k})} + \epsilon}
                                                                     && \text{(3) update}

The warm-up (2) scales the stored moment, so it compounds, as in the released code. The
density-aware scale :math:`d^{-p}` has ``lr_density_power`` :math:`p`, default 1: the released
scripts' :math:`\eta \propto 1/d`. :func:`smet` then moves the active entries by
:math:`-\eta_t u` and sets every inactive entry to 0.

**Topology update** every ``update_every`` steps, a pure function of (params, state, key):
score active blocks by the L1 norm of their weights (rounded to ``RANK_BITS`` = 10 significant
bits, ties broken by block index, so that data-parallel runs on any device count, whose
weights differ in their last bits, prune the same blocks), prune the
``K - max(1, floor(K (1 - r_t)))`` smallest, regrow as many blocks drawn uniformly among the blocks
inactive *before* the update (a pruned block cannot come straight back), in the pruned slots'
places, with :math:`m = v = 0` and a reset step. The prune rate decays by a cosine from
:math:`r_0` = ``prune_rate`` to :math:`r_T` = ``final_prune_rate`` over :math:`T` =
``total_steps``:

.. math::

   r_t = r_T + \tfrac12 (r_0 - r_T)\,\bigl(1 + \cos(\pi \min(t/T, 1))\bigr).
                                                                     \qquad \text{(4) prune rate}

 Step reset: ``"code"`` sets 1 (so the
first update uses :math:`t = 2` and the warm-up above; first update :math:`\approx 0.0149\,
\eta\,\mathrm{sign}(g)`), ``"reset"`` sets 0 (first update uses :math:`t=1`: :math:`1.0\,\eta\,
\mathrm{sign}(g)`, the paper's description), ``"none"`` keeps the global count (naive DST:
:math:`\approx 3.162\,\eta\,\mathrm{sign}(g)`, the cold start the paper identifies).

**Timing choice.** The reference code updates the topology right after step :math:`t`. Here the
update runs at the start of step :math:`t+1` on the same parameters, so ``scale_by_smet`` needs no
learning rate; the only difference is that the gradient of step :math:`t+1` was computed before the
pruned weights were zeroed (their update is then ``-p``).

**Compact layers.** A leaf whose key path ends in ``"sparse_values"`` is the ``[K, block_size]``
value array of a :class:`jaxlib_ext.optim.smet_layer.SparseLinear` layer, which owns the block
indices. SMET keeps per-slot state for it, prunes slots by L1 norm at topology updates (their
values are zeroed, their moments and step reset) and marks them in ``regrown``;
``jaxlib_ext.optim.smet_layer.regrow_sparse_indices(model, smet_regrown(state, params), key)``
then draws the new block indices inside the layer.

**Limits.** Meshes with ``AxisType.Explicit`` axes are not supported (the gather of the active
blocks has no output sharding); with ``Auto`` axes the state shards like the parameters (derive
its shardings with ``optax.tree.map_params``).
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from jaxlib_ext.optim import _common

_WARMUP_MODES = ("code", "reset", "none")
#: per-slot step counters are int16 and saturate here (as ``Adam_block``'s int16 counters)
STEP_MAX = 32765
_STEP_DTYPE = jnp.int16


class ScaleBySmetState(NamedTuple):
    """State of :func:`scale_by_smet`: a global count and five trees shaped like the params.

    Every per-parameter field is a tree with the params' structure (so the state goes through
    ``optax.tree.map_params``), one array per parameter, whose shape depends on the parameter's
    kind: *sparse* (a dense tensor trained with a mask of ``K`` active blocks), *compact* (the
    ``[K, block_size]`` value leaf of a ``SparseLinear`` layer) or *dense*.

    Attributes:
      count: global step count (int32).
      key: raw PRNG key data (uint32[2]) used, folded with the count, by topology updates.
      idx: int32[K] active block indices of a sparse leaf, in slot order (not sorted after
        regrowth); int32[0] for compact and dense leaves.
      step: int16[K] per-slot step counters of sparse and compact leaves, clamped at
        ``STEP_MAX``; int16[0] for dense leaves (they use ``count``).
      mu: first moments: ``[K, block_size]`` for sparse and compact leaves, the parameter's shape
        for dense leaves.
      nu: second moments, shaped as ``mu``.
      regrown: bool[K] for compact leaves, True at the slots pruned by the topology update of the
        last step (False otherwise); bool[0] for sparse and dense leaves.
    """

    count: jax.Array
    key: jax.Array
    idx: Any
    step: Any
    mu: Any
    nu: Any
    regrown: Any


class SparseSlots(NamedTuple):
    """The state of one sparse leaf (``K`` active blocks), the input of a topology update."""

    idx: jax.Array  # int32[K] active block indices
    step: jax.Array  # int16[K] per-slot step counter, clamped at STEP_MAX
    mu: jax.Array  # [K, block_size]
    nu: jax.Array  # [K, block_size]


def num_active_blocks(num_blocks: int, density: float) -> int:
    """``K = max(1, round(density * num_blocks))``, at most ``num_blocks`` (static).

    Args:
      num_blocks: number of blocks of the sparse tensor.
      density: fraction :math:`d` of active blocks.

    Returns:
      ``K``, a Python int.
    """
    return int(min(num_blocks, max(1, round(float(density) * num_blocks))))


def prune_rate_at(count, total_steps, prune_rate, final_prune_rate):
    """Cosine decay of the prune rate from ``prune_rate`` to ``final_prune_rate``, eq. (4).

    Args:
      count: step count; may be traced.
      total_steps: horizon of the decay (values below 1 count as 1).
      prune_rate: rate at ``count = 0``.
      final_prune_rate: rate from ``count >= total_steps`` on.

    Returns:
      The float32 scalar prune rate.
    """
    frac = jnp.clip(jnp.asarray(count, jnp.float32) / jnp.maximum(total_steps, 1), 0.0, 1.0)
    return final_prune_rate + 0.5 * (prune_rate - final_prune_rate) * (1.0 + jnp.cos(jnp.pi * frac))


def _n_prune(k: int, rate, num_inactive: int):
    keep = jnp.maximum(1, jnp.floor(k * (1.0 - rate)).astype(jnp.int32))
    return jnp.minimum(k - keep, num_inactive)


#: Significant bits the L1 scores keep before ranking (relative resolution 2^-10, about 1e-3).
RANK_BITS = 10


def _rounded_scores(scores):
    """Non-negative float32 scores rounded to ``RANK_BITS`` significant bits (to nearest, on
    the bit pattern, which is monotone for non-negative floats); inf and NaN pass through."""
    s = scores.astype(jnp.float32)
    drop = 23 - RANK_BITS
    bits = jax.lax.bitcast_convert_type(s, jnp.int32)
    bits = (bits + (1 << (drop - 1))) & ~((1 << drop) - 1)
    return jnp.where(jnp.isfinite(s), jax.lax.bitcast_convert_type(bits, jnp.float32), s)


def _slot_ranks(scores, index=None):
    """Rank of each slot by ascending score, rounded to ``RANK_BITS`` bits, ties by ``index``
    (the block index; slot order when ``None``).

    The rounding makes the ranking reproducible across device counts: a data-parallel step
    sums gradients in another order, so the parameters, and the L1 scores, of two runs differ
    in their last bits, which would reorder near-ties. Scores that agree to about 1e-3 are
    tied and ordered by block index instead. (A score whose noise straddles a rounding
    boundary can still move; the two runs agree except for such scores.)
    """
    if index is None:
        index = jnp.arange(scores.shape[0])
    order = jnp.lexsort((index, _rounded_scores(scores)))
    return jnp.zeros_like(order).at[order].set(jnp.arange(order.shape[0], dtype=order.dtype))


def _reset_step(warmup_mode: str, count, k: int):
    value = {"code": 1, "reset": 0}.get(warmup_mode)
    if value is None:  # naive DST: the regrown slot continues with the global count
        return jnp.full((k,), jnp.minimum(count, STEP_MAX), _STEP_DTYPE)
    return jnp.full((k,), value, _STEP_DTYPE)


def topology_update_slots(
    slots: SparseSlots,
    param_blocks: jax.Array,
    key: jax.Array,
    rate,
    count,
    warmup_mode: str = "code",
) -> SparseSlots:
    """Prune the smallest active blocks (L1) and regrow as many random previously-inactive ones.

    Pure function. Regrown blocks take the pruned slots' positions with zero moments and the reset
    step. ``max(1, floor(K (1 - rate)))`` slots are kept (at most as many pruned as there are
    inactive blocks); nothing changes when every block is active.

    Args:
      slots: the leaf's :class:`SparseSlots` (``K`` active blocks).
      param_blocks: the parameter reshaped to ``[num_blocks, block_size]``.
      key: PRNG key of the random regrowth.
      rate: prune fraction of this update, in ``[0, 1]``; may be traced.
      count: global step count; the reset step of regrown slots when ``warmup_mode="none"``.
      warmup_mode: ``"code"`` (regrown slots restart at step 1), ``"reset"`` (at step 0) or
        ``"none"`` (they continue with ``count``).

    Returns:
      The updated :class:`SparseSlots`.
    """
    num_blocks = param_blocks.shape[0]
    k = slots.idx.shape[0]
    num_inactive = num_blocks - k
    if num_inactive == 0:
        return slots
    scores = jnp.sum(jnp.abs(param_blocks[slots.idx]), axis=-1)
    rank = _slot_ranks(scores, slots.idx)
    n_prune = _n_prune(k, rate, num_inactive)
    pruned = rank < n_prune
    # candidates: uniform among blocks inactive before this update
    noise = jax.random.uniform(key, (num_blocks,))
    noise = noise.at[slots.idx].set(-1.0)
    kc = min(k, num_inactive)
    _, cand = jax.lax.top_k(noise, kc)
    new_idx = jnp.where(pruned, cand[jnp.clip(rank, 0, kc - 1)].astype(jnp.int32), slots.idx)
    zero = jnp.zeros_like(slots.mu)
    return SparseSlots(
        idx=new_idx,
        step=jnp.where(pruned, _reset_step(warmup_mode, count, k), slots.step),
        mu=jnp.where(pruned[:, None], zero, slots.mu),
        nu=jnp.where(pruned[:, None], zero, slots.nu),
    )


def _prune_compact(step, mu, nu, values, rate, count, warmup_mode):
    """Topology update of a compact leaf: reset the smallest-L1 slots (the layer regrows them)."""
    k = values.shape[0]
    scores = jnp.sum(jnp.abs(values), axis=-1)
    pruned = _slot_ranks(scores) < _n_prune(k, rate, k)
    zero = jnp.zeros_like(mu)
    return (
        jnp.where(pruned, _reset_step(warmup_mode, count, k), step),
        jnp.where(pruned[:, None], zero, mu),
        jnp.where(pruned[:, None], zero, nu),
        pruned,
    )


def _adam_slots(g, mu, nu, step, b1, b2, eps, warmup_steps, warmup_mode):
    """Per-slot Adam with the stored-moment warm-up of the reference code.

    Step counts and bias corrections are computed in at least float32: in bfloat16, ``b2 = 0.999``
    rounds to 1 and step counts above 256 are not exact.
    """
    mu = b1 * mu + (1.0 - b1) * g  # (1)
    nu = b2 * nu + (1.0 - b2) * (g * g)
    ct = jnp.promote_types(g.dtype, jnp.float32)
    stepf = step.astype(ct)
    while stepf.ndim < g.ndim:
        stepf = stepf[..., None]
    if warmup_mode == "code":
        ramp = jnp.minimum(stepf / jnp.maximum(warmup_steps, 1), 1.0)
        mu = jnp.where(warmup_steps > 1, mu * ramp, mu)  # (2)
    bc1 = 1.0 - jnp.asarray(b1, ct) ** stepf
    bc2 = 1.0 - jnp.asarray(b2, ct) ** stepf
    u = (mu / bc1) / (jnp.sqrt(nu / bc2) + eps)  # (3), without d^-p
    return u, mu, nu


class _LeafInfo(NamedTuple):
    kind: str  # "sparse" | "compact" | "dense"
    num_blocks: int
    k: int


def _leaf_infos(tree, sparse_mask, density, block_size):
    mask = _common.resolve_mask(sparse_mask, tree, _default_sparse_mask, name="sparse_mask")
    leaves = jax.tree_util.tree_flatten_with_path(tree)[0]
    masks = jax.tree.leaves(mask)
    infos = []
    for (path, leaf), sparse in zip(leaves, masks, strict=True):
        if not sparse:
            infos.append(_LeafInfo("dense", 0, 0))
            continue
        if _common.is_compact_sparse(path):
            if leaf.ndim != 2 or leaf.shape[1] != block_size:
                raise ValueError(
                    f"sparse_mask: compact leaf {jax.tree_util.keystr(path)} must have shape "
                    f"(K, block_size={block_size}), got {leaf.shape}"
                )
            infos.append(_LeafInfo("compact", 0, leaf.shape[0]))
            continue
        size = math.prod(leaf.shape)
        if size % block_size:
            raise ValueError(
                f"block_size: {block_size} does not divide the size {size} of sparse leaf "
                f"{jax.tree_util.keystr(path)} with shape {leaf.shape}"
            )
        nb = size // block_size
        infos.append(_LeafInfo("sparse", nb, num_active_blocks(nb, density)))
    return infos


def _default_sparse_mask(path, leaf):
    return _common.is_compact_sparse(path) or _common.default_matrix_mask(path, leaf)


def _validate(b1, b2, eps, density, total_steps, update_every, prune_rate, final_prune_rate,
              optimizer_warmup_steps, lr_density_power, block_size, warmup_mode):
    _common.check_scalar("b1", b1, lo=0.0, hi=1.0, hi_open=True)
    _common.check_scalar("b2", b2, lo=0.0, hi=1.0, hi_open=True)
    _common.check_scalar("eps", eps, lo=0.0)
    if isinstance(density, jax.core.Tracer):
        raise ValueError(
            "density: must be static (it fixes the number of active blocks); pass it in "
            "`static_args` of optax.inject_hyperparams"
        )
    _common.check_scalar("density", density, lo=0.0, hi=1.0, lo_open=True)
    _common.check_scalar("total_steps", total_steps, lo=1.0)
    _common.check_scalar("update_every", update_every, lo=1.0)
    _common.check_scalar("prune_rate", prune_rate, lo=0.0, hi=1.0)
    _common.check_scalar("final_prune_rate", final_prune_rate, lo=0.0, hi=1.0)
    _common.check_scalar("optimizer_warmup_steps", optimizer_warmup_steps, lo=0.0)
    _common.check_scalar("lr_density_power", lr_density_power)
    block_size = _common.check_int("block_size", block_size, lo=1)
    if warmup_mode not in _WARMUP_MODES:
        raise ValueError(f"warmup_mode: expected one of {_WARMUP_MODES}, got {warmup_mode!r}")
    return float(density), block_size


def _scatter_slots(base, slot_values, idx):
    """``base`` (param-shaped) with the active blocks ``idx`` replaced by ``slot_values``."""
    k, bs = slot_values.shape
    flat = jnp.asarray(base).reshape(-1, bs).at[idx].set(slot_values, unique_indices=True)
    return flat.reshape(base.shape)


def scale_by_smet(
    b1: float = 0.9,
    b2: float = 0.999,
    eps: float = 1e-8,
    *,
    density: float,
    total_steps: int,
    update_every: int = 100,
    prune_rate: float = 0.2,
    final_prune_rate: float = 0.005,
    optimizer_warmup_steps: int = 100,
    lr_density_power: float = 1.0,
    block_size: int = 1,
    warmup_mode: str = "code",
    sparse_mask: Any = None,
    key: jax.Array | int,
) -> optax.GradientTransformationExtraArgs:
    r"""SMET's sparse Adam direction and topology controller, without the learning rate.

    Returns :math:`u` of the module docstring at the active entries and 0 at inactive ones; the
    topology update runs inside ``update`` every ``update_every`` steps (``lax.cond``) and needs
    ``params``. This transform does not zero the inactive weights (it has no learning rate to
    cancel); :func:`keep_inactive_zero` does, and :func:`smet` is the usual composition.

    Args:
      b1, b2, eps: Adam hyperparameters (PyTorch/optax eps placement).
      density: fraction :math:`d \in (0, 1]` of active blocks per sparse tensor (static).
      total_steps: horizon of the cosine prune-rate decay.
      update_every: steps between topology updates.
      prune_rate, final_prune_rate: start and end of the cosine-decayed prune fraction.
      optimizer_warmup_steps: :math:`T_w` of the per-slot warm-up (``warmup_mode="code"``).
      lr_density_power: :math:`p` in the density-aware scale :math:`d^{-p}` (sparse leaves only).
      block_size: entries per block (row-major consecutive); 1 is unstructured (static).
      warmup_mode: ``"code"`` (released code), ``"reset"`` (paper text) or ``"none"`` (naive DST).
      sparse_mask: tree of bools / callable choosing sparse leaves; default: ``SparseLinear``
        values and every ``ndim >= 2`` leaf that is not an embedding or LM head.
      key: PRNG key of the initial masks and the random regrowth: a ``jax.random.key``, a raw
        ``uint32[2]`` key or an int seed (``jax.random.key(seed)``).

    Raises:
      ValueError: on out-of-range hyperparameters, a ``block_size`` that does not divide a sparse
        leaf, a ``sparse_mask`` that does not match the params, or ``update`` without ``params``.
    """
    density, block_size = _validate(b1, b2, eps, density, total_steps, update_every, prune_rate,
                                    final_prune_rate, optimizer_warmup_steps, lr_density_power,
                                    block_size, warmup_mode)
    key_data = jax.random.key_data(_common.prng_key(key))

    def init_fn(params):
        infos = _leaf_infos(params, sparse_mask, density, block_size)
        treedef = jax.tree.structure(params)
        idx, step, mu, nu, regrown = [], [], [], [], []
        for i, (p, info) in enumerate(zip(treedef.flatten_up_to(params), infos, strict=True)):
            k = info.k
            idx.append(jnp.zeros((0,), jnp.int32))
            step.append(jnp.zeros((k,), _STEP_DTYPE))
            regrown.append(jnp.zeros((k if info.kind == "compact" else 0,), bool))
            if info.kind == "dense":
                mu.append(jnp.zeros_like(p))
                nu.append(jnp.zeros_like(p))
                continue
            mu.append(jnp.zeros((k, block_size), p.dtype))
            nu.append(jnp.zeros((k, block_size), p.dtype))
            if info.kind == "sparse":
                leaf_key = jax.random.fold_in(key_data, i)
                _, active = jax.lax.top_k(jax.random.uniform(leaf_key, (info.num_blocks,)), k)
                idx[-1] = jnp.sort(active).astype(jnp.int32)
        trees = (treedef.unflatten(x) for x in (idx, step, mu, nu, regrown))
        return ScaleBySmetState(jnp.zeros([], jnp.int32), key_data, *trees)

    def update_fn(updates, state, params=None, **extra_args):
        del extra_args
        if params is None:
            raise ValueError("smet: update(updates, state, params) needs `params`")
        infos = _leaf_infos(updates, sparse_mask, density, block_size)
        treedef = jax.tree.structure(updates)
        leaves = [treedef.flatten_up_to(t) for t in
                  (updates, params, state.idx, state.step, state.mu, state.nu, state.regrown)]
        c = state.count
        do_topo = (c > 0) & (c % jnp.asarray(update_every, jnp.int32) == 0)
        rate = prune_rate_at(c, total_steps, prune_rate, final_prune_rate)
        new_count = optax.safe_increment(c)
        topo_key = jax.random.fold_in(state.key, c)
        new = {f: [] for f in ("u", "idx", "step", "mu", "nu", "regrown")}
        for i, (info, g, p, idx, step, mu, nu, regrown) in enumerate(zip(infos, *leaves,
                                                                        strict=True)):
            if info.kind == "dense":
                u, mu_new, nu_new = _adam_slots(g, mu, nu, new_count, b1, b2, eps,
                                                optimizer_warmup_steps, warmup_mode)
                for f, v in zip(new, (u.astype(g.dtype), idx, step, mu_new.astype(mu.dtype),
                                      nu_new.astype(nu.dtype), regrown), strict=True):
                    new[f].append(v)
                continue
            if info.kind == "compact":
                step, mu, nu, regrown = jax.lax.cond(
                    do_topo,
                    lambda s, p=p: _prune_compact(*s, p, rate, c, warmup_mode),
                    lambda s, r=regrown: (*s, jnp.zeros_like(r)),
                    (step, mu, nu),
                )
                g_slots = g
                dscale = jnp.asarray(density, g.dtype) ** (-lr_density_power)
            else:
                blocks = jnp.asarray(p).reshape(info.num_blocks, block_size)
                leaf_key = jax.random.fold_in(topo_key, i)
                idx, step, mu, nu = jax.lax.cond(
                    do_topo,
                    lambda s, b=blocks, k=leaf_key: topology_update_slots(
                        s, b, k, rate, c, warmup_mode
                    ),
                    lambda s: s,
                    SparseSlots(idx, step, mu, nu),
                )
                g_slots = jnp.asarray(g).reshape(info.num_blocks, block_size)[idx]
                dscale = jnp.asarray((info.k / info.num_blocks) ** (-lr_density_power), g.dtype)
            step_new = jnp.minimum(step, STEP_MAX - 1) + jnp.ones((), _STEP_DTYPE)
            u, mu_new, nu_new = _adam_slots(g_slots, mu, nu, step_new, b1, b2, eps,
                                            optimizer_warmup_steps, warmup_mode)
            u = dscale * u  # (3): the density-aware scale d^-p
            if info.kind == "compact":
                # slots pruned at this step are not updated now (their gradient belongs to the
                # old index); they restart with zero moments at their reset step.
                keep = ~regrown
                u = jnp.where(keep[:, None], u, 0.0)
                mu_new = jnp.where(keep[:, None], mu_new, 0.0)
                nu_new = jnp.where(keep[:, None], nu_new, 0.0)
                step_new = jnp.where(keep, step_new, step)
            else:
                u = _scatter_slots(jnp.zeros_like(g), u.astype(g.dtype), idx)  # 0 off the support
            for f, v in zip(new, (u.astype(g.dtype), idx, step_new, mu_new.astype(mu.dtype),
                                  nu_new.astype(nu.dtype), regrown), strict=True):
                new[f].append(v)
        trees = {f: treedef.unflatten(v) for f, v in new.items()}
        u = trees.pop("u")
        return u, ScaleBySmetState(new_count, state.key, **trees)

    return optax.GradientTransformationExtraArgs(init_fn, update_fn)


def _active_mask(idx, block_size: int, shape) -> jax.Array:
    """Bool array of ``shape``: True on the active blocks ``idx`` (row-major blocks)."""
    nb = math.prod(shape) // block_size
    m = jnp.zeros((nb,), bool).at[idx].set(True, unique_indices=True)
    return jnp.broadcast_to(m[:, None], (nb, block_size)).reshape(shape)


def _find_state(state) -> ScaleBySmetState:
    """The :class:`ScaleBySmetState` inside an optimizer state (a chain's, an injected one...)."""
    found = [x for x in jax.tree.leaves(state, is_leaf=lambda x: isinstance(x, ScaleBySmetState))
             if isinstance(x, ScaleBySmetState)]
    if len(found) != 1:
        raise ValueError(
            f"state: expected an optimizer state holding one ScaleBySmetState, found {len(found)}"
        )
    return found[0]


def _leaf_kinds(s: ScaleBySmetState, params):
    """``(treedef, [(kind, idx, step, mu, nu, regrown) per leaf])``, kind sparse/compact/dense."""
    treedef = jax.tree.structure(params)
    out = []
    for idx, step, mu, nu, regrown in zip(*(treedef.flatten_up_to(t) for t in
                                            (s.idx, s.step, s.mu, s.nu, s.regrown)), strict=True):
        kind = "sparse" if idx.shape[0] else "compact" if regrown.shape[0] else "dense"
        out.append((kind, idx, step, mu, nu, regrown))
    return treedef, out


def keep_inactive_zero(
    inner: optax.GradientTransformation,
) -> optax.GradientTransformationExtraArgs:
    """Make the weights SMET leaves inactive exactly zero after every step.

    After ``inner``'s update, the update of every entry of a sparse leaf outside the (new) active
    blocks, and of every compact slot pruned at this step, becomes ``-p``, so ``apply_updates``
    leaves exactly 0 there. The state is ``inner``'s, unchanged.

    Args:
      inner: a transformation whose state holds one :class:`ScaleBySmetState`, typically
        ``chain(scale_by_smet(...), scale_by_learning_rate(lr))``.

    Returns:
      An ``optax.GradientTransformationExtraArgs`` whose ``update`` needs ``params``.

    Raises:
      ValueError: from ``update``, when it is called without ``params``.
    """
    inner = optax.with_extra_args_support(inner)

    def update_fn(updates, state, params=None, **extra_args):
        if params is None:
            raise ValueError("smet: update(updates, state, params) needs `params`")
        updates, state = inner.update(updates, state, params, **extra_args)
        treedef, kinds = _leaf_kinds(_find_state(state), params)
        out = []
        for u, p, (kind, idx, _, mu, _, regrown) in zip(treedef.flatten_up_to(updates),
                                                        treedef.flatten_up_to(params), kinds,
                                                        strict=True):
            if kind == "sparse":
                # -p off the active blocks (inactive and just-pruned entries become exactly 0);
                # a select, which XLA fuses with the learning-rate scaling and apply_updates.
                active = _active_mask(idx, mu.shape[1], p.shape)
                u = jnp.where(active, u, -jnp.asarray(p).astype(u.dtype))
            elif kind == "compact":
                u = jnp.where(regrown[:, None], -jnp.asarray(p).astype(u.dtype), u)
            out.append(u)
        return treedef.unflatten(out), state

    return optax.GradientTransformationExtraArgs(inner.init, update_fn)


def active_masks(state, params) -> Any:
    """Tree like ``params``: bool arrays marking active entries of sparse leaves, ``None`` else.

    Args:
      state: any optimizer state holding one :class:`ScaleBySmetState` (that of :func:`smet`, of a
        chain around it, of ``optax.inject_hyperparams(smet)``...).
      params: the parameters the state was built for.

    Returns:
      A tree of the structure of ``params``: a bool array of each sparse leaf's shape, ``None`` for
      the other leaves.
    """
    treedef, kinds = _leaf_kinds(_find_state(state), params)
    out = []
    for p, (kind, idx, _, mu, _, _) in zip(treedef.flatten_up_to(params), kinds, strict=True):
        out.append(_active_mask(idx, mu.shape[1], p.shape) if kind == "sparse" else None)
    return treedef.unflatten(out)


def sparsify(params, state) -> Any:
    """Zero the inactive entries of the sparse leaves (e.g. right after ``init``).

    Args:
      params: the parameters.
      state: an optimizer state holding one :class:`ScaleBySmetState` (see :func:`active_masks`).

    Returns:
      ``params`` with the inactive entries of the sparse leaves set to zero, other leaves as given.
    """
    masks = active_masks(state, params)
    return jax.tree.map(
        lambda p, m: p if m is None else jnp.where(m, p, jnp.zeros_like(p)),
        params,
        masks,
        is_leaf=lambda x: x is None,
    )


def smet_regrown(state, params) -> Any:
    """Tree like ``params``: ``bool[K]`` of slots pruned at the last step for compact leaves.

    Pass it to ``jaxlib_ext.optim.smet_layer.regrow_sparse_indices`` after each step.

    Args:
      state: an optimizer state holding one :class:`ScaleBySmetState` (see :func:`active_masks`).
      params: the parameters the state was built for.

    Returns:
      A tree of the structure of ``params``: ``bool[K]`` for compact leaves, ``None`` for the
      others.
    """
    treedef, kinds = _leaf_kinds(_find_state(state), params)
    return treedef.unflatten([r if kind == "compact" else None for kind, *_, r in kinds])


def smet(
    learning_rate: optax.ScalarOrSchedule,
    b1: float = 0.9,
    b2: float = 0.999,
    eps: float = 1e-8,
    *,
    density: float,
    total_steps: int,
    update_every: int = 100,
    prune_rate: float = 0.2,
    final_prune_rate: float = 0.005,
    optimizer_warmup_steps: int = 100,
    lr_density_power: float = 1.0,
    block_size: int = 1,
    warmup_mode: str = "code",
    sparse_mask: Any = None,
    key: jax.Array | int,
) -> optax.GradientTransformationExtraArgs:
    r"""SMET optimizer (arXiv 2606.00888): dynamic sparse training with compact Adam state.

    ``keep_inactive_zero(chain(scale_by_smet(...), scale_by_learning_rate(learning_rate)))``: the
    parameters move by :math:`-\eta_t u` at the active entries and every inactive entry of a sparse
    leaf (and every compact slot pruned this step) is set to exactly zero. ``update`` needs
    ``params``. The released runs use ``density=0.5`` with lr 2e-3 (130M, 350M) and
    ``update_every=100``. With ``optax.inject_hyperparams`` pass
    ``static_args=("density", "block_size")``: ``inject_hyperparams`` turns every numeric argument
    into an array, defaults included, and these two fix the state's shapes.

    Args:
      learning_rate: :math:`\eta_t`, a non-negative scalar or an optax schedule.
      b1, b2, eps: Adam hyperparameters (PyTorch/optax eps placement).
      density: fraction :math:`d \in (0, 1]` of active blocks per sparse tensor (static).
      total_steps: horizon of the cosine prune-rate decay.
      update_every: steps between topology updates.
      prune_rate, final_prune_rate: start and end of the cosine-decayed prune fraction.
      optimizer_warmup_steps: :math:`T_w` of the per-slot warm-up (``warmup_mode="code"``).
      lr_density_power: :math:`p` in the density-aware scale :math:`d^{-p}` (sparse leaves only).
      block_size: entries per block (row-major consecutive); 1 is unstructured (static).
      warmup_mode: ``"code"`` (released code), ``"reset"`` (paper text) or ``"none"`` (naive DST).
      sparse_mask: tree of bools / callable choosing sparse leaves; default: ``SparseLinear``
        values and every ``ndim >= 2`` leaf that is not an embedding or LM head.
      key: PRNG key of the initial masks and the random regrowth: a ``jax.random.key``, a raw
        ``uint32[2]`` key or an int seed (``jax.random.key(seed)``).

    Returns:
      An ``optax.GradientTransformationExtraArgs`` whose ``update`` needs ``params``.

    Raises:
      ValueError: on a bad ``learning_rate`` or any error of :func:`scale_by_smet`.

    References:
      SMET, arXiv 2606.00888.

    Example:
      >>> import jax, jax.numpy as jnp
      >>> from jaxlib_ext.optim import smet
      >>> params = {"w": jnp.ones((8, 6)), "b": jnp.zeros(6)}
      >>> opt = smet(1e-3, density=0.5, total_steps=1000, key=jax.random.key(0))
      >>> state = opt.init(params)
      >>> state[0].mu["w"].shape  # 24 of the 48 entries of "w"
      (24, 1)
    """
    _common.check_learning_rate(learning_rate)
    return keep_inactive_zero(optax.chain(
        scale_by_smet(
            b1, b2, eps, density=density, total_steps=total_steps, update_every=update_every,
            prune_rate=prune_rate, final_prune_rate=final_prune_rate,
            optimizer_warmup_steps=optimizer_warmup_steps, lr_density_power=lr_density_power,
            block_size=block_size, warmup_mode=warmup_mode, sparse_mask=sparse_mask, key=key,
        ),
        optax.scale_by_learning_rate(learning_rate),
    ))
