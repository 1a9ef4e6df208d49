"""Linear-recurrence ops as pure JAX functions, one folder per op.

* :mod:`~jaxlib_ext.pallas_kernels.mdn`: the momentum delta rule (Momentum DeltaNet, arXiv
  2605.05838), :func:`momentum_delta_rule`, with its recurrent reference, chunkwise XLA form and
  Pallas kernels (:func:`momentum_delta_rule_pallas`, tuned by :class:`MDNKernelConfig`);
* :mod:`~jaxlib_ext.pallas_kernels.gated_delta`: the gated delta rule (Gated DeltaNet, arXiv
  2412.06464), :func:`gated_delta_rule`, whose Pallas path runs the momentum delta rule's
  kernels.

Each op takes ``method="auto" | "recurrent" | "chunk" | "pallas"`` (:data:`METHODS`).
"""

from jaxlib_ext.pallas_kernels import gated_delta, mdn
from jaxlib_ext.pallas_kernels._common import METHODS, SUPPORTED_CHUNK_SIZES
from jaxlib_ext.pallas_kernels.gated_delta import gated_delta_rule
from jaxlib_ext.pallas_kernels.mdn import momentum_delta_rule

__all__ = [
    "METHODS",
    "SUPPORTED_CHUNK_SIZES",
    "MDNKernelConfig",
    "gated_delta",
    "gated_delta_rule",
    "mdn",
    "momentum_delta_rule",
    "momentum_delta_rule_pallas",
]


def __getattr__(name):  # the Pallas modules load on first use
    if name in ("MDNKernelConfig", "momentum_delta_rule_pallas"):
        return getattr(mdn, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
