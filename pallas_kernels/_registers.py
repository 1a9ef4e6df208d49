"""A register bound for a Pallas Triton kernel: ``.maxnreg`` in its PTX.

Why: Triton's PTX for a kernel carries ``.reqntid`` and no register bound, and for some large
kernels ptxas at -O3 then settles on 32 registers and spills tens of KB per thread (the float32
backward kernels of the momentum delta rule; BENCHMARKS.md). Triton has a ``maxnreg`` option
for this, which it stores as the module attribute ``ttg.maxnreg`` and lowers to ``.maxnreg``;
Pallas's Triton ``CompilerParams`` do not expose it. XLA compiles the Triton module that
Pallas serialises and honours the attribute, so the kernel sets it itself: calling
``max_registers(n)`` in a kernel body binds a primitive whose Triton lowering rule puts
``ttg.maxnreg = n`` on the enclosing module and emits nothing.

The primitive carries an effect only so that it survives dead-code elimination of the kernel
jaxpr (it has no operands or results); ``pallas_call`` does not pass kernel effects on to the
surrounding program. The rule is registered in Pallas's private table of Triton lowering rules;
where that table is missing (a JAX that moved it), ``max_registers`` does nothing and
``AVAILABLE`` is False, so the kernels compile as without it. Outside a Triton lowering (any
other backend, or the Pallas interpreter, which runs a kernel body inside a while loop: the
effect is registered as allowed in control flow) the primitive lowers to nothing.
"""

from __future__ import annotations

from jax.extend import core as jex_core
from jax.interpreters import mlir

__all__ = ["AVAILABLE", "max_registers"]


class _KernelAttributeEffect(jex_core.Effect):
    """Marks an equation that only annotates the kernel being lowered (kept by DCE)."""

    def __repr__(self):
        return "KernelAttribute"


_EFFECT = _KernelAttributeEffect()

max_registers_p = jex_core.Primitive("pallas_triton_max_registers")
max_registers_p.multiple_results = True
max_registers_p.def_impl(lambda *, registers: [])
max_registers_p.def_effectful_abstract_eval(lambda *, registers: ([], {_EFFECT}))
mlir.register_lowering(max_registers_p, lambda ctx, *, registers: [])


def _enclosing_module(op):
    while op is not None and op.name != "builtin.module":
        op = op.parent
    return op


def _triton_rule(ctx, *, registers):
    from jax._src.lib.mlir import ir

    module = _enclosing_module(ir.InsertionPoint.current.block.owner)
    if module is not None:
        module.attributes["ttg.maxnreg"] = ir.IntegerAttr.get(
            ir.IntegerType.get_signless(32), registers
        )
    return []


def _register_triton_rule():
    try:
        from jax._src import effects
        from jax._src.pallas.triton import lowering as triton_lowering

        # the Pallas interpreter runs a kernel body inside a while loop
        effects.control_flow_allowed_effects.add_type(_KernelAttributeEffect)
        triton_lowering.triton_lowering_rules[max_registers_p] = _triton_rule
    except (ImportError, AttributeError):
        return False
    return True


AVAILABLE = _register_triton_rule()


def max_registers(registers: int) -> None:
    """Inside a Pallas Triton kernel body: bound the kernel to ``registers`` registers per
    thread (PTX ``.maxnreg``). A no-op where the bound cannot be set (see the module doc)."""
    if not 24 <= registers <= 255:
        raise ValueError(f"max_registers: registers must be in [24, 255], got {registers}")
    if AVAILABLE:
        max_registers_p.bind(registers=registers)
