"""jaxlib_ext: ICML 2026 methods as pure, composable JAX functions.

Layers, each importing only the ones below it (import-linter contracts in ``pyproject.toml``):

* :mod:`jaxlib_ext.cli`: the commands (``python -m jaxlib_ext <command>``), the composition root;
  no library module imports it;
* the method families, ``samplers -> models -> optim -> pallas_kernels``: each may import the
  ground and the families to its right (samplers use models as score networks);
* :mod:`jaxlib_ext.core`: the ground (training, checkpoints, data and data sets, meshes,
  processes, memory); it imports no family.

The ground's public API, re-exported here:

* training (:mod:`jaxlib_ext.core.train`): :class:`TrainConfig`, :func:`fit`, :class:`TrainResult`,
  :class:`TrainState`, :class:`NonFiniteLossError`, the step factories
  :func:`make_train_step` (``jit``), :func:`make_pmap_train_step`,
  :func:`make_shard_map_train_step`, :func:`make_eval_step`, and :func:`init_state`,
  :func:`make_loss_fn`, :func:`cross_entropy`, :func:`train_state_shardings`,
  :func:`plot_metrics`;
* learning-rate schedules (:mod:`jaxlib_ext.core.schedule`): :class:`WarmupCosine`,
  :func:`warmup_cosine`, :class:`ScheduleMismatchError`;
* checkpoints (:mod:`jaxlib_ext.core.checkpoint`): :class:`Checkpointer`, :func:`abstract_like`;
* data (:mod:`jaxlib_ext.core.data`): :func:`load_corpus`, :class:`Corpus`,
  :class:`ByteTokenizer`; bundled images (:mod:`jaxlib_ext.core.images`): MNIST digits and
  scikit-learn's 8x8 digits;
* meshes and shardings (:mod:`jaxlib_ext.core.sharding`): :func:`make_mesh`;
* several processes (:mod:`jaxlib_ext.core.distributed`): :func:`initialize_processes`;
* memory (:mod:`jaxlib_ext.core.memory`): :func:`tree_bytes`, :func:`compiled_memory`.

Importing this package is cheap: every name and submodule loads on first access.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

__version__ = "0.1.0"

_SUBMODULES = (
    "cli",
    "core",
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
    # subpackages
    "cli",
    "core",
    "models",
    "optim",
    "samplers",
    "pallas_kernels",
]

if TYPE_CHECKING:
    from jaxlib_ext.core.checkpoint import Checkpointer, abstract_like
    from jaxlib_ext.core.data import ByteTokenizer, Corpus, load_corpus
    from jaxlib_ext.core.distributed import initialize as initialize_processes
    from jaxlib_ext.core.memory import compiled_memory, tree_bytes
    from jaxlib_ext.core.schedule import ScheduleMismatchError, WarmupCosine, warmup_cosine
    from jaxlib_ext.core.sharding import make_mesh
    from jaxlib_ext.core.train import (
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
        return getattr(importlib.import_module(f"{__name__}.core.{module}"), attr)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted({*globals(), *__all__})
