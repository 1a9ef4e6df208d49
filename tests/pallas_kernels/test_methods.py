"""Every op of ``pallas_kernels`` runs every method it advertises (its ``METHODS``) and composes.

One adapter per op (:class:`Op`) says how to call it, what its ground truth is, which arguments
are differentiable and how its inputs split over devices. For every op and method:

* forward and gradient equal the reference's (a vjp with a fixed random cotangent);
* ``jax.vmap`` over an extra leading axis equals the loop over it;
* ``jax.shard_map`` over 8 devices (``check_vma=True``) with the batch split and the weights
  replicated equals the unsharded call, forward and gradient (a replicated weight's gradient
  is the sum over the devices').

Shapes are tiny but not trivial (T not a multiple of the chunk, two heads, batch 8, empty
groups, rows past the groups' sum); ``"auto"`` is whatever it resolves to on this backend. The
decode step (``mdn.decode.momentum_delta_rule_step_pallas``) is a single kernel with no
``method``.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from types import ModuleType

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from jaxlib_ext.pallas_kernels import METHODS, gated_delta, mdn, mlstm, moe, poet
from jaxlib_ext.pallas_kernels._common import load_kernel, resolve_auto
from jaxlib_ext.pallas_kernels.gated_delta.reference import gated_delta_rule_recurrent
from jaxlib_ext.pallas_kernels.mdn.reference import momentum_delta_rule_recurrent
from jaxlib_ext.pallas_kernels.mlstm.reference import mlstm_recurrent
from tests.pallas_kernels._helpers import gdn_inputs, mdn_inputs, rel_rmse

TOL = 1e-4  # float32, as in the op tests
DEVICES = 8
B, T, H, K, V, CHUNK = DEVICES, 20, 2, 16, 12, 16


@dataclasses.dataclass(frozen=True)
class Op:
    """How the shared tests drive one op.

    Attributes:
      pkg: the op's package (its ``METHODS``).
      inputs: ``seed -> args``, the positional arrays of one problem.
      call: ``(method, *args) -> outputs`` (a pytree of float arrays).
      reference: ``(*args) -> outputs``, the ground truth.
      diff: the positions of the differentiable arguments.
      split: ``args -> (args, axes)``: the arguments of the sharded run, as global arrays,
        and for each the axis split over the devices (``None``: replicated).
      local: ``(method, *local_args) -> outputs`` on one device's part, the outputs split
        over the devices on axis 0 or, where ``summed``, ``psum``-ed over them.
      summed: the outputs of the whole problem are the sum of the devices'.
    """

    pkg: ModuleType
    inputs: Callable
    call: Callable
    reference: Callable
    diff: tuple[int, ...]
    split: Callable = lambda args: (args, (0,) * len(args))  # noqa: E731
    local: Callable | None = None
    summed: bool = False


# ------------------------------------------------------------------ the linear-recurrence ops


def _mdn_inputs(seed):
    args, s0 = mdn_inputs(seed, B, T, H, K, V)
    return (*args, s0)


def _mdn_call(method, *args, fn=mdn.momentum_delta_rule):
    *xs, s0 = args
    return fn(*xs, initial_state=s0, output_final_state=True, method=method, chunk_size=CHUNK)


def _mdn_reference(*args):
    *xs, s0 = args
    return momentum_delta_rule_recurrent(*xs, initial_state=s0, output_final_state=True)


def _gdn_inputs(seed):
    x, s0 = gdn_inputs(seed, "float32", b=B, t=T, h=H, kd=K, vd=V)
    return (*(x[n] for n in ("q", "k", "v", "g", "beta")), s0)


def _gdn_call(method, *args):
    *xs, s0 = args
    return gated_delta.gated_delta_rule(
        *xs, initial_state=s0, output_final_state=True, method=method, chunk_size=CHUNK
    )


def _gdn_reference(*args):
    *xs, s0 = args
    return gated_delta_rule_recurrent(*xs, initial_state=s0, output_final_state=True)


def _mlstm_inputs(seed):
    rng = np.random.default_rng(seed)
    normal = lambda *s: jnp.asarray(rng.standard_normal(s, np.float32))  # noqa: E731
    return (normal(B, T, H, K), normal(B, T, H, K), normal(B, T, H, V), normal(B, T, H),
            normal(B, T, H))  # fmt: skip


def _mlstm_call(method, *args, xla_form="chunk"):
    return mlstm.mlstm(
        *args, output_final_state=True, method=method, xla_form=xla_form, chunk_size=CHUNK
    )


def _mlstm_reference(*args):
    return mlstm_recurrent(*args, output_final_state=True)


# ------------------------------------------------------------------ grouped matmuls

M_LOCAL, GK, GN = 6, 8, 10  # rows per device, contraction and output sizes
GROUPS = (13, 0, 21, 8)  # an empty group, boundaries inside devices' rows, 6 rows past the sum


def _gmm_inputs(seed):
    rng = np.random.default_rng(seed)
    m = DEVICES * M_LOCAL
    sizes = np.array(GROUPS if seed % 2 else GROUPS[::-1], np.int32)
    lhs = jnp.asarray(rng.standard_normal((m, GK), np.float32))
    rhs = jnp.asarray(rng.standard_normal((len(GROUPS), GK, GN), np.float32))
    grad = jnp.asarray(rng.standard_normal((m, GN), np.float32))
    return lhs, rhs, grad, jnp.asarray(sizes)


def _local_sizes(sizes):
    """``[G]`` group sizes of all rows -> ``[DEVICES * G]``: device ``d``'s share of each group
    among its ``M_LOCAL`` consecutive rows (the groups of a contiguous row split)."""
    sizes = np.asarray(sizes)
    ends = np.cumsum(sizes)
    starts = ends - sizes
    lo = np.arange(DEVICES)[:, None] * M_LOCAL
    share = np.clip(np.minimum(ends, lo + M_LOCAL) - np.maximum(starts, lo), 0, None)
    return jnp.asarray(share.reshape(-1).astype(np.int32))


def _split_rows(args):
    """The rows (and their groups) split over the devices, ``rhs`` replicated."""
    lhs, rhs, grad, sizes = args
    return (lhs, rhs, grad, _local_sizes(sizes)), (0, None, 0, 0)


OPS: dict[str, Op] = {
    "momentum_delta_rule": Op(
        mdn, _mdn_inputs, _mdn_call, _mdn_reference, diff=tuple(range(9)),
        split=lambda a: (a, (0,) * 8 + (1,)),
    ),
    "gated_delta_rule": Op(
        gated_delta, _gdn_inputs, _gdn_call, _gdn_reference, diff=tuple(range(6)),
    ),
    "mlstm": Op(mlstm, _mlstm_inputs, _mlstm_call, _mlstm_reference, diff=tuple(range(5))),
    # rhs and grad are both passed; each op uses the one it multiplies by
    "gmm": Op(
        moe, _gmm_inputs,
        call=lambda method, lhs, rhs, grad, sizes: moe.gmm(lhs, rhs, sizes, method=method),
        reference=lambda lhs, rhs, grad, sizes: moe.gmm_loop(lhs, rhs, sizes),
        diff=(0, 1), split=_split_rows,
        local=lambda method, lhs, rhs, grad, sizes: moe.gmm(lhs, rhs, sizes, method=method),
    ),
    "tgmm": Op(
        moe, _gmm_inputs,
        call=lambda method, lhs, rhs, grad, sizes: moe.tgmm(lhs, grad, sizes, method=method),
        reference=lambda lhs, rhs, grad, sizes: moe.tgmm_loop(lhs, grad, sizes),
        diff=(0, 2), split=_split_rows, summed=True,
        local=lambda method, lhs, rhs, grad, sizes: moe.tgmm(lhs, grad, sizes, method=method),
    ),
}  # fmt: skip


# ------------------------------------------------------------------ POET-X layer

PN, PM, PB = 8, 12, 4  # input and output features, block size


def _poet_inputs(seed):
    rng = np.random.default_rng(seed)
    p = poet.num_block_params(PB)
    x = jnp.asarray(rng.standard_normal((DEVICES * 3, PN), np.float32))
    w = jnp.asarray(rng.standard_normal((PN, PM), np.float32) / np.sqrt(PN))
    theta_in = jnp.asarray(0.3 * rng.standard_normal((PN // PB, p), np.float32))
    theta_out = jnp.asarray(0.3 * rng.standard_normal((PM // PB, p), np.float32))
    perms = (jnp.asarray(rng.permutation(n).astype(np.int32)) for n in (PN, PM))
    return (x, w, theta_in, theta_out, *perms)


def _poet_call(memory_saving):
    def call(method, *args):
        return poet.poet_linear(*args, block_size=PB, method=method, memory_saving=memory_saving)

    return call


def _poet_reference(*args):
    return poet.poet_linear_reference(*args, block_size=PB)


def _poet_memory_reference(x, w, *rest):
    # POET-X_mem keeps the base weight frozen: no gradient reaches it
    return _poet_reference(x, jax.lax.stop_gradient(w), *rest)


_POET_SPLIT = lambda args: (args, (0,) + (None,) * 5)  # noqa: E731

OPS["poet_linear"] = Op(
    poet, _poet_inputs, _poet_call(False), _poet_reference, diff=(0, 1, 2, 3), split=_POET_SPLIT
)


class _PoetMemorySaving:
    """``poet_linear(memory_saving=True)``: every method but the dense reference."""

    METHODS = tuple(m for m in poet.METHODS if m != "reference")


OPS["poet_linear_memory_saving"] = Op(
    _PoetMemorySaving, _poet_inputs, _poet_call(True), _poet_memory_reference,
    diff=(0, 1, 2, 3), split=_POET_SPLIT,
)  # fmt: skip

class _MLSTMParallelForm:
    """``mlstm(xla_form="parallel")``: the quadratic XLA form, a form of ``"xla"`` only."""

    METHODS = ("xla",)


OPS["mlstm_parallel_form"] = Op(
    _MLSTMParallelForm, _mlstm_inputs, functools.partial(_mlstm_call, xla_form="parallel"),
    _mlstm_reference, diff=tuple(range(5)),
)  # fmt: skip

CASES = [(op, method) for op, spec in OPS.items() for method in spec.pkg.METHODS]
IDS = [f"{op}-{method}" for op, method in CASES]


def _composition_cases(slow):
    """``CASES`` for the vmap and shard_map tests; those in ``slow`` and ``"auto"`` (which runs
    one of the other methods, as the first test checks) under the ``slow`` marker."""
    return [
        pytest.param(op, method, id=f"{op}-{method}",
                     marks=[pytest.mark.slow] if method == "auto" or (op, method) in slow else [])
        for op, method in CASES
    ]  # fmt: skip


# The interpreted MDN kernels compile for seconds; gated_delta's Pallas path runs the same ones.
VMAP_CASES = _composition_cases(
    {("momentum_delta_rule", "pallas"), ("gated_delta_rule", "pallas"),
     ("poet_linear_memory_saving", "pallas")}
)
SHARD_MAP_CASES = _composition_cases(
    {("gated_delta_rule", "pallas"), ("poet_linear_memory_saving", "pallas")}
)


# ------------------------------------------------------------------ helpers


def _cotangents(outputs, seed):
    rng = np.random.default_rng(seed)
    return jax.tree.map(
        lambda o: jnp.asarray(rng.standard_normal(o.shape).astype(o.dtype)), outputs
    )


def _vjp(fn, args, diff, cot):
    """``(outputs, gradients of <outputs, cot> in args[diff])``."""

    def of_diff(*xs):
        full = list(args)
        for i, x in zip(diff, xs, strict=True):
            full[i] = x
        return fn(*full)

    out, pullback = jax.vjp(of_diff, *(args[i] for i in diff))
    return out, pullback(cot)


def _assert_close(got, want, what):
    got_leaves, want_leaves = jax.tree.leaves(got), jax.tree.leaves(want)
    assert len(got_leaves) == len(want_leaves), what
    for i, (g, w) in enumerate(zip(got_leaves, want_leaves, strict=True)):
        assert g.shape == w.shape and g.dtype == w.dtype, (what, i, g.shape, w.shape)
        err = rel_rmse(g, w)
        assert err < TOL, (what, i, err)


@functools.cache
def _problem(op: str):
    """The op's inputs, the cotangent of its outputs and the reference's ``(outputs,
    gradients)``."""
    spec = OPS[op]
    args = spec.inputs(70)
    cot = _cotangents(jax.eval_shape(spec.reference, *args), 71)
    return args, cot, jax.jit(lambda *a: _vjp(spec.reference, a, spec.diff, cot))(*args)


@functools.cache
def _compiled(op: str, method: str):
    """``args -> (outputs, gradients)`` of the op by ``method`` with :func:`_problem`'s
    cotangent, jitted once for all the tests."""
    spec = OPS[op]
    cot = _problem(op)[1]
    return jax.jit(lambda *a: _vjp(lambda *x: spec.call(method, *x), a, spec.diff, cot))


@functools.cache
def _unsharded(op: str, method: str):
    """``(outputs, gradients)`` of the op by ``method`` on :func:`_problem`'s inputs."""
    return _compiled(op, method)(*_problem(op)[0])


@pytest.fixture(scope="module")
def mesh():
    if jax.device_count() < DEVICES:
        pytest.skip(f"needs {DEVICES} devices (tests/conftest.py sets JAX_NUM_CPU_DEVICES)")
    return jax.make_mesh((DEVICES,), ("x",))


# ------------------------------------------------------------------ the shared tests


@pytest.mark.parametrize(("op", "method"), CASES, ids=IDS)
def test_forward_and_gradient_match_the_reference(op, method):
    out_ref, grads_ref = _problem(op)[2]
    out, grads = _unsharded(op, method)
    _assert_close(out, out_ref, "outputs")
    _assert_close(grads, grads_ref, "gradients")


@pytest.mark.parametrize(("op", "method"), VMAP_CASES)
def test_vmap_over_a_leading_axis_equals_the_loop(op, method):
    spec = OPS[op]
    first = _problem(op)[0]
    second = spec.inputs(72)
    stacked = jax.tree.map(lambda a, b: jnp.stack([a, b]), first, second)
    got = jax.jit(jax.vmap(lambda *a: spec.call(method, *a)))(*stacked)
    loop = [_unsharded(op, method)[0], _compiled(op, method)(*second)[0]]
    _assert_close(got, jax.tree.map(lambda a, b: jnp.stack([a, b]), *loop), "vmap")


@pytest.mark.parametrize(("op", "method"), SHARD_MAP_CASES)
def test_shard_map_over_the_batch_equals_the_unsharded_call(op, method, mesh):
    spec = OPS[op]
    args, cot, _ = _problem(op)
    want = _unsharded(op, method)

    sharded, axes = spec.split(args)
    in_specs = tuple(P() if ax is None else P(*(None,) * ax, "x") for ax in axes)
    local = spec.local or spec.call
    out_specs = P() if spec.summed else P("x")
    if not spec.local:  # the recurrent ops: state outputs split on their batch axis too
        out_specs = jax.tree.map(
            lambda o: P(None, "x") if o.ndim == 5 and o.shape[0] == 2 else P("x"), want[0]
        )

    def body(*a):
        out = local(method, *a)
        return jax.lax.psum(out, "x") if spec.summed else out

    smap = jax.shard_map(body, mesh=mesh, in_specs=in_specs, out_specs=out_specs)
    placed = [jax.device_put(a, NamedSharding(mesh, s)) for a, s in zip(sharded, in_specs,
                                                                        strict=True)]
    got = jax.jit(lambda *a: _vjp(smap, a, spec.diff, cot))(*placed)
    _assert_close(got[0], want[0], "outputs")
    _assert_close(got[1], want[1], "gradients")


# ------------------------------------------------------------------ "auto"


AUTO = {  # op package -> its Pallas entry point or None
    mdn: mdn._KERNEL,
    gated_delta: gated_delta._KERNEL,
    mlstm: None,
    moe: moe._KERNEL,
    poet: poet._KERNEL,
}


@pytest.mark.parametrize("pkg", list(AUTO), ids=lambda p: p.__name__.rsplit(".", 1)[-1])
def test_auto_is_pallas_on_gpu_and_the_xla_path_elsewhere(pkg, monkeypatch):
    """One rule for every op: ``"pallas"`` on a GPU backend when the op has Pallas kernels that
    import and take the operands, otherwise ``"xla"``, the op's XLA fast path."""
    kernel = AUTO[pkg]
    assert "xla" in pkg.METHODS
    assert ("pallas" in pkg.METHODS) == (kernel is not None)
    if kernel is not None:
        assert load_kernel(*kernel) is not None
    for backend in ("cpu", "tpu", "gpu"):
        monkeypatch.setattr(jax, "default_backend", lambda backend=backend: backend)
        want = "pallas" if backend == "gpu" and kernel is not None else "xla"
        assert resolve_auto("auto", kernel=kernel) == want, backend
        assert resolve_auto("auto", kernel=kernel, supported=False) == "xla"
        assert resolve_auto("reference", kernel=kernel) == "reference"
    missing = ("jaxlib_ext.pallas_kernels.no_such_module", "kernel")
    assert resolve_auto("auto", kernel=missing) == "xla"


@pytest.mark.parametrize("pkg", list(AUTO), ids=lambda p: p.__name__.rsplit(".", 1)[-1])
def test_every_op_offers_a_subset_of_the_one_vocabulary(pkg):
    """Each op's ``METHODS`` is the library's :data:`METHODS` in its order, less the methods
    the op lacks."""
    assert set(pkg.METHODS) <= set(METHODS)
    assert list(pkg.METHODS) == [m for m in METHODS if m in pkg.METHODS]
    assert {"auto", "reference", "xla"} <= set(pkg.METHODS)


@pytest.mark.parametrize(
    "backend, method, dtype, head_dim, expected",
    [
        ("cpu", "pallas", "float32", 128, 64),  # interpreted: no shared-memory limit
        ("gpu", "pallas", "float32", 128, 32),  # the fused backward needs C <= 32 there
        ("gpu", "pallas", "float32", 64, 64),
        ("gpu", "pallas", "bfloat16", 128, 64),
        ("gpu", "xla", "float32", 128, 64),
    ],
)
def test_default_chunk_size_follows_the_compiled_kernels_limit(
    monkeypatch, backend, method, dtype, head_dim, expected
):
    from jaxlib_ext.pallas_kernels import _common

    monkeypatch.setattr(jax, "default_backend", lambda: backend)
    assert _common.default_chunk_size(method, jnp.dtype(dtype), head_dim) == expected
