"""Compiler and tuning diagnostics for authors of the Pallas kernels (not shipped in the wheel).

Each module is one tool or one piece of one, and each tool runs from the repository root::

    python -m tools.kernel_audit.xla_aot              # XLA's own compile for an H200, no GPU
    python -m tools.kernel_audit.triton_resources all # pip Triton's compile for sm_90a, no GPU
    python -m tools.kernel_audit.tuning --check       # GPU: check, then time TUNE_CANDIDATES

Modules:

* ``target``: the H200's limits and XLA's description of it.
* ``inputs``: the op's inputs at a shape, abstract or random; the benchmark shape.
* ``candidates``: ``TUNE_CANDIDATES``, the kernel options worth timing on a GPU.
* ``toolchain``: ptxas (behind a wrapper that keeps its input and report), libdevice, nvdisasm.
* ``sass``: instructions and spill traffic outside loops and per loop iteration, from SASS.
* ``xla_aot``: the programs, their deviceless compile by XLA, and the report.
* ``triton_resources``: Triton IR of every kernel, then pip Triton's compile and ``ptxas -v``.
* ``mdn_probes``: the Pallas op with its options as flat keywords (the candidates' form), and
  whether the Mosaic GPU state kernel applies at a shape.
* ``check``: the Pallas op against the recurrence (outputs, final state, gradients).
* ``tuning``: times the candidates and keeps the fastest.

How it is imported. The package lives in ``tools/``, outside the installed namespace
``jaxlib_ext`` (pyproject's ``[tool.setuptools] packages`` does not list it). From the
repository root, ``python -m tools.kernel_audit.<module>`` finds it through ``tools`` as an
implicit namespace package, because ``-m`` puts the current directory first on the path. The
tests import it as ``kernel_audit``: pytest's ``pythonpath = ["tools"]`` puts that one folder
on the path. The repository root itself is not put there, because it would make the bare
family folders (``models``, ``optim``, ``samplers``, ``pallas_kernels``) importable under names
the project forbids and let the source folder ``jaxlib_ext/`` shadow an installed wheel. Every
import inside the package is relative, so both names load the same code. Importing the package
imports nothing else: the Triton compile stage runs in a python without JAX.
"""

from .candidates import MOSAIC_CANDIDATES, TUNE_CANDIDATES
from .inputs import DEFAULT_SHAPE
from .target import MAX_REGISTERS, SHARED_LIMIT

__all__ = [
    "DEFAULT_SHAPE",
    "MAX_REGISTERS",
    "MOSAIC_CANDIDATES",
    "SHARED_LIMIT",
    "TUNE_CANDIDATES",
]
