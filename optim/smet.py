r"""SMET: dynamic sparse training with compact, per-slot Adam state (arXiv 2606.00888).

Xiao, Wu, Okanovic, Sternal, van Keulen, Mocanu, Pechenizkiy, Mocanu, Hoefler, "Memory-Efficient
LLM(s) Training with Dynamic Sparsity: From Stability to Practical Scaling", ICML 2026. Semantics
follow the released ``Adam_block`` optimizer and ``Masking`` controller (``sparselearning/``),
with the paper-text variants as options (``shared/papers/optimizers.md`` section 2).

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
        \quad v \leftarrow \beta_2 v + (1-\beta_2) g^2 \\
   m &\leftarrow m \cdot \min(t_k / T_w, 1) \quad (\texttt{warmup\_mode="code"}, T_w > 1;
        \text{ the stored moment, compounding, as the released code}) \\
   u &= d^{-p}\; \frac{m / (1-\beta_1^{t_k})}{\sqrt{v / (1-\beta_2^{t_k})} + \epsilon}

with the density-aware scale :math:`d^{-p}` (``lr_density_power`` :math:`p`, default 1 as the
released scripts' ``lr \propto 1/d``; a secondary source says :math:`p = 1/2`, unverified).

**Topology update** every ``update_every`` steps, a pure function of (params, state, key):
score active blocks by the L1 norm of their weights, prune the
``K - max(1, floor(K (1 - r_t)))`` smallest, regrow as many blocks drawn uniformly among the blocks
inactive *before* the update (a pruned block cannot come straight back), in the pruned slots'
places, with :math:`m = v = 0` and a reset step. The prune rate :math:`r_t` decays by a cosine from
``prune_rate`` to ``final_prune_rate`` over ``total_steps``. Step reset: ``"code"`` sets 1 (so the
first update uses :math:`t = 2` and the warm-up above; first update :math:`\approx 0.0149\,
\eta\,\mathrm{sign}(g)`), ``"reset"`` sets 0 (first update uses :math:`t=1`: :math:`1.0\,\eta\,
\mathrm{sign}(g)`, the paper's description), ``"none"`` keeps the global count (naive DST:
:math:`\approx 3.162\,\eta\,\mathrm{sign}(g)`, the cold start the paper identifies).

**Timing choice.** The reference code updates the topology right after step :math:`t`. Here the
update runs at the start of step :math:`t+1` on the same parameters, so ``scale_by_smet`` needs no
learning rate; the only difference is that the gradient of step :math:`t+1` was computed before the
pruned weights were zeroed (their update is then ``-p``).

**Compact layers.** A leaf whose key path ends in ``"sparse_values"`` is the ``[K, block_size]``
value array of a :class:`jaxlib_ext.models.sparse_linear.SparseLinear` layer, which owns the block
indices. SMET keeps per-slot state for it, prunes slots by L1 norm at topology updates (their
values are zeroed, their moments and step reset) and marks them in ``state.slots[i].regrown``;
``jaxlib_ext.models.sparse_linear.regrow_sparse_indices(model, smet_regrown(state, params), key)``
then draws the new block indices inside the layer (models never import optim).
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxlib_ext.optim import _common

_WARMUP_MODES = ("code", "reset", "none")
#: per-slot step counters are int16 and saturate here (as ``Adam_block``'s int16 counters)
STEP_MAX = 32765
_STEP_DTYPE = jnp.int16


class SparseSlots(NamedTuple):
    """Per-slot state of a dense tensor trained with a mask (``K`` active blocks)."""

    idx: jax.Array  # int32[K] active block indices (slot order, not sorted after regrowth)
    step: jax.Array  # int16[K] per-slot step counter, clamped at STEP_MAX
    mu: jax.Array  # [K, block_size]
    nu: jax.Array  # [K, block_size]


class CompactSlots(NamedTuple):
    """Per-slot state of a ``SparseLinear`` value leaf ``[K, block_size]``."""

    step: jax.Array  # int16[K]
    mu: jax.Array
    nu: jax.Array
    regrown: jax.Array  # bool[K], True only in the state returned by a topology-update step


class DenseMoments(NamedTuple):
    """Plain Adam moments of a dense leaf (uses the global count)."""

    mu: jax.Array
    nu: jax.Array


class ScaleBySmetState(NamedTuple):
    """State of :func:`scale_by_smet`.

    Attributes:
      count: global step count (int32).
      key: raw PRNG key data (uint32[2]) used, folded with the count, by topology updates.
      slots: tuple with one entry per params leaf (flattening order): ``SparseSlots``,
        ``CompactSlots`` or ``DenseMoments``.
    """

    count: jax.Array
    key: jax.Array
    slots: tuple


class SmetState(NamedTuple):
    """State of :func:`smet`: the inner :class:`ScaleBySmetState`."""

    inner: ScaleBySmetState


def _key_data(key) -> jax.Array:
    if isinstance(key, jax.core.Tracer):
        return key
    if not isinstance(key, (jax.Array, np.ndarray)):
        raise ValueError(f"key: expected a jax.random key, got {type(key).__name__}")
    if jnp.issubdtype(key.dtype, jax.dtypes.prng_key):
        if key.shape != ():
            raise ValueError(f"key: expected a single PRNG key, got shape {key.shape}")
        return jax.random.key_data(key)
    if key.dtype != jnp.uint32 or key.shape != (2,):
        raise ValueError(
            f"key: expected a jax.random.key or a uint32[2] PRNGKey, got {key.dtype}{key.shape}"
        )
    return jnp.asarray(key)


def num_active_blocks(num_blocks: int, density: float) -> int:
    """``K = max(1, round(density * num_blocks))`` (static)."""
    return int(min(num_blocks, max(1, round(float(density) * num_blocks))))


def prune_rate_at(count, total_steps, prune_rate, final_prune_rate):
    """Cosine decay of the prune rate from ``prune_rate`` to ``final_prune_rate``."""
    frac = jnp.clip(jnp.asarray(count, jnp.float32) / jnp.maximum(total_steps, 1), 0.0, 1.0)
    return final_prune_rate + 0.5 * (prune_rate - final_prune_rate) * (1.0 + jnp.cos(jnp.pi * frac))


def _n_prune(k: int, rate, num_inactive: int):
    keep = jnp.maximum(1, jnp.floor(k * (1.0 - rate)).astype(jnp.int32))
    return jnp.minimum(k - keep, num_inactive)


def _slot_ranks(scores):
    """Rank of each slot by ascending score (ties by slot order)."""
    order = jnp.argsort(scores, stable=True)
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

    Pure function. ``param_blocks`` is the parameter reshaped to ``[num_blocks, block_size]``.
    Regrown blocks take the pruned slots' positions with zero moments and the reset step.
    """
    num_blocks = param_blocks.shape[0]
    k = slots.idx.shape[0]
    num_inactive = num_blocks - k
    if num_inactive == 0:
        return slots
    scores = jnp.sum(jnp.abs(param_blocks[slots.idx]), axis=-1)
    rank = _slot_ranks(scores)
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


def _prune_compact(slots: CompactSlots, values, rate, count, warmup_mode):
    k = values.shape[0]
    scores = jnp.sum(jnp.abs(values), axis=-1)
    pruned = _slot_ranks(scores) < _n_prune(k, rate, k)
    zero = jnp.zeros_like(slots.mu)
    return CompactSlots(
        step=jnp.where(pruned, _reset_step(warmup_mode, count, k), slots.step),
        mu=jnp.where(pruned[:, None], zero, slots.mu),
        nu=jnp.where(pruned[:, None], zero, slots.nu),
        regrown=pruned,
    )


def _adam_slots(g, mu, nu, step, b1, b2, eps, warmup_steps, warmup_mode):
    """Per-slot Adam with the stored-moment warm-up of the reference code."""
    mu = b1 * mu + (1.0 - b1) * g
    nu = b2 * nu + (1.0 - b2) * (g * g)
    stepf = step.astype(g.dtype)
    while stepf.ndim < g.ndim:
        stepf = stepf[..., None]
    if warmup_mode == "code":
        ramp = jnp.minimum(stepf / jnp.maximum(warmup_steps, 1), 1.0)
        mu = jnp.where(warmup_steps > 1, mu * ramp, mu)
    bc1 = 1.0 - jnp.asarray(b1, g.dtype) ** stepf
    bc2 = 1.0 - jnp.asarray(b2, g.dtype) ** stepf
    u = (mu / bc1) / (jnp.sqrt(nu / bc2) + eps)
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


def _smet_core(
    b1, b2, eps, *, density, total_steps, update_every, prune_rate, final_prune_rate,
    optimizer_warmup_steps, lr_density_power, block_size, warmup_mode, sparse_mask, key,
):
    """Validated ``(init_fn, slot_update_fn)`` shared by :func:`scale_by_smet` and :func:`smet`."""
    density, block_size = _validate(b1, b2, eps, density, total_steps, update_every, prune_rate,
                                    final_prune_rate, optimizer_warmup_steps, lr_density_power,
                                    block_size, warmup_mode)
    key_data = _key_data(key)

    def init_fn(params):
        infos = _leaf_infos(params, sparse_mask, density, block_size)
        leaves = jax.tree.leaves(params)
        slots = []
        for i, (p, info) in enumerate(zip(leaves, infos, strict=True)):
            if info.kind == "dense":
                slots.append(DenseMoments(jnp.zeros_like(p), jnp.zeros_like(p)))
                continue
            k = info.k
            zeros = jnp.zeros((k, block_size), p.dtype)
            step = jnp.zeros((k,), _STEP_DTYPE)
            if info.kind == "compact":
                slots.append(CompactSlots(step, zeros, zeros, jnp.zeros((k,), bool)))
                continue
            leaf_key = jax.random.fold_in(key_data, i)
            _, idx = jax.lax.top_k(jax.random.uniform(leaf_key, (info.num_blocks,)), k)
            slots.append(SparseSlots(jnp.sort(idx).astype(jnp.int32), step, zeros, zeros))
        return ScaleBySmetState(jnp.zeros([], jnp.int32), key_data, tuple(slots))

    def slot_update_fn(updates, state, params):
        """Core step: dense-shaped updates for dense/compact leaves, ``[K, bs]`` for sparse."""
        if params is None:
            raise ValueError("smet: update(updates, state, params) needs `params`")
        infos = _leaf_infos(updates, sparse_mask, density, block_size)
        treedef = jax.tree.structure(updates)
        g_leaves = treedef.flatten_up_to(updates)
        p_leaves = treedef.flatten_up_to(params)
        c = state.count
        do_topo = (c > 0) & (c % jnp.asarray(update_every, jnp.int32) == 0)
        rate = prune_rate_at(c, total_steps, prune_rate, final_prune_rate)
        new_count = optax.safe_increment(c)
        topo_key = jax.random.fold_in(state.key, c)
        out, new_slots = [], []
        for i, (g, p, s, info) in enumerate(
            zip(g_leaves, p_leaves, state.slots, infos, strict=True)
        ):
            if info.kind == "dense":
                u, mu, nu = _adam_slots(g, s.mu, s.nu, new_count, b1, b2, eps,
                                        optimizer_warmup_steps, warmup_mode)
                out.append(u.astype(g.dtype))
                new_slots.append(DenseMoments(mu.astype(s.mu.dtype), nu.astype(s.nu.dtype)))
                continue
            dscale = None
            if info.kind == "compact":
                s = jax.lax.cond(
                    do_topo,
                    lambda s, p=p: _prune_compact(s, p, rate, c, warmup_mode),
                    lambda s: s._replace(regrown=jnp.zeros_like(s.regrown)),
                    s,
                )
                g_slots = g
                dscale = jnp.asarray(density, g.dtype) ** (-lr_density_power)
            else:
                blocks = jnp.asarray(p).reshape(info.num_blocks, block_size)
                leaf_key = jax.random.fold_in(topo_key, i)
                s = jax.lax.cond(
                    do_topo,
                    lambda s, b=blocks, k=leaf_key: topology_update_slots(
                        s, b, k, rate, c, warmup_mode
                    ),
                    lambda s: s,
                    s,
                )
                g_slots = jnp.asarray(g).reshape(info.num_blocks, block_size)[s.idx]
                d_leaf = info.k / info.num_blocks
                dscale = jnp.asarray(d_leaf ** (-lr_density_power), g.dtype)
            step = jnp.minimum(s.step, STEP_MAX - 1) + jnp.ones((), _STEP_DTYPE)
            u, mu, nu = _adam_slots(g_slots, s.mu, s.nu, step, b1, b2, eps,
                                    optimizer_warmup_steps, warmup_mode)
            u = dscale * u
            if info.kind == "compact":
                # slots pruned at this step are not updated now (their gradient belongs to the
                # old index); they restart with zero moments at their reset step.
                keep = ~s.regrown
                u = jnp.where(keep[:, None], u, 0.0)
                mu = jnp.where(keep[:, None], mu, 0.0)
                nu = jnp.where(keep[:, None], nu, 0.0)
                step = jnp.where(keep, step, s.step)
                out.append(u.astype(g.dtype))
                new_slots.append(CompactSlots(step, mu.astype(s.mu.dtype),
                                              nu.astype(s.nu.dtype), s.regrown))
            else:
                out.append(u.astype(g.dtype))
                new_slots.append(SparseSlots(s.idx, step, mu.astype(s.mu.dtype),
                                             nu.astype(s.nu.dtype)))
        return out, ScaleBySmetState(new_count, state.key, tuple(new_slots)), treedef

    return init_fn, slot_update_fn


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
    key: jax.Array,
) -> optax.GradientTransformation:
    r"""SMET's sparse Adam direction and topology controller, without the learning rate.

    Returns :math:`u` of the module docstring at the active entries and 0 at inactive ones; the
    topology update runs inside ``update`` every ``update_every`` steps (``lax.cond``) and needs
    ``params``. This transform does not zero pruned weights (it has no learning rate to cancel);
    :func:`smet` does, and is what you normally want. See :mod:`jaxlib_ext.optim.smet`.

    Args:
      b1, b2, eps: Adam hyperparameters (PyTorch/optax eps placement).
      density: fraction :math:`d \in (0, 1]` of active blocks per sparse tensor (static).
      total_steps: horizon of the cosine prune-rate decay.
      update_every: steps between topology updates.
      prune_rate, final_prune_rate: start and end of the cosine-decayed prune fraction.
      optimizer_warmup_steps: :math:`T_w` of the per-slot warm-up (``warmup_mode="code"``).
      lr_density_power: :math:`p` in the density-aware scale :math:`d^{-p}` (sparse leaves only).
      block_size: entries per block (row-major consecutive); 1 is unstructured.
      warmup_mode: ``"code"`` (released code), ``"reset"`` (paper text) or ``"none"`` (naive DST).
      sparse_mask: tree of bools / callable choosing sparse leaves; default: ``SparseLinear``
        values and every ``ndim >= 2`` leaf that is not an embedding or LM head.
      key: PRNG key for the initial masks and the random regrowth.
    """
    init_fn, slot_update_fn = _smet_core(
        b1, b2, eps, density=density, total_steps=total_steps, update_every=update_every,
        prune_rate=prune_rate, final_prune_rate=final_prune_rate,
        optimizer_warmup_steps=optimizer_warmup_steps, lr_density_power=lr_density_power,
        block_size=block_size, warmup_mode=warmup_mode, sparse_mask=sparse_mask, key=key,
    )

    def update_fn(updates, state, params=None):
        out, new_state, treedef = slot_update_fn(updates, state, params)
        g_leaves = treedef.flatten_up_to(updates)
        out = [
            _scatter_slots(jnp.zeros_like(g), u, s.idx) if isinstance(s, SparseSlots) else u
            for u, g, s in zip(out, g_leaves, new_state.slots, strict=True)
        ]
        return treedef.unflatten(out), new_state

    return optax.GradientTransformation(init_fn, update_fn)


def active_masks(state: ScaleBySmetState | SmetState, params) -> Any:
    """Tree like ``params``: bool arrays marking active entries of sparse leaves, ``None`` else."""
    if isinstance(state, SmetState):
        state = state.inner
    treedef = jax.tree.structure(params)
    out = []
    for p, s in zip(treedef.flatten_up_to(params), state.slots, strict=True):
        if isinstance(s, SparseSlots):
            nb = math.prod(p.shape) // s.mu.shape[1]
            m = jnp.zeros((nb,), bool).at[s.idx].set(True)
            out.append(jnp.broadcast_to(m[:, None], (nb, s.mu.shape[1])).reshape(p.shape))
        else:
            out.append(None)
    return treedef.unflatten(out)


def sparsify(params, state: ScaleBySmetState | SmetState) -> Any:
    """Zero the inactive entries of the sparse leaves (e.g. right after ``init``)."""
    masks = active_masks(state, params)
    return jax.tree.map(
        lambda p, m: p if m is None else jnp.where(m, p, jnp.zeros_like(p)),
        params,
        masks,
        is_leaf=lambda x: x is None,
    )


def smet_regrown(state: ScaleBySmetState | SmetState, params) -> Any:
    """Tree like ``params``: ``bool[K]`` of slots pruned at the last step for compact leaves.

    Pass it to ``jaxlib_ext.models.sparse_linear.regrow_sparse_indices`` after each step.
    """
    if isinstance(state, SmetState):
        state = state.inner
    treedef = jax.tree.structure(params)
    out = [s.regrown if isinstance(s, CompactSlots) else None for s in state.slots]
    return treedef.unflatten(out)


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
    key: jax.Array,
) -> optax.GradientTransformation:
    r"""SMET optimizer (arXiv 2606.00888): dynamic sparse training with compact Adam state.

    Wraps :func:`scale_by_smet`, multiplies by :math:`-\eta_t` (``learning_rate`` may be an optax
    schedule, evaluated at the step count) and returns ``-p`` at every inactive entry of a sparse
    leaf (and at compact slots pruned this step), so inactive weights are exactly zero after every
    step. ``update`` needs ``params``. The released runs use ``density=0.5`` with lr 2e-3 (130M,
    350M) and ``update_every=100``. With ``optax.inject_hyperparams`` pass ``density``,
    ``block_size``, ``warmup_mode`` and ``key`` in ``static_args``.

    Example:
      >>> import jax, jax.numpy as jnp
      >>> from jaxlib_ext.optim import smet
      >>> params = {"w": jnp.ones((8, 6)), "b": jnp.zeros(6)}
      >>> opt = smet(1e-3, density=0.5, total_steps=1000, key=jax.random.key(0))
      >>> state = opt.init(params)
      >>> state.inner.slots[1].mu.shape  # 24 of the 48 entries of "w" (leaves sorted: b, w)
      (24, 1)
    """
    _common.check_learning_rate(learning_rate)
    core_init, slot_update_fn = _smet_core(
        b1, b2, eps, density=density, total_steps=total_steps, update_every=update_every,
        prune_rate=prune_rate, final_prune_rate=final_prune_rate,
        optimizer_warmup_steps=optimizer_warmup_steps, lr_density_power=lr_density_power,
        block_size=block_size, warmup_mode=warmup_mode, sparse_mask=sparse_mask, key=key,
    )

    def init_fn(params):
        return SmetState(core_init(params))

    def update_fn(updates, state, params=None):
        if params is None:
            raise ValueError("smet: update(updates, state, params) needs `params`")
        lr = _common.lr_at(learning_rate, state.inner.count)
        out, new_inner, treedef = slot_update_fn(updates, state.inner, params)
        new = []
        for du, p, s in zip(out, treedef.flatten_up_to(params), new_inner.slots, strict=True):
            step = (-jnp.asarray(lr, du.dtype)) * du
            if isinstance(s, SparseSlots):
                # -p everywhere (inactive and just-pruned entries become exactly 0), the Adam
                # step at the active blocks: a single scatter.
                step = _scatter_slots(-p.astype(du.dtype), step, s.idx)
            elif isinstance(s, CompactSlots):
                step = jnp.where(s.regrown[:, None], -p.astype(du.dtype), step)
            new.append(step)
        return treedef.unflatten(new), SmetState(new_inner)

    return optax.GradientTransformation(init_fn, update_fn)
