"""Reading the ``method`` fields of saved configs in the library's one vocabulary.

Every op and LatentMoE's dispatch name their implementation by
:data:`jaxlib_ext.pallas_kernels.METHODS` (``"auto" | "reference" | "xla" | "pallas"``), with an
op's XLA form in its own field (the mLSTM's ``xla_form``). Configs saved to disk (a checkpoint's
recorded :class:`~jaxlib_ext.models.LMConfig`, a distillation run's ``config.json``) may carry
the names of the per-op vocabularies that came before it; :func:`read_saved_methods` reads them
as these.
"""

from __future__ import annotations

from collections.abc import Mapping

__all__ = ["SAVED_METHOD_NAMES", "read_saved_methods"]

#: The per-op method names a saved config may carry, read as ``(method, xla_form)`` of the
#: library's vocabulary (``xla_form`` ``None``: the field keeps its value): the delta rules' and
#: the mLSTM's ``"recurrent"`` (the ``lax.scan`` reference), their ``"chunk"`` and the mLSTM's
#: ``"parallel"`` (XLA forms), LatentMoE's ``"ragged"`` (the grouped matmul's XLA path) and
#: ``"dense"`` (the masked dense reference). The names are disjoint, so one table serves every
#: part.
SAVED_METHOD_NAMES: dict[str, tuple[str, str | None]] = {
    "recurrent": ("reference", None),
    "chunk": ("xla", "chunk"),
    "parallel": ("xla", "parallel"),
    "ragged": ("xla", None),
    "dense": ("reference", None),
}


def read_saved_methods(fields: Mapping, keys: tuple[str, ...] = ("method",)) -> dict:
    """``fields`` of a saved config with the per-op method names of its ``keys`` read in the
    library's vocabulary (:data:`SAVED_METHOD_NAMES`).

    Args:
      fields: a config's fields (a part's dict, or a flat record).
      keys: the fields that hold a method: ``"method"``, and ``"moe_method"`` in a flat record
        of :class:`~jaxlib_ext.models.LMConfig` (the FFN's method).

    Returns:
      A new dict: each method of ``keys`` in :data:`~jaxlib_ext.pallas_kernels.METHODS`; for a
      saved XLA form (``"chunk"``, ``"parallel"`` in ``"method"``), ``xla_form`` set to it where
      the form matters (``"parallel"``, or a record that has an ``xla_form``).
    """
    out = dict(fields)
    for key in keys:
        saved = out.get(key)
        if not isinstance(saved, str) or saved not in SAVED_METHOD_NAMES:
            continue
        method, form = SAVED_METHOD_NAMES[saved]
        out[key] = method
        if form is not None and key == "method" and (form != "chunk" or "xla_form" in out):
            out["xla_form"] = form
    return out
