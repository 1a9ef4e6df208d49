"""Orthogonal growth of a trained mixture-of-experts checkpoint (arXiv 2510.08008).

Two growths, applied to the parameters of a :class:`~jaxlib_ext.models.LanguageModel` that a
checkpoint of the training CLI holds, and composable (hence "orthogonal"):

* **Depth by interposition** (arXiv 2510.08008): every block is copied and the
  copy placed right after its original, ``L1, L1', L2, L2', ...``: the grown block ``j`` is the
  parent's block ``j // 2`` (:func:`interposition_order`; :func:`stacking_order`, the whole stack
  appended again, is the paper's contrast). Plain copying is not function-preserving (each
  residual increment is applied twice); the loss bumps and recovers.
* **Width by expert duplication with noise**: every expert ``e`` of every
  mixture-of-experts FFN gets a copy ``e + N`` (``N -> 2N``); the router's rows and the
  correction bias are duplicated exactly, and Gaussian noise of standard deviation
  ``noise_scale * std(W_e)`` is added to the copies' expert matrices to break the symmetry.
  With ``double_top_k`` the top-k doubles too; then, before noise, each selected expert is
  selected with its copy at the same sigmoid score, the normalised weights of the two sum to
  the parent's weight and the layer computes exactly the parent's function (LatentMoE's
  weights are normalised over the selected experts, arXiv 2601.18089). The paper does not fix
  the noise level or whether top-k doubles; both are options here (default: ``noise_scale =
  0.01``, top-k doubled).

Expert axes are found from the parameters' ``logical_axes`` metadata (the axis named
``"expert"``) or else as the one axis of size ``num_experts`` (the router, the bias); a leaf of
three or more dimensions with an expert axis is an expert matrix and receives the noise.

:func:`grow_checkpoint` reads the newest checkpoint of a training run (its parameters, its
``nnx.BatchStat`` state and the composed config recorded with it), grows them and writes a
checkpoint (step 0, no optimizer state) that a new run starts from with
``python -m jaxlib_ext train --init-from DIR``; from the shell::

    python -m jaxlib_ext grow runs/moe/checkpoints runs/moe_grown [--noise-scale 0.01]
        [--no-depth] [--no-width] [--keep-top-k] [--seed 0]
"""

from __future__ import annotations

import pathlib

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxlib_ext.models._backbone import LanguageModel
from jaxlib_ext.models.lm import LMConfig, build_lm

__all__ = [
    "interposition_order",
    "stacking_order",
    "grow_config",
    "grow_state",
    "grow_model",
    "read_checkpoint",
    "load_model",
    "grow_checkpoint",
]


def interposition_order(n_layers: int) -> list[int]:
    """Parent block of each grown block under interposition: ``[0, 0, 1, 1, ...]`` (layer ``i``
    at ``2i`` and ``2i + 1``)."""
    if not isinstance(n_layers, int) or n_layers <= 0:
        raise ValueError(f"interposition_order: n_layers must be a positive int, got {n_layers!r}")
    return [j // 2 for j in range(2 * n_layers)]


def stacking_order(n_layers: int) -> list[int]:
    """Parent block of each grown block under stacking: ``[0, ..., n-1, 0, ..., n-1]``."""
    if not isinstance(n_layers, int) or n_layers <= 0:
        raise ValueError(f"stacking_order: n_layers must be a positive int, got {n_layers!r}")
    return list(range(n_layers)) * 2


def grow_config(cfg: LMConfig, *, depth: bool = True, width: bool = True,
                double_top_k: bool = True) -> LMConfig:
    """The grown model's config: ``2 n_layers`` (depth), ``2 num_experts`` and, with
    ``double_top_k``, ``2 top_k`` (width; only for a mixture-of-experts FFN)."""
    if not isinstance(cfg, LMConfig):
        raise TypeError(f"grow_config: cfg must be an LMConfig, got {type(cfg).__name__}")
    if width and not cfg.is_moe:
        raise ValueError(f"grow_config: width growth needs a moe or latent_moe FFN, got "
                         f"ffn {cfg.ffn_name!r}")
    new = {}
    if depth:
        new["n_layers"] = 2 * cfg.n_layers
    if width:
        new["num_experts"] = 2 * cfg.num_experts
        if double_top_k:
            new["top_k"] = 2 * cfg.top_k
    return cfg.replace(**new)


def _expert_axis(name, var, num_experts: int) -> int | None:
    axes = var.get_metadata().get("logical_axes")
    shape = np.shape(var.get_value())
    if axes is not None and "expert" in axes:
        return list(axes).index("expert")
    if name == "router":  # [d, E]: its expert axis stays replicated, so it is not named
        return len(shape) - 1
    if axes is not None:  # the layer names its axes: trust them, not a coincidence of sizes
        return None
    hits = [i for i, n in enumerate(shape) if n == num_experts]
    return hits[0] if len(hits) == 1 else None


def _grow_leaf(path, var, parent_flat, order, cfg, width, noise_scale, key):
    path = tuple(path)
    src = path
    if path[0] == "blocks":
        src = ("blocks", order[path[1]], *path[2:])
    value = jnp.asarray(parent_flat[src].get_value())
    in_ffn = path[0] == "blocks" and path[2] == "mlp"
    if not (width and in_ffn):
        return value
    axis = _expert_axis(path[-1], parent_flat[src], cfg.num_experts)
    if axis is None:  # a shared weight of the layer (projections, shared expert)
        return value
    copy = value
    if value.ndim >= 3 and noise_scale > 0:  # an expert matrix: noise on the copies
        scale = jnp.std(value, axis=tuple(i for i in range(value.ndim) if i != axis),
                        keepdims=True)
        noise = jax.random.normal(key, value.shape, jnp.float32)
        copy = (value + noise_scale * scale * noise).astype(value.dtype)
    return jnp.concatenate([value, copy], axis=axis)


def grow_state(cfg: LMConfig, params: nnx.State, model_state: nnx.State | None = None, *,
               depth: bool = True, width: bool = True, noise_scale: float = 0.01,
               double_top_k: bool = True, key: jax.Array | None = None, order=None):
    """Grown ``(config, params, model_state)`` of a :class:`LanguageModel`'s states.

    Args:
      cfg: the parent's :class:`LMConfig`.
      params, model_state: the parent's ``nnx.Param`` and ``nnx.BatchStat`` states (the latter
        ``None`` when it has none).
      depth, width, double_top_k: which growths (see the module docstring).
      noise_scale: the copies' noise, relative to each expert matrix's standard deviation.
      key: PRNG key of the noise (required when ``width`` and ``noise_scale > 0``).
      order: parent block of each grown block (default :func:`interposition_order`).
    """
    new_cfg = grow_config(cfg, depth=depth, width=width, double_top_k=double_top_k)
    if noise_scale < 0:
        raise ValueError(f"grow_state: noise_scale must be >= 0, got {noise_scale}")
    if width and noise_scale > 0 and key is None:
        raise ValueError("grow_state: key is required for width growth with noise_scale > 0")
    if order is None:
        order = interposition_order(cfg.n_layers) if depth else list(range(cfg.n_layers))
    if len(order) != new_cfg.n_layers or not all(0 <= i < cfg.n_layers for i in order):
        raise ValueError(f"grow_state: order must give a parent block in [0, {cfg.n_layers}) "
                         f"for each of the {new_cfg.n_layers} grown blocks, got {order}")
    grown = nnx.eval_shape(lambda: build_lm(new_cfg, rngs=nnx.Rngs(0)))
    _, g_params, g_state, _ = nnx.split(grown, nnx.Param, nnx.BatchStat, ...)
    key = jax.random.key(0) if key is None else key

    def grow(parent, target):
        if parent is None:
            return None
        parent_flat = dict(nnx.to_flat_state(parent))
        out = []
        for i, (path, var) in enumerate(nnx.to_flat_state(target)):
            value = _grow_leaf(path, var, parent_flat, order, cfg, width, noise_scale,
                               jax.random.fold_in(key, i))
            if value.shape != var.shape:
                raise ValueError(f"grow_state: grown {path} has shape {value.shape}, the grown "
                                 f"model expects {var.shape}")
            out.append((path, var.replace(value)))
        return nnx.from_flat_state(out)

    return new_cfg, grow(params, g_params), grow(model_state, g_state)


def grow_model(model: LanguageModel, **options) -> LanguageModel:
    """A grown copy of a :class:`LanguageModel` built from an :class:`LMConfig`; ``options``
    are those of :func:`grow_state`."""
    if not isinstance(getattr(model, "cfg", None), LMConfig):
        raise TypeError("grow_model: model must be a LanguageModel of an LMConfig (build_lm)")
    _, params, state, _ = nnx.split(model, nnx.Param, nnx.BatchStat, ...)
    state = state if jax.tree.leaves(state) else None
    new_cfg, params, state = grow_state(model.cfg, params, state, **options)
    grown = build_lm(new_cfg, rngs=nnx.Rngs(0))
    nnx.update(grown, params, *(() if state is None else (state,)))
    return grown


# --------------------------------------------------------------------------- checkpoints


def _raw_get(raw, path):
    node = raw
    for k in path:
        node = node[str(k)] if isinstance(k, int) else node[k]
    return node["value"] if isinstance(node, dict) and "value" in node else node


def _fill(abstract: nnx.State, raw) -> nnx.State:
    out = []
    for path, var in nnx.to_flat_state(abstract):
        value = jnp.asarray(_raw_get(raw, path))
        if value.shape != var.shape:
            raise ValueError(f"checkpoint leaf {path} has shape {value.shape}, the recorded "
                             f"model expects {var.shape}")
        out.append((path, var.replace(value)))
    return nnx.from_flat_state(out)


def read_checkpoint(directory, step: int | None = None):
    """``(cfg, params, model_state, meta)`` of a training checkpoint (default: the newest in
    ``directory``): the composed :class:`LMConfig` recorded in its metadata and the
    parameters and ``nnx.BatchStat`` state (``None`` if none) as ``nnx.State``s."""
    import orbax.checkpoint as ocp

    directory = pathlib.Path(directory).absolute()
    if not directory.is_dir():
        raise FileNotFoundError(f"no checkpoint in {directory} (not a folder)")
    manager = ocp.CheckpointManager(directory)
    try:
        step = manager.latest_step() if step is None else step
        if step is None:
            raise FileNotFoundError(f"no checkpoint in {directory}")
        out = manager.restore(step, args=ocp.args.Composite(
            state=ocp.args.StandardRestore(), meta=ocp.args.JsonRestore()))
    finally:
        manager.close()
    meta = dict(out.meta or {})
    if "model" not in meta:
        raise ValueError(f"the checkpoint at step {step} in {directory} records no composed "
                         "model config (a run of a composable model writes one)")
    cfg = LMConfig.from_dict(meta["model"])
    abstract = nnx.eval_shape(lambda: build_lm(cfg, rngs=nnx.Rngs(0)))
    _, a_params, a_state, _ = nnx.split(abstract, nnx.Param, nnx.BatchStat, ...)
    params = _fill(a_params, out.state["params"])
    raw_state = out.state.get("model_state")
    state = _fill(a_state, raw_state) if raw_state and jax.tree.leaves(a_state) else None
    return cfg, params, state, meta


def load_model(directory, step: int | None = None, *, seed: int = 0):
    """``(model, cfg)``: the :class:`LanguageModel` of a checkpoint (see
    :func:`read_checkpoint`) with its parameters and state."""
    cfg, params, state, _ = read_checkpoint(directory, step)
    model = build_lm(cfg, rngs=nnx.Rngs(seed))
    nnx.update(model, params, *(() if state is None else (state,)))
    return model, cfg


def grow_checkpoint(src, dst, *, step: int | None = None, depth: bool = True,
                    width: bool = True, noise_scale: float = 0.01, double_top_k: bool = True,
                    seed: int = 0) -> LMConfig:
    """Grows the checkpoint at ``step`` (default: newest) in ``src`` and writes it to ``dst``
    as step 0 with the grown config recorded; returns that config. A new run starts from it
    with ``python -m jaxlib_ext train --init-from dst``."""
    from jaxlib_ext.core.checkpoint import Checkpointer
    from jaxlib_ext.core.train import TrainState

    cfg, params, state, meta = read_checkpoint(src, step)
    new_cfg, params, state = grow_state(
        cfg, params, state, depth=depth, width=width, noise_scale=noise_scale,
        double_top_k=double_top_k, key=jax.random.key(seed),
    )
    record = {
        "model": new_cfg.to_dict(), "step": 0,
        "grown_from": {"directory": str(pathlib.Path(src).absolute()), "step": meta.get("step"),
                       "depth": depth, "width": width, "noise_scale": noise_scale,
                       "double_top_k": double_top_k, "seed": seed},
    }
    grown = TrainState(jnp.asarray(0, jnp.int32), params, None, jax.random.PRNGKey(seed), state)
    with Checkpointer(dst, async_save=False) as ckpt:
        if ckpt.latest_step() is not None:
            raise ValueError(f"dst {ckpt.directory} already holds checkpoints")
        ckpt.save(0, grown, record)
    return new_cfg
