"""Expert parallelism: the routed experts sharded over a mesh axis, tokens moved by all-to-all.

With ``P`` devices on the expert axis and ``E`` experts, device ``p`` holds experts
``[p E/P, (p + 1) E/P)``. Tokens are split over the mesh's token axes (the data-parallel axes
and the expert axis itself). Per device, inside ``jax.shard_map``:

1. its ``T_l * k`` (token, expert) pairs are sorted by expert, hence by destination device;
2. the latent rows are written to a send buffer ``[P, C, l]`` (slot ``[p, i]``: the ``i``-th
   pair bound for device ``p``), with ``C = T_l * k`` so that no pair is ever dropped (the
   dropless worst case: every pair to one device), and the receiving expert's local index
   beside it (``E/P`` marks an empty slot);
3. ``jax.lax.all_to_all`` over the expert axis delivers to each device the rows for its experts
   from every device, ``[P, C, l]``;
4. the received rows are sorted by local expert (empty slots last, past the group sizes, so
   the grouped matmuls give them zeros) and run through the local experts;
5. a second ``all_to_all`` returns the results to their source, where they are weighted,
   put back in (token, slot) order and summed over the ``k`` slots.

The result equals the unsharded dispatch (:mod:`_moe_dispatch`) up to float summation order.
Called inside a ``shard_map`` that is already manual over the expert axis (a data-parallel
training step written with ``shard_map``: tokens local, weights replicated), each device keeps
its slice of the experts and runs steps 1-5 directly.
The fixed-size buffers cost ``P`` times the activations of a capacity-free layer; a ragged
all-to-all (``jax.lax.ragged_all_to_all``, GPU/TPU) would send only the occupied slots.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from jaxlib_ext.models._moe_dispatch import Routing, grouped_experts, sort_by_expert

__all__ = ["check_expert_mesh", "dispatch_expert_parallel", "token_axes"]

_DATA_AXES = ("data", "fsdp")


def check_expert_mesh(mesh, num_experts: int, axis: str = "expert") -> int:
    """The size of the expert axis of a mesh, checked against the number of experts.

    Args:
      mesh: a ``Mesh`` or ``AbstractMesh``, or ``None``.
      num_experts: the number of experts.
      axis: the expert axis's name.

    Returns:
      The size of ``axis`` in ``mesh`` (1 when absent or without a mesh).

    Raises:
      ValueError: naming ``mesh``, when the size does not divide ``num_experts``.
    """
    size = dict(mesh.shape).get(axis, 1) if mesh is not None else 1
    if num_experts % size:
        raise ValueError(
            f"mesh: the {axis!r} axis has size {size}, which does not divide num_experts = "
            f"{num_experts}; use an expert-axis size that divides the number of experts"
        )
    return size


def token_axes(mesh, axis: str = "expert") -> tuple[str, ...]:
    """The mesh axes the tokens are split over.

    Args:
      mesh: a ``Mesh`` or ``AbstractMesh``.
      axis: the expert axis's name.

    Returns:
      The names, in order, of the data-parallel axes (``data``, ``fsdp``) and ``axis`` whose
      size is above 1.
    """
    shape = dict(mesh.shape)
    return tuple(a for a in (*_DATA_AXES, axis) if shape.get(a, 1) > 1)


def _local(z, experts, weights, w1, w2, *, axis, method, config):
    """One device's part (module docstring, steps 1-5)."""
    parts = jax.lax.axis_size(axis)
    local_experts = w1.shape[0]
    t, k = experts.shape
    cap = t * k
    order, inverse, _ = sort_by_expert(experts, local_experts * parts)
    flat = experts.reshape(-1)[order]
    dest = flat // local_experts
    sent = jnp.zeros((parts,), jnp.int32).at[dest].add(1)
    start = jnp.cumsum(sent) - sent
    slot = jnp.arange(cap, dtype=jnp.int32) - start[dest]
    rows = jnp.take(z, order // k, axis=0)
    send = jnp.zeros((parts, cap, z.shape[1]), z.dtype).at[dest, slot].set(rows)
    ids = jnp.full((parts, cap), local_experts, jnp.int32).at[dest, slot].set(flat % local_experts)

    recv = jax.lax.all_to_all(send, axis, 0, 0, tiled=False)
    recv_ids = jax.lax.all_to_all(ids, axis, 0, 0, tiled=False).reshape(-1)
    order2, inverse2, sizes2 = sort_by_expert(recv_ids, local_experts)
    rows2 = jnp.take(recv.reshape(parts * cap, -1), order2, axis=0)
    out2 = grouped_experts(rows2, sizes2, w1, w2, method=method, config=config)
    out2 = jnp.take(out2, inverse2, axis=0).reshape(parts, cap, -1)

    back = jax.lax.all_to_all(out2, axis, 0, 0, tiled=False)
    y = back[dest, slot] * weights.reshape(-1)[order][:, None].astype(back.dtype)
    return jnp.sum(jnp.take(y, inverse, axis=0).reshape(t, k, -1), axis=1)


def dispatch_expert_parallel(
    z, routing: Routing, w1, w2, *, mesh, axis: str = "expert", method: str = "xla",
    config=None,
):  # fmt: skip
    """The routed expert output ``[T, l]`` with experts sharded over ``mesh``'s ``axis``.

    Args:
      z: ``[T, l]`` latent tokens.
      routing: the router's decision for them.
      w1: ``[E, l, m]`` first expert weights (split over ``axis`` inside).
      w2: ``[E, m, l]`` second expert weights (split over ``axis`` inside).
      mesh: a ``Mesh`` or ``AbstractMesh`` with ``axis``.
      axis: the expert axis's name.
      method: the local grouped matmuls' method, ``"xla"`` (default), ``"pallas"`` or
        ``"auto"`` (:func:`~jaxlib_ext.models._moe_dispatch.grouped_experts`).
      config: the Pallas grouped matmul's ``GMMKernelConfig``, or ``None``.

    Returns:
      ``[T, l]`` routed output, equal to the unsharded dispatch up to summation order.

    Raises:
      ValueError: ``axis`` does not divide the number of experts, or the token axes do not
        divide ``T``.
    """
    check_expert_mesh(mesh, w1.shape[0], axis)
    if axis in getattr(mesh, "manual_axes", ()):
        # already inside a shard_map over ``axis`` (tokens local, weights whole): keep this
        # device's experts and exchange directly
        parts = dict(mesh.shape)[axis]
        local = w1.shape[0] // parts
        start = jax.lax.axis_index(axis) * local
        w1 = jax.lax.dynamic_slice_in_dim(w1, start, local, axis=0)
        w2 = jax.lax.dynamic_slice_in_dim(w2, start, local, axis=0)
        return _local(
            z, routing.experts, routing.weights, w1, w2, axis=axis, method=method, config=config
        )
    toks = token_axes(mesh, axis)
    split = math.prod(dict(mesh.shape)[a] for a in toks)
    if z.shape[0] % split:
        raise ValueError(
            f"x: {z.shape[0]} tokens cannot be split over the mesh axes {toks} "
            f"({split} shards); make the token count a multiple of {split}"
        )
    tok = P(toks)

    def body(z, experts, weights, w1, w2):
        return _local(z, experts, weights, w1, w2, axis=axis, method=method, config=config)

    fn = jax.shard_map(
        body,
        mesh=mesh,
        in_specs=(tok, tok, tok, P(axis), P(axis)),
        out_specs=tok,
        check_vma=False,
    )
    return fn(z, routing.experts, routing.weights, w1, w2)
