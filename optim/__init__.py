"""jaxlib_ext.optim: memory-efficient optimizers as Optax transforms.

* :func:`foam` / :func:`scale_by_foam`: Adam with block-folded moments (arXiv 2512.07112).
* :func:`smet` / :func:`scale_by_smet`: dynamic sparse training with compact optimizer state
  (arXiv 2606.00888).
* :func:`poet_x`: POET-X orthogonal equivalence training with merge-then-reinitialize (arXiv
  2506.08001, 2603.05500), over :class:`PoetLinear` layers made by :func:`poetize`;
  :func:`clip_by_global_norm_merge_warmup`: the authors' clipping warm-up after each merge.
* :func:`make_optimizer`: the AdamW / FOAM / SMET / POET-X training recipes by name;
  :func:`build_optimizer`: one of them on the default warm-up-cosine schedule.
"""

from jaxlib_ext.optim.foam import ScaleByFoamState, foam, scale_by_foam
from jaxlib_ext.optim.poet import (
    ClipMergeWarmupState,
    PoetXState,
    clip_by_global_norm_merge_warmup,
    merge_clip_threshold,
    merge_poet_layer,
    poet_labels,
    poet_x,
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
    "PoetLinear",
    "PoetXState",
    "clip_by_global_norm_merge_warmup",
    "merge_clip_threshold",
    "merge_poet_layer",
    "poet_labels",
    "poet_layers",
    "poet_x",
    "poetize",
    "poetize_report",
    "ScaleByFoamState",
    "ScaleBySmetState",
    "SparseSlots",
    "active_masks",
    "build_optimizer",
    "decay_mask",
    "foam",
    "keep_inactive_zero",
    "make_optimizer",
    "prepare_model",
    "recipe_defaults",
    "scale_by_foam",
    "scale_by_smet",
    "smet",
    "smet_regrown",
    "sparsify",
    "topology_update_slots",
]


# The NNX layer loads flax on first use: `import jaxlib_ext.optim` does not.
_POET_LAYER = ("PoetLinear", "poet_layers", "poetize", "poetize_report")


def __getattr__(name):
    if name in _POET_LAYER:
        from jaxlib_ext.optim import _poet_layer

        return getattr(_poet_layer, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
