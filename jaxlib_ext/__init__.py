"""jaxlib_ext: ICML 2026 methods as pure, composable JAX functions.

The runtime lives here; the method families are installed beside it as
``jaxlib_ext.models``, ``jaxlib_ext.optim``, ``jaxlib_ext.samplers`` and
``jaxlib_ext.pallas_kernels``. The runtime's public API:

* training (:mod:`jaxlib_ext.train`): :class:`TrainConfig`, :func:`fit`, :class:`TrainResult`,
  :class:`TrainState`, :class:`NonFiniteLossError`, the step factories
  :func:`make_train_step` (``jit``), :func:`make_pmap_train_step`,
  :func:`make_shard_map_train_step`, :func:`make_eval_step`, and :func:`init_state`,
  :func:`make_loss_fn`, :func:`cross_entropy`, :func:`train_state_shardings`,
  :func:`plot_metrics`;
* learning-rate schedules (:mod:`jaxlib_ext.schedule`): :class:`WarmupCosine`,
  :func:`warmup_cosine`, :class:`ScheduleMismatchError`;
* checkpoints (:mod:`jaxlib_ext.checkpoint`): :class:`Checkpointer`, :func:`abstract_like`;
* data (:mod:`jaxlib_ext.data`): :func:`load_corpus`, :class:`Corpus`,
  :class:`ByteTokenizer`; bundled images (:mod:`jaxlib_ext.images`): MNIST digits and
  scikit-learn's 8x8 digits; their quality against the truth (:mod:`jaxlib_ext.image_quality`):
  PSNR and SSIM;
* meshes and shardings (:mod:`jaxlib_ext.sharding`): :func:`make_mesh`;
* several processes (:mod:`jaxlib_ext.distributed`): :func:`initialize_processes`;
* memory (:mod:`jaxlib_ext.memory`): :func:`tree_bytes`, :func:`compiled_memory`.

Importing this package is cheap: every name and submodule loads on first access.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

__version__ = "0.1.0"

_SUBMODULES = (
    "checkpoint",
    "cli",
    "data",
    "distributed",
    "image_quality",
    "images",
    "memory",
    "schedule",
    "sharding",
    "train",
    "models",
    "optim",
    "samplers",
    "pallas_kernels",
)

#: public name -> (submodule, attribute)
_EXPORTS: dict[str, tuple[str, str]] = {
    **{name: ("train", name) for name in (
        "TrainConfig", "TrainResult", "TrainState", "NonFiniteLossError", "fit",
        "init_state", "make_loss_fn", "cross_entropy", "make_train_step",
        "make_pmap_train_step", "make_shard_map_train_step", "make_eval_step",
        "train_state_shardings", "plot_metrics",
    )},
    **{name: ("schedule", name) for name in (
        "WarmupCosine", "warmup_cosine", "ScheduleMismatchError",
    )},
    "Checkpointer": ("checkpoint", "Checkpointer"),
    "abstract_like": ("checkpoint", "abstract_like"),
    "load_corpus": ("data", "load_corpus"),
    "Corpus": ("data", "Corpus"),
    "ByteTokenizer": ("data", "ByteTokenizer"),
    "make_mesh": ("sharding", "make_mesh"),
    "initialize_processes": ("distributed", "initialize"),
    "tree_bytes": ("memory", "tree_bytes"),
    "compiled_memory": ("memory", "compiled_memory"),
}

__all__ = [
    "__version__",
    # training
    "TrainConfig",
    "TrainResult",
    "TrainState",
    "NonFiniteLossError",
    "fit",
    "init_state",
    "make_loss_fn",
    "cross_entropy",
    "make_train_step",
    "make_pmap_train_step",
    "make_shard_map_train_step",
    "make_eval_step",
    "train_state_shardings",
    "plot_metrics",
    # schedules, checkpoints, data, meshes, processes, memory
    "WarmupCosine",
    "warmup_cosine",
    "ScheduleMismatchError",
    "Checkpointer",
    "abstract_like",
    "load_corpus",
    "Corpus",
    "ByteTokenizer",
    "make_mesh",
    "initialize_processes",
    "tree_bytes",
    "compiled_memory",
    # submodules
    "checkpoint",
    "cli",
    "data",
    "distributed",
    "image_quality",
    "images",
    "memory",
    "schedule",
    "sharding",
    "train",
    "models",
    "optim",
    "samplers",
    "pallas_kernels",
]

if TYPE_CHECKING:
    from jaxlib_ext.checkpoint import Checkpointer, abstract_like
    from jaxlib_ext.data import ByteTokenizer, Corpus, load_corpus
    from jaxlib_ext.distributed import initialize as initialize_processes
    from jaxlib_ext.memory import compiled_memory, tree_bytes
    from jaxlib_ext.schedule import ScheduleMismatchError, WarmupCosine, warmup_cosine
    from jaxlib_ext.sharding import make_mesh
    from jaxlib_ext.train import (
        NonFiniteLossError,
        TrainConfig,
        TrainResult,
        TrainState,
        cross_entropy,
        fit,
        init_state,
        make_eval_step,
        make_loss_fn,
        make_pmap_train_step,
        make_shard_map_train_step,
        make_train_step,
        plot_metrics,
        train_state_shardings,
    )


def __getattr__(name):
    if name in _SUBMODULES:
        return importlib.import_module(f"{__name__}.{name}")
    if name in _EXPORTS:
        module, attr = _EXPORTS[name]
        return getattr(importlib.import_module(f"{__name__}.{module}"), attr)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted({*globals(), *__all__})
