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
    """Parent block of each grown block under interposition (arXiv 2510.08008).

    Args:
      n_layers: the parent's blocks, a positive int.

    Returns:
      ``[0, 0, 1, 1, ...]`` of length ``2 n_layers`` (layer ``i`` at ``2i`` and ``2i + 1``).

    Raises:
      ValueError: if ``n_layers`` is not a positive int.
    """
    if not isinstance(n_layers, int) or n_layers <= 0:
        raise ValueError(f"interposition_order: n_layers must be a positive int, got {n_layers!r}")
    return [j // 2 for j in range(2 * n_layers)]


def stacking_order(n_layers: int) -> list[int]:
    """Parent block of each grown block under stacking, the paper's contrast.

    Args:
      n_layers: the parent's blocks ``n``, a positive int.

    Returns:
      ``[0, ..., n-1, 0, ..., n-1]``.

    Raises:
      ValueError: if ``n_layers`` is not a positive int.
    """
    if not isinstance(n_layers, int) or n_layers <= 0:
        raise ValueError(f"stacking_order: n_layers must be a positive int, got {n_layers!r}")
    return list(range(n_layers)) * 2


def grow_config(cfg: LMConfig, *, depth: bool = True, width: bool = True,
                double_top_k: bool = True) -> LMConfig:
    """The grown model's config.

    Args:
      cfg: the parent's :class:`LMConfig`.
      depth: whether to double ``n_layers``.
      width: whether to double ``num_experts`` (only for a mixture-of-experts FFN).
      double_top_k: with ``width``, whether to double ``top_k`` too.

    Returns:
      The grown :class:`LMConfig`.

    Raises:
      TypeError: if ``cfg`` is not an :class:`LMConfig`.
      ValueError: if ``width`` is asked of a model without a mixture-of-experts FFN.
    """
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
      params: the parent's ``nnx.Param`` state.
      model_state: the parent's ``nnx.BatchStat`` state, ``None`` when it has none.
      depth: whether to grow the depth by interposition (module docstring).
      width: whether to grow the width by expert duplication (module docstring).
      noise_scale: the copies' noise, relative to each expert matrix's standard deviation,
        ``>= 0``.
      double_top_k: with ``width``, whether to double ``top_k`` too.
      key: PRNG key of the noise (required when ``width`` and ``noise_scale > 0``).
      order: parent block of each grown block (default :func:`interposition_order`, or the
        identity without ``depth``).

    Returns:
      ``(config, params, model_state)`` of the grown model (``model_state`` ``None`` when the
      parent has none).

    Raises:
      ValueError: if ``noise_scale < 0``, ``key`` is missing for noise, ``order`` does not
        give a parent block for each grown block, a grown leaf has the wrong shape, or as
        :func:`grow_config`.

    References:
      Wang et al., Recycling Pretrained Checkpoints: Orthogonal Growth of Mixture-of-Experts
      for Efficient Large Language Model Pre-Training, arXiv 2510.08008.
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
    """A grown copy of a :class:`LanguageModel` built from an :class:`LMConfig`.

    Args:
      model: the parent model (of :func:`~jaxlib_ext.models.build_lm`).
      **options: the keyword arguments of :func:`grow_state`.

    Returns:
      The grown :class:`LanguageModel`; the parent is not changed.

    Raises:
      TypeError: if ``model.cfg`` is not an :class:`LMConfig`.
      ValueError: as :func:`grow_state`.
    """
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
    """Reads a training checkpoint of a composable language model.

    Args:
      directory: the run's checkpoint folder.
      step: the step to read; ``None`` means the newest.

    Returns:
      ``(cfg, params, model_state, meta)``: the composed :class:`LMConfig` recorded in its
      metadata, the parameters and ``nnx.BatchStat`` state (``None`` if none) as
      ``nnx.State``s, and the metadata dict.

    Raises:
      FileNotFoundError: if ``directory`` is not a folder or holds no checkpoint.
      ValueError: if the checkpoint records no composed model config, or a leaf's shape
        differs from the recorded model's.
    """
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
    """The :class:`LanguageModel` of a checkpoint with its parameters and state.

    Args:
      directory: the run's checkpoint folder.
      step: the step to read; ``None`` means the newest.
      seed: the seed of the ``nnx.Rngs`` the model is built with, before the checkpoint's
        parameters and state replace the initial ones.

    Returns:
      ``(model, cfg)``.

    Raises:
      FileNotFoundError: as :func:`read_checkpoint`.
      ValueError: as :func:`read_checkpoint`.
    """
    cfg, params, state, _ = read_checkpoint(directory, step)
    model = build_lm(cfg, rngs=nnx.Rngs(seed))
    nnx.update(model, params, *(() if state is None else (state,)))
    return model, cfg


def grow_checkpoint(src, dst, *, step: int | None = None, depth: bool = True,
                    width: bool = True, noise_scale: float = 0.01, double_top_k: bool = True,
                    seed: int = 0) -> LMConfig:
    """Grows a checkpoint and writes it as step 0 of a new folder, with the grown config.

    A new run starts from it with ``python -m jaxlib_ext train --init-from dst``.

    Args:
      src: the parent run's checkpoint folder.
      dst: the folder to write, which must hold no checkpoint.
      step: the step to grow; ``None`` means the newest.
      depth: whether to grow the depth (:func:`grow_state`).
      width: whether to grow the width (:func:`grow_state`).
      noise_scale: the copies' relative noise (:func:`grow_state`).
      double_top_k: whether to double ``top_k`` with the width.
      seed: the seed of the noise key and of the written state's PRNG key.

    Returns:
      The grown :class:`LMConfig`.

    Raises:
      FileNotFoundError: as :func:`read_checkpoint`.
      ValueError: if ``dst`` already holds checkpoints, or as :func:`read_checkpoint` and
        :func:`grow_state`.
    """
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
