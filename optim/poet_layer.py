r"""POET-X as a Flax NNX layer: :class:`PoetLinear` and :func:`poetize`.

A :class:`PoetLinear` computes ``y = x @ W_eff (+ bias)``, ``W_eff = R_in @ W0 @ R_out``, through
:func:`jaxlib_ext.pallas_kernels.poet.poet_linear` (POET, arXiv 2506.08001, POET-BS; POET-X,
arXiv 2603.05500, input-centric). Its variables:

* ``poet_base``: the base weight ``W0`` ``[n, m]`` (:class:`PoetBase`), frozen between merges:
  the forward pass reads it through ``stop_gradient``;
* ``theta_in`` ``[n / b, b (b - 1) / 2]`` and ``theta_out`` ``[m / b, b (b - 1) / 2]``
  (:class:`PoetRotation`), the only trained parameters of the layer,
  ``(n + m)(b - 1) / 2`` in all, zero at initialisation (``W_eff = W0``);
* ``perm_in``, ``perm_out`` (:class:`PoetPermutation`): the permutations, stored as float32
  arrays of exact integers (exact up to ``2**24`` features) and read through ``stop_gradient``;
* ``bias`` (an ``nnx.Param``) when the layer has one.

All of them are ``nnx.Param`` subclasses so that a training loop that trains the ``nnx.Param``
leaves through an optax update (``jaxlib_ext.core.train``) hands them to the optimizer:
:func:`jaxlib_ext.optim.poet_x` recognises a layer by its five names, trains the thetas, keeps the
base weight and permutations fixed (zero updates, no optimizer state) and rewrites them at a
merge. Their gradients are exactly zero.

Initialisation: ``W0`` has unit-norm neurons (each output neuron's weight vector, a column of
the ``[n, m]`` kernel, divided by its L2 norm): POET's "normalized Gaussian" initialisation
(arXiv 2506.08001, its initialisation ablation, where it gave the lowest perplexity of the
inits compared). :func:`poetize` normalises the existing kernel's columns once, at conversion.
The permutations are drawn uniformly at random.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence

import jax
import jax.numpy as jnp
from flax import nnx

from jaxlib_ext.pallas_kernels.poet import (
    METHODS,
    effective_weight,
    num_block_params,
    poet_linear,
)

__all__ = [
    "PoetBase",
    "PoetLinear",
    "PoetPermutation",
    "PoetRotation",
    "PoetizeReport",
    "poet_layers",
    "poetize",
    "poetize_report",
]


class PoetBase(nnx.Param):
    """The base weight ``W0`` of a :class:`PoetLinear` (changed only by merges)."""


class PoetRotation(nnx.Param):
    """The rotation parameters (skew-matrix upper triangles) of a :class:`PoetLinear`."""


class PoetPermutation(nnx.Param):
    """A permutation of a :class:`PoetLinear`, float32 holding exact integers."""


def _unit_neurons(kernel: jax.Array) -> jax.Array:
    """Columns of an ``[n, m]`` kernel (output neurons) scaled to unit L2 norm."""
    norm = jnp.linalg.norm(kernel.astype(jnp.float32), axis=0, keepdims=True)
    return (kernel / jnp.maximum(norm, jnp.finfo(jnp.float32).tiny)).astype(kernel.dtype)


def _check_block_size(block_size, n, m, where="PoetLinear"):
    if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 2:
        raise ValueError(f"block_size must be an int >= 2, got {block_size!r}")
    if n % block_size or m % block_size:
        raise ValueError(
            f"{where}: block_size {block_size} must divide in_features = {n} and "
            f"out_features = {m}"
        )


class PoetLinear(nnx.Module):
    """A dense layer ``y = x @ W_eff (+ bias)`` trained by orthogonal equivalence (POET-X).

    Args:
      in_features, out_features: ``n``, ``m``; both multiples of ``block_size``.
      block_size: ``b >= 2``.
      rngs: draws the base weight (normal, std 0.02, then unit-norm neurons) and permutations.
      use_bias: add a trainable bias ``[m]``.
      method: :data:`jaxlib_ext.pallas_kernels.poet.METHODS` entry for :func:`poet_linear`.
      memory_saving: use the recomputing backward (``POET-X_mem``).
      kernel: an ``[n, m]`` base weight to start from (normalised to unit-norm neurons) instead
        of a random one.
      logical_axes: sharding metadata of the base weight (the thetas and permutations are
        replicated).

    Raises:
      ValueError: ``block_size < 2`` or not dividing the sizes; an unknown method; a ``kernel``
        of the wrong shape.
    """

    def __init__(self, in_features: int, out_features: int, *, block_size: int,
                 rngs: nnx.Rngs, use_bias: bool = False, method: str = "auto",
                 memory_saving: bool = False, kernel: jax.Array | None = None,
                 logical_axes: Sequence[str | None] | None = None,
                 param_dtype=jnp.float32):
        n, m = in_features, out_features
        _check_block_size(block_size, n, m)
        if method not in METHODS:
            raise ValueError(f"method must be one of {METHODS}, got {method!r}")
        if kernel is None:
            kernel = nnx.initializers.normal(0.02)(rngs.params(), (n, m), param_dtype)
        elif tuple(kernel.shape) != (n, m):
            raise ValueError(f"kernel must have shape [n, m] = {(n, m)}, got {kernel.shape}")
        self.in_features, self.out_features = n, m
        self.block_size, self.method, self.memory_saving = block_size, method, memory_saving
        p = num_block_params(block_size)
        no_decay = {"weight_decay": False}
        self.poet_base = PoetBase(_unit_neurons(jnp.asarray(kernel)),
                                  logical_axes=tuple(logical_axes or (None, None)), **no_decay)
        self.theta_in = PoetRotation(jnp.zeros((n // block_size, p), param_dtype),
                                     logical_axes=(None, None), **no_decay)
        self.theta_out = PoetRotation(jnp.zeros((m // block_size, p), param_dtype),
                                      logical_axes=(None, None), **no_decay)
        key_in, key_out = jax.random.split(rngs.params())
        perm = lambda key, size: jax.random.permutation(key, size).astype(jnp.float32)  # noqa: E731
        self.perm_in = PoetPermutation(perm(key_in, n), logical_axes=(None,), **no_decay)
        self.perm_out = PoetPermutation(perm(key_out, m), logical_axes=(None,), **no_decay)
        self.bias = nnx.Param(jnp.zeros((m,), param_dtype), logical_axes=(None,)) if use_bias \
            else None

    def _args(self):
        sg = jax.lax.stop_gradient
        return (sg(self.poet_base[...]), self.theta_in[...], self.theta_out[...],
                sg(self.perm_in[...]).astype(jnp.int32), sg(self.perm_out[...]).astype(jnp.int32))

    def __call__(self, x: jax.Array) -> jax.Array:
        w, t_in, t_out, p_in, p_out = self._args()
        y = poet_linear(x, w.astype(x.dtype), t_in.astype(x.dtype), t_out.astype(x.dtype),
                        p_in, p_out, block_size=self.block_size, method=self.method,
                        memory_saving=self.memory_saving)
        return y if self.bias is None else y + self.bias[...].astype(y.dtype)

    def effective_weight(self) -> jax.Array:
        """``W_eff = R_in @ W0 @ R_out`` ``[n, m]``, built densely (for inspection)."""
        return effective_weight(*self._args(), self.block_size)

    @property
    def num_trainable(self) -> int:
        """Trainable rotation parameters, ``(n + m)(b - 1) / 2`` (plus the bias, if any)."""
        rot = (self.in_features + self.out_features) * (self.block_size - 1) // 2
        return rot + (0 if self.bias is None else self.out_features)


class PoetizeReport(tuple):
    """``(converted, skipped)``: paths of the converted layers, and ``(path, reason)`` pairs of
    the dense layers left as they are."""

    def __new__(cls, converted, skipped):
        return super().__new__(cls, (tuple(converted), tuple(skipped)))

    @property
    def converted(self):
        return self[0]

    @property
    def skipped(self):
        return self[1]


def _path_str(path) -> str:
    return ".".join(str(p) for p in path)


def _linears(model):
    return [(path, node) for path, node in nnx.iter_graph(model)
            if isinstance(node, nnx.Linear) and path]


def poetize_report(model, block_size: int = 256, exclude: Sequence[str] = ("lm_head",)):
    """Which ``nnx.Linear`` layers of ``model`` :func:`poetize` converts, and why others stay.

    Args:
      model: an ``nnx.Module``.
      block_size: POET block size; a layer is converted only if it divides both kernel sizes.
      exclude: strings; a layer whose path has an entry containing one of them is skipped.

    Returns:
      A :class:`PoetizeReport` ``(converted, skipped)``: the paths of the layers to convert, and
      ``(path, reason)`` pairs of those left dense.
    """
    converted, skipped = [], []
    for path, lin in _linears(model):
        name = _path_str(path)
        n, m = lin.kernel.shape
        if any(part in str(p) for p in path for part in exclude):
            skipped.append((name, "excluded"))
        elif n % block_size or m % block_size:
            skipped.append((name, f"[{n}, {m}] not divisible by block_size {block_size}"))
        else:
            converted.append(name)
    return PoetizeReport(converted, skipped)


def poetize(model, block_size: int = 256, exclude: Sequence[str] = ("lm_head",), *,
            seed: int = 0, method: str = "auto", memory_saving: bool = False):
    """Replace ``model``'s eligible ``nnx.Linear`` layers by :class:`PoetLinear`, in place.

    A layer is eligible when no entry of its path contains a string of ``exclude`` and
    ``block_size`` divides both of its sizes. Each converted layer starts from its own kernel
    (normalised to unit-norm neurons), bias and sharding metadata; permutations come from
    ``seed``. Layers left dense are reported with a ``UserWarning`` (see :func:`poetize_report`).

    Args:
      model: an ``nnx.Module``, modified in place.
      block_size: POET block size, an int ``>= 2``.
      exclude: strings; a layer whose path has an entry containing one of them stays dense.
      seed: seed of the ``nnx.Rngs`` that draws the permutations.
      method: :data:`jaxlib_ext.pallas_kernels.poet.METHODS` entry for :func:`poet_linear`.
      memory_saving: use the recomputing backward (``POET-X_mem``).

    Returns:
      ``model`` (modified in place).

    Raises:
      ValueError: ``block_size < 2``.
    """
    if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 2:
        raise ValueError(f"block_size must be an int >= 2, got {block_size!r}")
    report = poetize_report(model, block_size, exclude)
    todo = set(report.converted)
    rngs = nnx.Rngs(seed)
    for path, lin in _linears(model):
        if _path_str(path) not in todo:
            continue
        kernel = lin.kernel
        n, m = kernel.shape
        new = PoetLinear(
            n, m, block_size=block_size, rngs=rngs, use_bias=lin.bias is not None,
            method=method, memory_saving=memory_saving, kernel=kernel[...],
            logical_axes=kernel.get_metadata().get("logical_axes"), param_dtype=kernel.dtype,
        )
        if lin.bias is not None:
            new.bias[...] = lin.bias[...]
        parent = model
        for key in path[:-1]:
            parent = parent[key] if isinstance(key, int) else getattr(parent, key)
        if isinstance(path[-1], int):
            parent[path[-1]] = new
        else:
            setattr(parent, path[-1], new)
    if report.skipped:
        warnings.warn(
            "poetize: layers left dense (trained by AdamW): "
            + "; ".join(f"{p}: {why}" for p, why in report.skipped),
            UserWarning, stacklevel=2,
        )
    return model


def poet_layers(model) -> list[tuple[str, PoetLinear]]:
    """``(path, layer)`` of every :class:`PoetLinear` in ``model``.

    Args:
      model: an ``nnx.Module``.

    Returns:
      A list of ``(path string, PoetLinear)`` pairs in graph order.
    """
    return [(_path_str(p), node) for p, node in nnx.iter_graph(model)
            if isinstance(node, PoetLinear)]
