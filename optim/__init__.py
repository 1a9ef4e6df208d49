"""jaxlib_ext.optim: memory-efficient optimizers as Optax transforms.

* :func:`foam` / :func:`scale_by_foam`: Adam with block-folded moments (arXiv 2512.07112).
* :func:`smet` / :func:`scale_by_smet`: dynamic sparse training with compact optimizer state
  (arXiv 2606.00888).
* :func:`make_optimizer`: the AdamW / FOAM / SMET training recipes by name.
"""

from jaxlib_ext.optim.foam import ScaleByFoamState, foam, scale_by_foam
from jaxlib_ext.optim.recipes import (
    OPTIMIZER_NAMES,
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
    "ScaleByFoamState",
    "ScaleBySmetState",
    "SparseSlots",
    "active_masks",
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
