"""What the benchmarks share: the timing loop, compiled memory, markdown tables, the header line
that says where a table was measured, and the common command-line arguments.

Timing is :mod:`jaxlib_ext.core.timing` (warm-up calls not counted, every call blocked, the
median and interquartile range of the repeats); memory is XLA's ``memory_analysis`` of the
compiled program (:func:`jaxlib_ext.core.memory.compiled_memory`: arguments + outputs +
temporaries - aliased bytes, the planned peak of that executable).
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
from collections.abc import Sequence

import jax

from jaxlib_ext.core.memory import compiled_memory
from jaxlib_ext.core.timing import Timing, summarize, time_call, time_steps, timed

__all__ = ["Timing", "environment", "markdown_table", "parser", "peak_bytes", "summarize",
           "time_call", "time_steps", "timed"]

MIB = 2.0**-20  # bytes -> MiB


def parser(doc: str | None, *, repeats: int | None = 5) -> argparse.ArgumentParser:
    """An argument parser described by the first line of the script's docstring, with
    ``--repeats`` (timed calls per measurement) unless ``repeats`` is None."""
    ap = argparse.ArgumentParser(description=(doc or "").strip().splitlines()[0] if doc else None)
    if repeats is not None:
        ap.add_argument("--repeats", type=int, default=repeats,
                        help="timed calls per measurement, after one untimed warm-up call")
    return ap


def environment() -> str:
    """Where and when: backend, device kind and count, JAX version, processor, CPU count, date."""
    dev = jax.devices()[0]
    return (f"backend={jax.default_backend()} ({getattr(dev, 'device_kind', dev.platform)} x "
            f"{jax.device_count()}), jax {jax.__version__}, "
            f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, "
            f"{datetime.date.today().isoformat()}")


def peak_bytes(jitted, *args) -> float:
    """Planned peak bytes of ``jitted`` compiled for ``args`` (NaN when the backend reports
    nothing)."""
    return float(compiled_memory(jitted.lower(*args).compile()).get("peak", float("nan")))


def markdown_table(header: Sequence[str], rows: Sequence[Sequence], *,
                   align: str | None = None) -> str:
    """A markdown table; ``align`` is one character per column, ``l`` or ``r`` (default: the
    first column left, the others right)."""
    align = align or "l" + "r" * (len(header) - 1)
    if len(align) != len(header):
        raise ValueError(f"align must have one character per column ({len(header)}), got {align!r}")
    if any(len(r) != len(header) for r in rows):
        raise ValueError("every row must have one cell per column")
    rule = "|" + "|".join("---:" if a == "r" else "---" for a in align) + "|"
    lines = ["| " + " | ".join(map(str, header)) + " |", rule]
    lines += ["| " + " | ".join(map(str, r)) + " |" for r in rows]
    return "\n".join(lines)


#: the rows of a forward / forward+backward table: label, key of :func:`forward_backward`, scale
FORWARD_BACKWARD_ROWS = (
    ("forward time (ms)", "fwd_s", 1e3),
    ("forward+backward time (ms)", "bwd_s", 1e3),
    ("forward peak memory (MiB)", "fwd_mem", MIB),
    ("forward+backward peak memory (MiB)", "bwd_mem", MIB),
)


def forward_backward(fwd, fwdbwd, *args, repeats: int) -> dict[str, float]:
    """Median seconds and planned peak bytes of a jitted forward and forward+backward."""
    return dict(fwd_s=time_call(fwd, *args, repeats=repeats).median,
                bwd_s=time_call(fwdbwd, *args, repeats=repeats).median,
                fwd_mem=peak_bytes(fwd, *args), bwd_mem=peak_bytes(fwdbwd, *args))


def forward_backward_table(results: dict[str, dict], ratio: tuple[str, str],
                           ratio_label: str | None = None) -> str:
    """One column per contender of ``results`` (:func:`forward_backward` dicts) and a last
    column ``ratio[0] / ratio[1]``, headed ``ratio_label``."""
    num, den = (results[c] for c in ratio)
    cols = list(results)
    return markdown_table(
        ["metric", *cols, ratio_label or f"{ratio[0]} / {ratio[1]}"],
        [[label, *(f"{results[c][key] * scale:.1f}" for c in cols),
          f"{num[key] / den[key]:.1f}x"] for label, key, scale in FORWARD_BACKWARD_ROWS])
