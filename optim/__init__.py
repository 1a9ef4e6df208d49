"""jaxlib_ext.optim: memory-efficient optimizers as Optax transforms, and their layers.

* :func:`foam` / :func:`scale_by_foam`: Adam with block-folded moments (arXiv 2512.07112).
* :func:`smet` / :func:`scale_by_smet`: dynamic sparse training with compact optimizer state
  (arXiv 2606.00888), over dense leaves or :class:`SparseLinear` layers
  (:mod:`jaxlib_ext.optim.smet_layer`).
* :func:`poet_x` / :func:`scale_by_poet`: POET-X orthogonal equivalence training, an optax chain
  ending in :func:`merge_then_reinitialize` (arXiv 2506.08001, 2603.05500), over
  :class:`PoetLinear` layers made by :func:`poetize` (:mod:`jaxlib_ext.optim.poet_layer`);
  :func:`clip_by_global_norm_merge_warmup`: the authors' clipping warm-up after each merge.
* :func:`make_optimizer`: the AdamW / FOAM / SMET / POET-X training recipes by name;
  :func:`build_optimizer`: one of them on the default warm-up-cosine schedule.
"""

from jaxlib_ext.optim.foam import ScaleByFoamState, foam, scale_by_foam
from jaxlib_ext.optim.poet import (
    ClipMergeWarmupState,
    MergeThenReinitializeState,
    bound_rotations,
    clip_by_global_norm_merge_warmup,
    merge_clip_threshold,
    merge_poet_layer,
    merge_then_reinitialize,
    poet_labels,
    poet_x,
    scale_by_poet,
)
from jaxlib_ext.optim.recipes import (
    OPTIMIZER_NAMES,
    build_optimizer,
    decay_mask,
    make_optimizer,
    prepare_model,
    recipe_defaults,
)
from jaxlib_ext.optim.smet import (
    ScaleBySmetState,
    SparseSlots,
    active_masks,
    keep_inactive_zero,
    scale_by_smet,
    smet,
    smet_regrown,
    sparsify,
    topology_update_slots,
)

__all__ = [
    "OPTIMIZER_NAMES",
    "ClipMergeWarmupState",
    "MergeThenReinitializeState",
    "PoetLinear",
    "bound_rotations",
    "clip_by_global_norm_merge_warmup",
    "merge_clip_threshold",
    "merge_poet_layer",
    "merge_then_reinitialize",
    "poet_labels",
    "poet_layers",
    "poet_x",
    "poetize",
    "poetize_report",
    "scale_by_poet",
    "ScaleByFoamState",
    "ScaleBySmetState",
    "SparseLinear",
    "SparseSlots",
    "active_masks",
    "build_optimizer",
    "decay_mask",
    "foam",
    "keep_inactive_zero",
    "make_optimizer",
    "prepare_model",
    "recipe_defaults",
    "regrow_sparse_indices",
    "scale_by_foam",
    "scale_by_smet",
    "smet",
    "smet_regrown",
    "sparsify",
    "topology_update_slots",
]


# The NNX layers load flax on first use: `import jaxlib_ext.optim` does not.
_LAYERS = {
    "PoetLinear": "poet_layer", "poet_layers": "poet_layer", "poetize": "poet_layer",
    "poetize_report": "poet_layer", "SparseLinear": "smet_layer",
    "regrow_sparse_indices": "smet_layer",
}


def __getattr__(name):
    if name in _LAYERS:
        import importlib

        return getattr(importlib.import_module(f"{__name__}.{_LAYERS[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
