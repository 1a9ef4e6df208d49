"""Tiny instances of every trainer of the library, for the shared trainer test.

Each module defines ``NAME`` and ``run(out, *, steps, lr_scale=1.0) -> {path: array}``: it
trains its trainer for ``steps`` steps with checkpoints every 2 steps under ``out`` (resuming
from them), the learning rate scaled by ``lr_scale``, and returns the final parameters.
"""
