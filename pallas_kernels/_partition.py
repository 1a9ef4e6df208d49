"""Sharding and ``vmap`` rules for kernels that are independent per (batch row, head).

XLA cannot see inside a ``pallas_call``. Under ``jit`` with sharded inputs its partitioner
treats the kernel's custom call as needing whole arrays, so it all-gathers every input and
runs the kernel on the full batch on every device (XLA compile for two H200s: every input of
the momentum delta rule kernels all-gathered, each kernel's grid over the whole batch). And
``jax.vmap`` of a ``pallas_call`` adds a fourth grid axis to kernels written for three.
:func:`batch_and_head_parallel` declares what the kernels' caller knows, that every
(batch row, head) is computed independently, and turns it into two rules:

* sharding: ``jax.experimental.custom_partitioning`` with a Shardy rule that keeps the batch
  and head axes as the inputs are sharded and replicates every other axis (sequence, feature,
  state), so each device runs the kernels on its own rows and heads with no collective. On a
  mesh with ``Explicit`` axes the shardings are in the types at trace time, so there it is a
  ``jax.shard_map`` over the batch and head axes of the first operand's type instead
  (``custom_partitioning`` does not support explicit axes: jax-ml/jax#34811, and on CPU the
  compile fails with "No registered implementation for untyped custom call to Sharding");
* vmap: ``jax.custom_batching.custom_vmap`` folds the mapped axis into the batch axis (an
  unmapped operand is broadcast first), so the kernels see one larger batch.

Layouts are written in the einsum-like notation of ``custom_partitioning``: every operand and
result is a string of space-separated factor names, ``"b"`` the batch axis, ``"h"`` the head
axis, any other name an axis that must stay whole (``need_replication_factors``).

Where there is only one device (``jax.device_count() == 1``, or a context mesh of size one)
the sharding rule is left out: ``custom_partitioning`` cannot be lowered against an
``AbstractMesh`` (JAX refuses: it needs concrete devices; the offline lowering for an H200
in the tests does exactly that), and one device
needs no partitioning. Inside a ``shard_map`` the function is called as it is too: on the local
blocks where every axis is manual, and where only some are, XLA gathers over the others
(``custom_partitioning`` gets no mesh axis names there).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
from jax.experimental.custom_partitioning import custom_partitioning
from jax.sharding import NamedSharding, PartitionSpec

__all__ = ["batch_and_head_parallel", "with_shardings_of"]

_PARALLEL = ("b", "h")


def _factors(layout: str) -> tuple[str, ...]:
    factors = tuple(layout.split())
    if len(set(factors)) != len(factors) or "b" not in factors:
        raise ValueError(f"layout: expected distinct factor names including 'b', got {layout!r}")
    return factors


def batch_and_head_parallel(
    fn: Callable, in_layouts: Sequence[str], out_layouts: Sequence[str]
) -> Callable:
    """``fn`` (positional arrays in, a tuple of arrays out) with sharding and vmap rules.

    Args:
      fn: computes every (batch row, head) independently of the others.
      in_layouts, out_layouts: one layout string per operand and per result, e.g.
        ``"b t h k"`` for a [B, T, H, K] array; ``"b"`` and ``"h"`` name the batch and head
        axes, every other name an axis kept whole on each device.

    Returns:
      A function with ``fn``'s signature and results. Under ``jit`` with inputs sharded over
      batch and heads it runs ``fn`` on each device's shard: the batch and head shardings of
      the first operand (which must have both) are given to every operand and result, any
      other axis is gathered first. Under ``jax.vmap`` it calls ``fn`` once, the mapped axis
      folded into the batch axis.
    """
    ins = [_factors(x) for x in in_layouts]
    outs = [_factors(x) for x in out_layouts]
    if "h" not in ins[0]:
        raise ValueError(f"in_layouts[0]: needs both 'b' and 'h', got {in_layouts[0]!r}")
    # in order of first appearance: Shardy numbers the factors so and wants them sorted
    whole = [f for f in dict.fromkeys(f for x in ins + outs for f in x) if f not in _PARALLEL]
    rule = ", ".join(map(" ".join, ins)) + " -> " + ", ".join(map(" ".join, outs))

    def specs(first_spec):
        """(operand specs, result specs): the batch and head axes of the first operand's
        ``first_spec`` on every array, nothing on any other axis."""
        spec = tuple(first_spec) + (None,) * (len(ins[0]) - len(first_spec))
        axes = {f: spec[ins[0].index(f)] for f in _PARALLEL}
        as_spec = lambda layout: PartitionSpec(*(axes.get(f) for f in layout))  # noqa: E731
        return tuple(map(as_spec, ins)), tuple(map(as_spec, outs))

    def partition(mesh, arg_shapes, result_shape):
        first = arg_shapes[0].sharding
        if not isinstance(first, NamedSharding):
            raise NotImplementedError(
                "batch_and_head_parallel: the inputs' sharding has no mesh axis names "
                f"({type(first).__name__}); shard them with NamedSharding"
            )
        in_specs, out_specs = specs(first.spec)
        named = lambda spec: NamedSharding(mesh, spec)  # noqa: E731
        return mesh, fn, tuple(map(named, out_specs)), tuple(map(named, in_specs))

    partitioned = custom_partitioning(fn)
    partitioned.def_partition(partition, sharding_rule=rule, need_replication_factors=tuple(whole))

    def shard_mapped(*args):
        first = jax.typeof(args[0]).sharding
        in_specs, out_specs = specs(first.spec)
        args = [jax.sharding.reshard(x, s) for x, s in zip(args, in_specs, strict=True)]
        # check_vma off: a pallas_call's outputs carry no varying-axes type
        body = jax.shard_map(
            fn, mesh=first.mesh, in_specs=in_specs, out_specs=out_specs, check_vma=False
        )
        return body(*args)

    @jax.custom_batching.custom_vmap
    def call(*args):
        mesh = jax.sharding.get_abstract_mesh()
        if _one_device() or mesh.manual_axes:
            return fn(*args)
        if mesh.explicit_axes or jax.typeof(args[0]).sharding.mesh.explicit_axes:
            return shard_mapped(*args)
        return partitioned(*args)

    @call.def_vmap
    def fold_into_batch(axis_size, in_batched, *args):
        folded = []
        for x, layout, mapped in zip(args, ins, in_batched, strict=True):
            if not mapped:
                x = jnp.broadcast_to(x, (axis_size,) + x.shape)
            b = layout.index("b")  # [n, ..., B, ...] -> [..., n * B, ...]
            x = jnp.moveaxis(x, 0, b)
            folded.append(x.reshape(x.shape[:b] + (-1,) + x.shape[b + 2 :]))
        results = []
        for y, layout in zip(call(*folded), outs, strict=True):
            b = layout.index("b")  # [..., n * B, ...] -> [n, ..., B, ...]
            y = y.reshape(y.shape[:b] + (axis_size, -1) + y.shape[b + 1 :])
            results.append(jnp.moveaxis(y, b, 0))
        return tuple(results), (True,) * len(results)

    return call


def with_shardings_of(values, like):
    """Each of ``values`` resharded to the sharding in the type of its counterpart in ``like``,
    where that type has ``Explicit`` mesh axes (elsewhere the value as it is): a custom VJP's
    cotangents must have the primal inputs' types, and a replicated input (a zero initial
    state built inside the op) gets a cotangent computed sharded."""
    out = []
    for x, ref in zip(values, like, strict=True):
        sharding = jax.typeof(ref).sharding
        if sharding.mesh.explicit_axes and jax.typeof(x).sharding.spec != sharding.spec:
            x = jax.sharding.reshard(x, sharding.spec)
        out.append(x)
    return tuple(out)


def _one_device() -> bool:
    mesh = jax.sharding.get_abstract_mesh()
    return mesh.size == 1 if not mesh.empty else jax.device_count() == 1
