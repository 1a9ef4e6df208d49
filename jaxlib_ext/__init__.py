"""jaxlib_ext: ICML 2026 methods as pure, composable JAX functions.

The runtime lives here (sharding, multi-host start, training loop, checkpoints, data,
memory); the method families are installed beside it as ``jaxlib_ext.models``,
``jaxlib_ext.optim``, ``jaxlib_ext.samplers`` and ``jaxlib_ext.pallas_kernels``.

Importing this package is cheap: submodules load on first attribute access.
"""

import importlib

__version__ = "0.1.0"

_SUBMODULES = (
    "data",
    "distributed",
    "memory",
    "sharding",
    "train",
    "checkpoint",
    "models",
    "optim",
    "samplers",
    "pallas_kernels",
)


def __getattr__(name):
    if name in _SUBMODULES:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted([*globals(), *_SUBMODULES])
