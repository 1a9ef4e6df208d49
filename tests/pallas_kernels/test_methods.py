"""Every op runs every method it advertises (its ``METHODS``) and matches its recurrence.

A tiny shape, forward only (the gradients of each path are checked in the op's own tests);
``"auto"`` is whatever it resolves to on this backend. The decode step
(``mdn.decode.momentum_delta_rule_step_pallas``) is a single kernel with no ``method``.
"""

from __future__ import annotations

import jax
import numpy as np
import pytest

from jaxlib_ext.pallas_kernels import gated_delta, mdn, mlstm
from jaxlib_ext.pallas_kernels.gated_delta.reference import gated_delta_rule_recurrent
from jaxlib_ext.pallas_kernels.mdn.reference import momentum_delta_rule_recurrent
from jaxlib_ext.pallas_kernels.mlstm.reference import mlstm_recurrent
from tests.pallas_kernels._helpers import gdn_inputs, mdn_inputs, rel_rmse

TOL = 1e-4  # float32, as in the op tests


def _mdn_case():
    args, s0 = mdn_inputs(70, 1, 20, 1, 16, 16)
    kw = dict(initial_state=s0, output_final_state=True)
    return mdn.momentum_delta_rule, args, kw, momentum_delta_rule_recurrent(*args, **kw)


def _gdn_case():
    x, s0 = gdn_inputs(71, "float32", b=1, t=20, h=1, kd=16, vd=16)
    args = tuple(x[n] for n in ("q", "k", "v", "g", "beta"))
    kw = dict(initial_state=s0, output_final_state=True)
    return gated_delta.gated_delta_rule, args, kw, gated_delta_rule_recurrent(*args, **kw)


def _mlstm_case():
    rng = np.random.default_rng(72)
    q, k = (rng.standard_normal((1, 20, 1, 16), np.float32) for _ in range(2))
    v = rng.standard_normal((1, 20, 1, 16), np.float32)
    i_gate, f_gate = (rng.standard_normal((1, 20, 1), np.float32) for _ in range(2))
    args = (q, k, v, i_gate, f_gate)
    kw = dict(output_final_state=True)
    return mlstm.mlstm, args, kw, mlstm_recurrent(*args, **kw)


OPS = {
    "momentum_delta_rule": (mdn, _mdn_case),
    "gated_delta_rule": (gated_delta, _gdn_case),
    "mlstm": (mlstm, _mlstm_case),
}
CASES = [(op, method) for op, (pkg, _) in OPS.items() for method in pkg.METHODS]


@pytest.fixture(scope="module")
def cases():
    return {op: make() for op, (_, make) in OPS.items()}


@pytest.mark.parametrize(("op", "method"), CASES, ids=[f"{o}-{m}" for o, m in CASES])
def test_every_advertised_method_runs_and_matches(op, method, cases):
    fn, args, kw, (o_ref, fin_ref) = cases[op]
    o, fin = fn(*args, **kw, method=method, chunk_size=16)
    assert o.shape == o_ref.shape and o.dtype == o_ref.dtype
    assert rel_rmse(o, o_ref) < TOL, rel_rmse(o, o_ref)
    # the final state is one array (delta rules) or a tuple of arrays (mLSTM's C, n, m)
    for part, ref in zip(jax.tree.leaves(fin), jax.tree.leaves(fin_ref), strict=True):
        assert part.shape == ref.shape
        assert rel_rmse(part, ref) < TOL, rel_rmse(part, ref)


@pytest.mark.parametrize("pkg", [mdn, gated_delta], ids=["mdn", "gated_delta"])
def test_auto_is_pallas_on_gpu_and_chunk_elsewhere(pkg, monkeypatch):
    """``"auto"`` resolves to the Pallas kernels on a GPU backend (their module imports) and to
    ``"chunk"`` on any other."""
    import jax

    from jaxlib_ext.pallas_kernels._common import resolve_auto

    resolve = lambda: resolve_auto("auto", pkg._KERNEL_MODULE, pkg._KERNEL_NAME)  # noqa: E731
    for backend, method in (("cpu", "chunk"), ("tpu", "chunk"), ("gpu", "pallas")):
        monkeypatch.setattr(jax, "default_backend", lambda backend=backend: backend)
        assert resolve() == method, backend


@pytest.mark.parametrize(
    "backend, method, dtype, head_dim, expected",
    [
        ("cpu", "pallas", "float32", 128, 64),  # interpreted: no shared-memory limit
        ("gpu", "pallas", "float32", 128, 32),  # the fused backward needs C <= 32 there
        ("gpu", "pallas", "float32", 64, 64),
        ("gpu", "pallas", "bfloat16", 128, 64),
        ("gpu", "chunk", "float32", 128, 64),
    ],
)
def test_default_chunk_size_follows_the_compiled_kernels_limit(
    monkeypatch, backend, method, dtype, head_dim, expected
):
    import jax
    import jax.numpy as jnp

    from jaxlib_ext.pallas_kernels import _common

    monkeypatch.setattr(jax, "default_backend", lambda: backend)
    assert _common.default_chunk_size(method, jnp.dtype(dtype), head_dim) == expected


def test_tgmm_pallas_under_grad_names_the_differentiable_method():
    """``moe.tgmm``'s Pallas kernel is not differentiable: ``grad`` raises an error naming
    ``method="xla"``, which differentiates (and matches the loop over groups)."""
    from jaxlib_ext.pallas_kernels import moe
    from jaxlib_ext.pallas_kernels.moe.reference import tgmm_loop

    rng = np.random.default_rng(73)
    lhs, grad = rng.standard_normal((12, 8), np.float32), rng.standard_normal((12, 8), np.float32)
    sizes = np.array([5, 0, 7], np.int32)

    def loss(method, tgmm=moe.tgmm):
        return lambda x: (tgmm(x, grad, sizes, **({"method": method} if method else {})) ** 2).sum()

    with pytest.raises(NotImplementedError, match='method="xla"'):
        jax.grad(loss("pallas"))(lhs)
    want = jax.grad(loss(None, tgmm_loop))(lhs)
    assert rel_rmse(jax.grad(loss("xla"))(lhs), want) < TOL
