"""Memory accounting: bytes of a pytree, a compiled step's memory analysis, device stats."""

from __future__ import annotations

import jax
import numpy as np

__all__ = ["tree_bytes", "compiled_memory", "device_memory_stats", "format_bytes"]


def tree_bytes(tree) -> int:
    """Total bytes of the array leaves of ``tree`` (concrete or ``ShapeDtypeStruct``).

    Sharded arrays count their global size once, not once per device.

    Args:
      tree: a pytree; leaves without ``shape`` and ``dtype`` count 0.

    Returns:
      The byte count, an int.
    """
    total = 0
    for leaf in jax.tree.leaves(tree):
        if hasattr(leaf, "shape") and hasattr(leaf, "dtype"):
            total += int(np.prod(leaf.shape, dtype=np.int64)) * np.dtype(leaf.dtype).itemsize
    return total


def compiled_memory(compiled) -> dict[str, int]:
    """Per-device byte counts from ``jit(f).lower(...).compile().memory_analysis()``.

    Keys: ``argument``, ``output``, ``temp``, ``alias``, ``generated_code`` and ``peak``
    (argument + output + temp - alias, the usual upper bound on live bytes).

    Args:
      compiled: a compiled executable (``jit(f).lower(...).compile()``).

    Returns:
      The byte counts by key; empty when the backend reports nothing.
    """
    stats = compiled.memory_analysis()
    if stats is None:
        return {}
    out = {
        "argument": int(stats.argument_size_in_bytes),
        "output": int(stats.output_size_in_bytes),
        "temp": int(stats.temp_size_in_bytes),
        "alias": int(stats.alias_size_in_bytes),
        "generated_code": int(stats.generated_code_size_in_bytes),
    }
    out["peak"] = out["argument"] + out["output"] + out["temp"] - out["alias"]
    return out


def device_memory_stats(device: jax.Device | None = None) -> dict[str, int]:
    """``device.memory_stats()`` where the backend has it (GPU, TPU); ``{}`` on CPU.

    Args:
      device: the device; ``None`` means the first local device.

    Returns:
      The backend's statistics by name (bytes), or ``{}``.
    """
    device = device or jax.local_devices()[0]
    try:
        return dict(device.memory_stats() or {})
    except (AttributeError, NotImplementedError, RuntimeError):
        return {}


def format_bytes(n: float) -> str:
    """A byte count in binary units.

    Args:
      n: the bytes.

    Returns:
      ``"512 B"``, ``"1.5 KiB"``, ... up to TiB.
    """
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    raise AssertionError("unreachable")
