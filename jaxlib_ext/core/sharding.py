"""Meshes, logical-axis rules and placement helpers.

A mesh is described by a spec string such as ``"data=2,fsdp=2"`` (the default puts all
devices on ``data``). Parameters carry ``logical_axes`` metadata (``("embed", "mlp")``,
...); :data:`DEFAULT_RULES` maps each logical axis to a mesh axis, MaxText-style, and
:func:`logical_to_spec` turns a parameter's logical axes into a ``PartitionSpec``. A mesh
axis is only used when it divides the dimension, so odd shapes fall back to replication
instead of failing.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import jax
import numpy as np
from flax import nnx
from jax.sharding import AxisType, Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

__all__ = [
    "MESH_AXES",
    "DEFAULT_RULES",
    "parse_mesh_spec",
    "make_mesh",
    "logical_to_spec",
    "param_shardings",
    "state_shardings",
    "batch_sharding",
    "replicated",
    "data_parallel_size",
]

MESH_AXES = ("data", "fsdp", "tensor", "expert")
# the batch is split over every data-parallel axis; expert-parallel devices are data-parallel
# outside the mixture-of-experts layers (whose tokens travel by all-to-all over ``expert``)
BATCH_AXES = ("data", "fsdp", "expert")

# logical axis -> mesh axis (or None: replicated)
DEFAULT_RULES: dict[str, str | None] = {
    "batch": "data",
    "embed": "fsdp",
    "vocab": "tensor",
    "mlp": "tensor",
    "heads": "tensor",
    "kv": None,
    "expert": "expert",
    "norm": None,
}


def parse_mesh_spec(spec: str | None, num_devices: int) -> dict[str, int]:
    """Parses ``"data=2,fsdp=2"``; ``-1`` (at most once) takes the remaining devices.

    Args:
      spec: ``axis=size`` pairs joined by commas, axes from :data:`MESH_AXES`; ``None`` or
        ``""`` means all devices on ``data``.
      num_devices: the number of devices the sizes must multiply to.

    Returns:
      The sizes by axis name (only the axes given).

    Raises:
      ValueError: naming ``spec``, when it does not parse or its sizes do not multiply to
        ``num_devices``.
    """
    if not spec:
        return {"data": num_devices}
    sizes: dict[str, int] = {}
    for part in spec.split(","):
        name, sep, value = part.strip().partition("=")
        if not sep or name not in MESH_AXES:
            raise ValueError(
                f"spec: cannot parse {part!r} in {spec!r}; use axis=size with axes from "
                f"{MESH_AXES}, e.g. 'data=2,fsdp=2'"
            )
        if name in sizes:
            raise ValueError(f"spec: axis {name!r} given twice in {spec!r}")
        try:
            sizes[name] = int(value)
        except ValueError:
            raise ValueError(
                f"spec: size of {name!r} must be an integer, got {value!r}"
            ) from None
    wild = [n for n, s in sizes.items() if s == -1]
    if len(wild) > 1:
        raise ValueError(f"spec: at most one axis may be -1, got {spec!r}")
    fixed = math.prod(s for s in sizes.values() if s != -1)
    if any(s == 0 or s < -1 for s in sizes.values()):
        raise ValueError(f"spec: sizes must be positive (or -1), got {spec!r}")
    if wild:
        if num_devices % fixed:
            raise ValueError(
                f"spec: {spec!r} cannot fill {num_devices} devices ({fixed} does not divide it)"
            )
        sizes[wild[0]] = num_devices // fixed
    if math.prod(sizes.values()) != num_devices:
        raise ValueError(
            f"spec: axis sizes in {spec!r} multiply to {math.prod(sizes.values())}, but there "
            f"are {num_devices} devices; make the product {num_devices} (or use -1 for one axis)"
        )
    return sizes


def make_mesh(spec: str | None = None, devices: Sequence | None = None) -> Mesh:
    """A mesh with axes ``("data", "fsdp", "tensor", "expert")`` (size 1 where not given).

    Axes are ``AxisType.Auto``: XLA's sharding propagation inserts the collectives, as with
    classic ``jit`` + ``NamedSharding`` training code.

    Args:
      spec: the mesh spec (:func:`parse_mesh_spec`); ``None`` means all devices on ``data``.
      devices: the devices; ``None`` means ``jax.devices()``.

    Returns:
      The ``Mesh``.

    Raises:
      ValueError: as :func:`parse_mesh_spec`.
    """
    devices = list(jax.devices() if devices is None else devices)
    sizes = parse_mesh_spec(spec, len(devices))
    shape = tuple(sizes.get(a, 1) for a in MESH_AXES)
    return jax.make_mesh(
        shape, MESH_AXES, axis_types=(AxisType.Auto,) * len(MESH_AXES), devices=devices
    )


def data_parallel_size(mesh: Mesh) -> int:
    """The number of batch shards.

    Args:
      mesh: a device mesh.

    Returns:
      The product of the ``data``, ``fsdp`` and ``expert`` axis sizes of ``mesh`` (absent axes
      count as 1).
    """
    return math.prod(mesh.shape[a] for a in BATCH_AXES if a in mesh.shape)


def replicated(mesh: Mesh) -> NamedSharding:
    """The fully replicated ``NamedSharding`` of ``mesh``.

    Args:
      mesh: a device mesh.

    Returns:
      ``NamedSharding(mesh, PartitionSpec())``.
    """
    return NamedSharding(mesh, P())


def batch_sharding(mesh: Mesh) -> NamedSharding:
    """Leading (batch) axis split over ``data``, ``fsdp`` and ``expert`` (those in ``mesh``).

    Args:
      mesh: the device mesh.

    Returns:
      The batch's ``NamedSharding``.
    """
    return NamedSharding(mesh, P(tuple(a for a in BATCH_AXES if a in mesh.shape)))


def logical_to_spec(
    logical_axes: Sequence[str | None] | None,
    shape: Sequence[int],
    mesh: Mesh,
    rules: Mapping[str, str | None] = DEFAULT_RULES,
) -> P:
    """Maps logical axes to a ``PartitionSpec`` under ``rules``.

    A mesh axis is used at most once and only where it divides the dimension; everything
    else is replicated.

    Args:
      logical_axes: one logical name (or ``None``) per dimension; ``None`` (no annotation),
        or a length other than ``shape``'s, replicates.
      shape: the array's shape.
      mesh: the device mesh.
      rules: logical axis -> mesh axis (or ``None``: replicated).

    Returns:
      The ``PartitionSpec``.
    """
    if logical_axes is None or len(logical_axes) != len(shape):
        return P()
    used: set[str] = set()
    spec = []
    for name, dim in zip(logical_axes, shape, strict=True):
        axis = rules.get(name) if name is not None else None
        if axis is None or axis in used or mesh.shape.get(axis, 1) == 1 or dim % mesh.shape[axis]:
            spec.append(None)
        else:
            spec.append(axis)
            used.add(axis)
    return P(*spec)


def _is_var(x) -> bool:
    return isinstance(x, nnx.Variable)


def param_shardings(params, mesh: Mesh, rules: Mapping[str, str | None] = DEFAULT_RULES):
    """``NamedSharding`` per parameter, read from each variable's ``logical_axes`` metadata.

    Args:
      params: an ``nnx.State`` (or any pytree of ``nnx.Variable``/arrays, abstract or
        concrete); plain arrays are replicated.
      mesh: the device mesh.
      rules: logical axis -> mesh axis (:func:`logical_to_spec`).

    Returns:
      The same structure with shardings as leaves.
    """

    def one(x):
        if _is_var(x):
            axes = x.get_metadata().get("logical_axes")
            value = x.get_value() if hasattr(x, "get_value") else x[...]
            spec = logical_to_spec(axes, np.shape(value), mesh, rules)
            return x.replace(NamedSharding(mesh, spec))
        return NamedSharding(mesh, P())

    return jax.tree.map(one, params, is_leaf=_is_var)


def _path_key(path) -> tuple:
    out = []
    for k in path:
        for attr in ("key", "name", "idx"):
            if hasattr(k, attr):
                out.append(getattr(k, attr))
                break
    return tuple(out)


def state_shardings(state_shapes, params_shapes, params_sharding, mesh: Mesh):
    """Shardings for an optimizer state (or any tree derived from the params).

    Each state leaf whose key path ends with a parameter's key path and whose shape
    equals that parameter's gets the parameter's sharding (Adam's ``mu``/``nu``, ...);
    other leaves (step counts, folded or compacted moments) are replicated.

    Args:
      state_shapes: the optimizer state (arrays or their shapes).
      params_shapes: the parameters (arrays or their shapes).
      params_sharding: the parameters' shardings (:func:`param_shardings`).
      mesh: the device mesh.

    Returns:
      The state's structure with shardings as leaves.
    """
    flat_p = jax.tree_util.tree_flatten_with_path(params_shapes)[0]
    flat_s = jax.tree.leaves(params_sharding)
    by_path = {
        _path_key(path): (np.shape(leaf), sh)
        for (path, leaf), sh in zip(flat_p, flat_s, strict=True)
    }
    rep = NamedSharding(mesh, P())

    def one(path, leaf):
        key = _path_key(path)
        for start in range(len(key)):
            hit = by_path.get(key[start:])
            if hit is not None and hit[0] == np.shape(leaf):
                return hit[1]
        return rep

    return jax.tree_util.tree_map_with_path(one, state_shapes)
