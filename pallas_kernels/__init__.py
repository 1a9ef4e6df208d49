"""The methods' hot ops as pure JAX functions, one folder per op: each op's reference, its XLA
fast paths and, where written, its Pallas kernels, behind one ``method=`` argument.

* :mod:`~jaxlib_ext.pallas_kernels.mdn`: the momentum delta rule (Momentum DeltaNet, arXiv
  2605.05838), :func:`momentum_delta_rule`, with its recurrent reference, chunkwise XLA form and
  Pallas kernels (:func:`momentum_delta_rule_pallas`, tuned by :class:`MDNKernelConfig`);
* :mod:`~jaxlib_ext.pallas_kernels.gated_delta`: the gated delta rule (Gated DeltaNet, arXiv
  2412.06464), :func:`gated_delta_rule`, whose Pallas path runs the momentum delta rule's
  kernels;
* :mod:`~jaxlib_ext.pallas_kernels.moe`: grouped matrix multiplication for mixture-of-experts
  dispatch, :func:`gmm` (the ``jax.lax.ragged_dot`` contract) and its weight gradient
  :func:`tgmm`, as a loop over groups, in XLA or a Pallas kernel tiled over group boundaries
  (tuned by ``moe.GMMKernelConfig``);
* :mod:`~jaxlib_ext.pallas_kernels.poet`: the POET-X layer ``x @ (R_in W R_out)`` with
  block-diagonal Cayley–Neumann rotations applied to the activations (arXiv 2506.08001,
  2603.05500), :func:`poet_linear`, in a dense reference, XLA or Pallas kernels;
* :mod:`~jaxlib_ext.pallas_kernels.mlstm`: the stabilised mLSTM cell (xLSTM, arXiv 2405.04517),
  ``mlstm.mlstm``, recurrent or in XLA, quadratic parallel or chunkwise (``xla_form``; no
  Pallas path).

Every op takes ``method`` from one vocabulary, :data:`METHODS` =
``("auto", "reference", "xla", "pallas")``:

* ``"reference"``: the plain readable path that follows the paper's equations (the ``lax.scan``
  recurrence of the linear-recurrence ops, the loop over groups of the grouped matmuls, POET's
  dense ``W_eff``);
* ``"xla"``: the op's XLA fast path (the chunkwise forms, ``ragged_dot``, the input-centric
  rotations); an op with several XLA forms takes the form as its own argument (``mlstm``'s
  ``xla_form="chunk" | "parallel"``);
* ``"pallas"``: the Pallas kernels (every op but ``mlstm``);
* ``"auto"``: one rule for every op (``_common.resolve_auto``): the Pallas kernels on a GPU
  backend where they import and take the operands, otherwise ``"xla"``.

Each op's own ``METHODS`` lists the subset it offers (all four, ``mlstm``'s without
``"pallas"``); any other value raises a ``ValueError`` naming ``method``. The Pallas tunables
(``MDNKernelConfig``, ``moe.GMMKernelConfig``, ``poet.PoetKernelConfig``) follow one protocol
(``_common.KernelConfig``). Every op and method composes with ``jax.jit``, ``jax.grad``,
``jax.vmap`` and ``jax.shard_map`` (``check_vma=True``).
"""

from jaxlib_ext.pallas_kernels import gated_delta, mdn, mlstm, moe, poet
from jaxlib_ext.pallas_kernels._common import METHODS, SUPPORTED_CHUNK_SIZES
from jaxlib_ext.pallas_kernels.gated_delta import gated_delta_rule
from jaxlib_ext.pallas_kernels.mdn import momentum_delta_rule
from jaxlib_ext.pallas_kernels.moe import gmm, tgmm
from jaxlib_ext.pallas_kernels.poet import poet_linear

__all__ = [
    "METHODS",
    "SUPPORTED_CHUNK_SIZES",
    "MDNKernelConfig",
    "gated_delta",
    "gated_delta_rule",
    "gmm",
    "mdn",
    "mlstm",
    "moe",
    "momentum_delta_rule",
    "momentum_delta_rule_pallas",
    "poet",
    "poet_linear",
    "tgmm",
]


def __getattr__(name):  # the Pallas modules load on first use
    if name in ("MDNKernelConfig", "momentum_delta_rule_pallas"):
        return getattr(mdn, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
