"""jaxlib_ext.optim: memory-efficient optimizers as Optax transforms.

* :func:`foam` / :func:`scale_by_foam`: Adam with block-folded moments (arXiv 2512.07112).
* :func:`smet` / :func:`scale_by_smet`: dynamic sparse training with compact optimizer state
  (arXiv 2606.00888).
"""

from jaxlib_ext.optim.foam import ScaleByFoamState, foam, scale_by_foam
from jaxlib_ext.optim.smet import (
    CompactSlots,
    DenseMoments,
    ScaleBySmetState,
    SmetState,
    SparseSlots,
    active_masks,
    scale_by_smet,
    smet,
    smet_regrown,
    sparsify,
    topology_update_slots,
)

__all__ = [
    "CompactSlots",
    "DenseMoments",
    "ScaleByFoamState",
    "ScaleBySmetState",
    "SmetState",
    "SparseSlots",
    "active_masks",
    "foam",
    "scale_by_foam",
    "scale_by_smet",
    "smet",
    "smet_regrown",
    "sparsify",
    "topology_update_slots",
]
