"""jaxlib_ext.core: the ground every family builds on; it imports no family.

* :mod:`~jaxlib_ext.core.train`: the language-model training state, the compiled steps
  (``jit``, ``pmap``, ``shard_map``) and the loop;
* :mod:`~jaxlib_ext.core.schedule`: learning-rate schedules recorded with checkpoints;
* :mod:`~jaxlib_ext.core.checkpoint`: Orbax checkpoints with JSON metadata;
* :mod:`~jaxlib_ext.core.data`: text corpora, tokenizers, batches built per process;
  :mod:`~jaxlib_ext.core.images`: the bundled image data sets (MNIST, 8x8 digits);
* :mod:`~jaxlib_ext.core.sharding`: meshes, logical-axis rules, placements;
* :mod:`~jaxlib_ext.core.distributed`: starting several processes;
* :mod:`~jaxlib_ext.core.memory`: bytes of a pytree and of a compiled program;
* :mod:`~jaxlib_ext.core.timing`: wall-clock timing of compiled work (warm-up, median, spread).

Submodules load on first access.
"""

from __future__ import annotations

import importlib

_SUBMODULES = ("checkpoint", "data", "distributed", "images", "memory", "schedule",
               "sharding", "timing", "train")

__all__ = list(_SUBMODULES)


def __getattr__(name):
    if name in _SUBMODULES:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted({*globals(), *__all__})
