"""Model presets: a size name selects a frozen config; parameter counts without allocation.

Every builder of :mod:`jaxlib_ext.models` has the signature
``build(preset="tiny", *, vocab_size=None, rngs, **overrides)``: ``preset`` is a size name of that
model's table (the builder already names the model, so presets carry no model prefix),
``vocab_size=None`` keeps the preset's vocabulary, and ``overrides`` replace config fields.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping

import jax
from flax import nnx

__all__ = ["config_from_preset", "param_count", "preset_param_count"]


def config_from_preset(presets: Mapping, preset: str, *, model: str, vocab_size=None, **overrides):
    """``presets[preset]`` with ``vocab_size`` (unless ``None``) and ``overrides`` replaced.

    Args:
      presets: a mapping from size names to frozen dataclass configs.
      preset: a key of ``presets``.
      model: the model's name, for the error message.
      vocab_size: the vocabulary size; ``None`` keeps the preset's.
      **overrides: config fields to replace.

    Returns:
      The config, a ``dataclasses.replace`` copy of ``presets[preset]``.

    Raises:
      ValueError: ``preset`` is not a key of ``presets`` (the message lists the names), or an
        override is rejected by the config's own validation.
    """
    if preset not in presets:
        raise ValueError(f"unknown {model} preset {preset!r}; choose from {sorted(presets)}")
    if vocab_size is not None:
        overrides["vocab_size"] = vocab_size
    return dataclasses.replace(presets[preset], **overrides)


def param_count(module: nnx.Module) -> int:
    """Number of scalars in the module's ``nnx.Param`` leaves.

    Args:
      module: an NNX module, concrete or abstract (``nnx.eval_shape``).

    Returns:
      The parameter count, an int.
    """
    return sum(math.prod(x.shape) for x in jax.tree.leaves(nnx.state(module, nnx.Param)))


def preset_param_count(build: Callable, preset: str = "tiny", *, vocab_size: int | None = None,
                       **overrides) -> int:
    """Parameter count of ``build(preset, ...)`` without allocating it (``nnx.eval_shape``).

    Args:
      build: a model builder such as :func:`jaxlib_ext.models.build_mdn`.
      preset: a size name of the builder's table.
      vocab_size: the vocabulary size; ``None`` keeps the preset's (50257 for the paper
        sizes, 256 for ``"tiny"``).
      **overrides: config fields to replace.

    Returns:
      The parameter count, an int.

    Raises:
      TypeError: if ``build`` is not callable.
    """
    if not callable(build):
        raise TypeError(
            f"preset_param_count: build must be a model builder such as build_mdn, got {build!r}"
        )
    abstract = nnx.eval_shape(
        lambda: build(preset, vocab_size=vocab_size, rngs=nnx.Rngs(0), **overrides)
    )
    return param_count(abstract)
