"""Pallas kernels of the momentum delta rule vs the recurrent reference (arXiv 2605.05838).

CPU: the kernels run in the Pallas interpreter (small shapes, chunk 16/32). GPU (``-m gpu``): the
same comparisons compiled through the Pallas Triton lowering.
"""

import functools
import os
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxlib_ext.pallas_kernels.mdn import (
    MDNKernelConfig,
    momentum_delta_rule,
    momentum_delta_rule_pallas,
)
from jaxlib_ext.pallas_kernels.mdn.decode import momentum_delta_rule_step_pallas
from jaxlib_ext.pallas_kernels.mdn.reference import momentum_delta_rule_recurrent
from tests.pallas_kernels._helpers import mdn_inputs as make_inputs
from tests.pallas_kernels._helpers import rel_rmse

REPO = Path(__file__).resolve().parents[2]
ON_GPU = jax.default_backend() == "gpu"


def pallas_fn(chunk, poison=True, interpret=not ON_GPU, backward="pallas", **kw):
    """The Pallas op at ``chunk`` with an ``MDNKernelConfig`` of these fields."""
    config = MDNKernelConfig(interpret=interpret, poison_outputs=poison, backward=backward, **kw)
    return functools.partial(momentum_delta_rule_pallas, chunk_size=chunk, config=config)


def reference_fn(*args, scale, initial_state, output_final_state):
    f32 = tuple(x.astype(jnp.float32) for x in args)
    return momentum_delta_rule_recurrent(
        *f32, scale=scale, initial_state=initial_state, output_final_state=output_final_state
    )


def outputs_and_grads(fn, args, s0, scale, probe):
    """``(o, final_state)`` and the gradients wrt every input (initial state included) of a
    fixed random projection of them, in one compiled program (eager dispatch would compile
    each small op of the loss and the primal op once more on its own)."""
    po, pf = probe

    @jax.jit
    def run(args, s0):
        def loss(*a):
            o, fs = fn(*a[:8], scale=scale, initial_state=a[8], output_final_state=True)
            return jnp.sum(o.astype(jnp.float32) * po) + jnp.sum(fs * pf), (o, fs)

        (_, out), grads = jax.value_and_grad(loss, argnums=tuple(range(9)), has_aux=True)(
            *args, s0
        )
        return out, grads

    return run(args, s0)


def grads_of(fn, args, s0, scale, probe):
    """Gradients wrt every input (initial state included) of a fixed random projection of
    (o, final_state)."""
    return outputs_and_grads(fn, args, s0, scale, probe)[1]


def random_probe(seed, o_shape, fs_shape):
    rng = np.random.default_rng(seed)
    return (jnp.asarray(rng.standard_normal(o_shape, dtype=np.float32)),
            jnp.asarray(rng.standard_normal(fs_shape, dtype=np.float32)))


NAMES = ("q", "k", "v", "p", "log_alpha", "log_mu", "beta", "eta", "initial_state")


def check_case(
    seed,
    B,
    T,
    H,
    K,
    V,
    chunk,
    dtype,
    tol,
    *,
    grads=True,
    interpret=not ON_GPU,
    backward="pallas",
    **kw,
):
    """The op's outputs, final state and (with ``grads``) the gradients of a random projection
    of both against the recurrence; returns ``(args, initial_state, probe, grads)`` of the op
    (``None`` without ``grads``)."""
    args, s0 = make_inputs(seed, B, T, H, K, V, dtype)
    scale = K**-0.5
    fn = pallas_fn(chunk, interpret=interpret, backward=backward, **kw)
    if grads:
        probe = random_probe(seed + 100, (B, T, H, V), (2, B, H, K, V))
        (o, fs), g = outputs_and_grads(fn, args, s0, scale, probe)
        (o_ref, fs_ref), g_ref = outputs_and_grads(reference_fn, args, s0, scale, probe)
    else:
        o, fs = fn(*args, scale=scale, initial_state=s0, output_final_state=True)
        o_ref, fs_ref = reference_fn(*args, scale=scale, initial_state=s0, output_final_state=True)
    assert o.shape == (B, T, H, V) and o.dtype == dtype
    assert fs.shape == (2, B, H, K, V) and fs.dtype == jnp.float32
    assert not bool(jnp.isnan(o.astype(jnp.float32)).any()), "unwritten output (NaN poison)"
    assert rel_rmse(o, o_ref) < tol, rel_rmse(o, o_ref)
    assert rel_rmse(fs, fs_ref) < tol, rel_rmse(fs, fs_ref)
    if not grads:
        return None
    for name, a, r in zip(NAMES, g, g_ref, strict=True):
        assert a.shape == r.shape and a.dtype == r.dtype, name
        assert not bool(jnp.isnan(a.astype(jnp.float32)).any()), name
        err = rel_rmse(a, r)
        assert err < tol, f"d{name}: rel-RMSE {err:.2e}"
    return args, s0, probe, g


def assert_variants_agree(seed, T, chunk, options_a, options_b, tol):
    """float32 gradients (B=1, H=2, K=V=16) of the Pallas op under two option sets agree to
    ``tol`` relative RMS."""
    args, s0 = make_inputs(seed, 1, T, 2, 16, 16)
    probe = random_probe(seed, (1, T, 2, 16), s0.shape)
    grads_a, grads_b = (
        grads_of(pallas_fn(chunk, **options), args, s0, 0.25, probe)
        for options in (options_a, options_b)
    )
    for name, a, b in zip(NAMES, grads_a, grads_b, strict=True):
        assert rel_rmse(b, a) < tol, name


@pytest.mark.parametrize(
    "seed,B,T,H,K,V,chunk",
    [
        (0, 2, 37, 2, 16, 32, 16),  # odd T, K != V, padding to 48
        # K, V not powers of two (zero-padded), V < K
        pytest.param(1, 1, 70, 3, 24, 20, 32, marks=pytest.mark.slow),
    ],
)
def test_forward_and_grads_float32(seed, B, T, H, K, V, chunk):
    check_case(seed, B, T, H, K, V, chunk, jnp.float32, 1e-4)


@pytest.mark.parametrize("backward", ["pallas", "pallas_split"])
def test_grads_at_chunk_64_bare_sums(backward):
    """At C >= 64 the backward's V loops sum bare products and reduce them once
    (``_contract_over_v`` without coefficients); below, per block. Both agree with the
    recurrence (the cases above run at C = 16 and 32)."""
    check_case(24, 1, 70, 1, 16, 24, 64, jnp.float32, 1e-4, backward=backward)


@pytest.mark.parametrize(
    "dtype, tol", [(jnp.float32, 1e-4), pytest.param(jnp.bfloat16, 1e-2, marks=pytest.mark.slow)]
)
def test_grads_backward_xla_path(dtype, tol):
    """backward="xla" (state kernel + XLA einsums + vjp of the jnp mirror) agrees too."""
    check_case(7, 2, 21, 2, 16, 16, 16, dtype, tol, backward="xla")


def test_grads_backward_pallas_split_path():
    """backward="pallas_split" (V-contraction kernel, HBM round trip, reverse-prep kernel)
    agrees with the recurrence, and with the fused kernel to float32 rounding."""
    args, s0, probe, split = check_case(8, 1, 37, 2, 24, 20, 16, jnp.float32, 1e-4,
                                        backward="pallas_split")  # fmt: skip
    fused = grads_of(pallas_fn(16, backward="pallas"), args, s0, 24**-0.5, probe)
    for name, a, b in zip(NAMES, fused, split, strict=True):
        assert rel_rmse(b, a) < 1e-6, name


@pytest.mark.parametrize(
    "c", [*(pytest.param(c, marks=pytest.mark.slow) for c in (16, 32)), 64, 128]
)
def test_unit_lower_inverses_match_a_float64_solve(c):
    """The three forms of (I + L)^{-1} for strictly lower L (the Neumann product
    (I - L)(I + L^2)(I + L^4)..., forward substitution, and XLA's block inversion) against a
    float64 solve, at a mild scale and at one where the inverse has entries of 10 to 70."""
    from jaxlib_ext.pallas_kernels._common import unit_lower_inverse
    from jaxlib_ext.pallas_kernels.mdn._chunk_algebra import (
        _inverse_forward_substitution,
        _inverse_neumann,
    )

    for i, size in enumerate((0.3, 3.0)):
        raw = np.random.default_rng(c + i).standard_normal((c, c)) * size / c**0.5
        lmat = jnp.asarray(np.tril(raw, -1), jnp.float32)
        ref = np.linalg.inv(np.eye(c) + np.asarray(lmat, np.float64))
        with jax.default_matmul_precision("highest"):
            neumann = _inverse_neumann(lmat, precision=jax.lax.Precision.HIGHEST)
            blocks = unit_lower_inverse(lmat)
        assert rel_rmse(neumann, ref) < 1e-5, (c, size, rel_rmse(neumann, ref))
        assert rel_rmse(_inverse_forward_substitution(lmat), ref) < 1e-5
        assert rel_rmse(blocks, ref) < 1e-5
        assert bool(jnp.all(jnp.triu(neumann, 1) == 0))


def test_neumann_inverse_path():
    """inverse="neumann" in the kernels that form T (prep and the fused backward) agrees with
    the recurrence."""
    check_case(20, 1, 37, 2, 24, 20, 16, jnp.float32, 1e-4, inverse="neumann")


@pytest.mark.slow
def test_neumann_inverse_path_bfloat16_split_backward_and_agreement():
    """inverse="neumann" with bfloat16 inputs and in the split backward agrees with the
    recurrence, and with forward substitution to float32 rounding."""
    check_case(21, 1, 45, 2, 16, 32, 32, jnp.bfloat16, 1e-2, inverse="neumann")
    check_case(22, 1, 21, 2, 16, 16, 16, jnp.float32, 1e-4, backward="pallas_split",
               inverse="neumann")  # fmt: skip
    assert_variants_agree(23, 40, 32, dict(inverse="substitution"), dict(inverse="neumann"), 1e-5)


def test_default_backward_splits_beyond_k128():
    from jaxlib_ext.pallas_kernels.mdn.config import default_backward

    assert [default_backward(kp) for kp in (16, 64, 128, 256)] == ["pallas"] * 3 + ["pallas_split"]
    assert MDNKernelConfig.default(256, 64).backward == "pallas_split"
    assert MDNKernelConfig.default(128, 256) == MDNKernelConfig(block_v=32, backward="pallas")


@pytest.mark.slow  # the dtype sweep: bfloat16 through the op runs by default in the Mosaic test
def test_forward_and_grads_bfloat16():
    check_case(2, 2, 45, 2, 16, 32, 16, jnp.bfloat16, 1e-2)


def test_no_initial_state_no_final_state():
    args, _ = make_inputs(3, 2, 29, 2, 16, 16, with_state=False)
    o, fs = pallas_fn(16)(*args, scale=0.3, initial_state=None, output_final_state=False)
    o_ref, _ = reference_fn(*args, scale=0.3, initial_state=None, output_final_state=False)
    assert fs is None
    assert rel_rmse(o, o_ref) < 1e-4


@pytest.mark.slow  # the default run asks every method in test_methods.py
def test_public_op_method_pallas_matches_recurrent():
    args, s0 = make_inputs(4, 2, 33, 2, 16, 32)
    o, fs = momentum_delta_rule(
        *args, initial_state=s0, output_final_state=True, method="pallas", chunk_size=16
    )
    o_r, fs_r = momentum_delta_rule(
        *args, initial_state=s0, output_final_state=True, method="reference"
    )
    assert rel_rmse(o, o_r) < 1e-4 and rel_rmse(fs, fs_r) < 1e-4


def test_state_continuation():
    args, s0 = make_inputs(5, 1, 46, 2, 16, 16)
    fn = pallas_fn(16)
    o, fs = fn(*args, scale=0.25, initial_state=s0, output_final_state=True)
    # split inside a chunk; halves of one length share a compiled program
    first = tuple(x[:, :23] for x in args)
    second = tuple(x[:, 23:] for x in args)
    o1, fs1 = fn(*first, scale=0.25, initial_state=s0, output_final_state=True)
    o2, fs2 = fn(*second, scale=0.25, initial_state=fs1, output_final_state=True)
    assert rel_rmse(jnp.concatenate([o1, o2], axis=1), o) < 1e-5
    assert rel_rmse(fs2, fs) < 1e-5


def test_decode_steps_match_recurrence():
    """Token-by-token decode with the step kernel equals the full recurrence (K, V padded)."""
    B, T, H, K, V = 2, 5, 2, 20, 24
    args, s0 = make_inputs(8, B, T, H, K, V)
    o_ref, fs_ref = reference_fn(*args, scale=0.3, initial_state=s0, output_final_state=True)
    state, outs = s0, []
    for t in range(T):
        o, state = momentum_delta_rule_step_pallas(
            *(x[:, t] for x in args), state, scale=0.3, interpret=not ON_GPU
        )
        outs.append(o)
    assert rel_rmse(jnp.stack(outs, axis=1), o_ref) < 1e-5
    assert rel_rmse(state, fs_ref) < 1e-5


def test_decode_step_sharded_over_batch_and_heads():
    """The step kernel under jit with the token and the state split over batch and heads on a
    2 x 2 mesh: the unsharded results, outputs sharded alike, no all-gather."""
    from jax.sharding import AxisType, NamedSharding
    from jax.sharding import PartitionSpec as P

    B, H, K, V = 4, 2, 16, 24
    args, s0 = make_inputs(9, B, 1, H, K, V)
    token = tuple(x[:, 0] for x in args)
    step = jax.jit(functools.partial(momentum_delta_rule_step_pallas, scale=0.3, interpret=True))
    o_ref, s_ref = step(*token, s0)
    mesh = jax.make_mesh((2, 2), ("data", "tensor"), axis_types=(AxisType.Auto,) * 2)
    split = lambda x, *spec: jax.device_put(x, NamedSharding(mesh, P(*spec)))  # noqa: E731
    token_s = tuple(split(x, "data", "tensor") for x in token)
    s0_s = split(s0, None, "data", "tensor")
    o, s = step(*token_s, s0_s)
    assert rel_rmse(o, o_ref) < 1e-6 and rel_rmse(s, s_ref) < 1e-6
    assert o.sharding.spec == P("data", "tensor")
    assert "all-gather" not in step.lower(*token_s, s0_s).compile().as_text()


def test_poison_detects_unwritten_elements():
    """The poisoning used above works: a kernel that writes half its block leaves NaNs."""
    from jax.experimental import pallas as pl

    from jaxlib_ext.pallas_kernels.mdn._launch import launch

    def half(x_ref, o_ref):
        o_ref[:8, :] = x_ref[:8, :]

    spec = pl.BlockSpec((16, 16), lambda i: (0, 0))
    shape = jax.ShapeDtypeStruct((16, 16), jnp.float32)
    (out,) = launch(
        half,
        (jnp.ones((16, 16)),),
        [spec],
        [spec],
        [shape],
        grid=(1,),
        name="mdn_out",
        kp=16,
        config=MDNKernelConfig(interpret=True, poison_outputs=True),
    )
    assert int(jnp.isnan(out).sum()) == 8 * 16


def test_bad_arguments():
    args, s0 = make_inputs(6, 1, 8, 1, 16, 16)
    op = functools.partial(
        momentum_delta_rule_pallas, scale=0.25, config=MDNKernelConfig(interpret=True)
    )
    with pytest.raises(ValueError, match="chunk_size"):
        op(*args, chunk_size=24)
    with pytest.raises(ValueError, match="beta"):
        op(*args[:6], args[6][:, :4], *args[7:])
    with pytest.raises(ValueError, match="initial_state"):
        op(*args, initial_state=s0[:, :, :, :8])
    with pytest.raises(ValueError, match="block_v: expected a power of two dividing 16"):
        op(*args, config=MDNKernelConfig(interpret=True, block_v=32))


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        (dict(backward="torch"), "backward"),
        (dict(inverse="cholesky"), "inverse"),
        (dict(state_kernel="cuda"), "state_kernel"),
        (dict(block_v=24), "block_v"),
        (dict(launch=(("mdn_x", 4, 1),)), "launch"),
        (dict(launch=(("mdn_out", 0, 1),)), "launch"),
        (dict(launch={"mdn_state_fwd_mosaic": (8, 1)}), "launch"),
        (dict(interpret=1), "interpret"),
    ],
)
def test_config_validates_on_construction(fields, field):
    with pytest.raises(ValueError, match=f"^{field}: "):
        MDNKernelConfig(**fields)


def test_config_launch_as_mapping_and_defaults_per_shape():
    config = MDNKernelConfig(launch={"mdn_out": (8, 2)})
    assert config.launch == (("mdn_out", 8, 2),) and hash(config) == hash(config)
    assert MDNKernelConfig.default(64, 20).block_v == 32  # capped at the padded V
    assert MDNKernelConfig.default(100, 256, inverse="neumann").inverse == "neumann"


def test_chunk_size_is_honoured_or_refused():
    """Compiled with float32 inputs and padded K > 64, chunk 64 does not fit: a ValueError
    naming chunk_size (never a silently smaller chunk); chunk 32 and interpret mode are fine."""
    sds = jax.ShapeDtypeStruct
    args = [sds((1, 64, 1, 128), jnp.float32)] * 2 + [sds((1, 64, 1, 64), jnp.float32)]
    args += [sds((1, 64, 1, 128), jnp.float32)] + [sds((1, 64, 1), jnp.float32)] * 4
    compiled = MDNKernelConfig(interpret=False)
    with pytest.raises(ValueError, match="chunk_size: 64 .* use chunk_size 16 or 32"):
        jax.eval_shape(functools.partial(momentum_delta_rule_pallas, scale=0.1, config=compiled),
                       *args)  # fmt: skip
    for chunk, config in ((32, compiled), (64, MDNKernelConfig(interpret=True))):
        out = jax.eval_shape(
            functools.partial(momentum_delta_rule_pallas, scale=0.1, chunk_size=chunk,
                              config=config), *args,
        )  # fmt: skip
        assert out[0].shape == (1, 64, 1, 64)


@functools.cache
def _unsharded_run():
    """Inputs, the jitted value-and-gradients (with and without an initial state) and their
    results on one device: shared by both mesh axis types below."""
    B, T, H, K, V, C = 4, 40, 2, 16, 16, 16
    args, s0 = make_inputs(50, B, T, H, K, V)
    op = pallas_fn(C, poison=False)

    def loss(args, s0):
        o, fs = op(*args, scale=0.25, initial_state=s0, output_final_state=True)
        return jnp.sum(o * o) + jnp.sum(fs * fs), (o, fs)

    step = jax.jit(jax.value_and_grad(loss, argnums=(0, 1), has_aux=True))
    grad0 = jax.jit(jax.grad(lambda a: jnp.sum(op(*a, scale=0.25)[0] ** 2)))
    return args, s0, step, grad0, step(args, s0), grad0(args)


@pytest.mark.parametrize("axis_type", ["Auto", "Explicit"])
def test_sharded_over_batch_and_heads_without_collectives(axis_type):
    """Under jit with inputs split over batch (data) and heads (tensor) on four devices, the
    op's sharding rule runs the kernels on each device's rows and heads: same outputs and
    gradients as one device, outputs sharded like the inputs, no all-gather. Auto mesh axes
    (custom_partitioning) and Explicit ones (shard_map from the types)."""
    from jax.sharding import AxisType, NamedSharding
    from jax.sharding import PartitionSpec as P

    args, s0, step, grad0, ((ref, (o_ref, fs_ref)), g_ref), g0_ref = _unsharded_run()
    types = (getattr(AxisType, axis_type),) * 2
    mesh = jax.make_mesh((2, 2), ("data", "tensor"), axis_types=types)
    split = lambda x, spec: jax.device_put(x, NamedSharding(mesh, spec))
    with jax.set_mesh(mesh):
        args_s = tuple(split(x, P("data", None, "tensor")) for x in args)
        s0_s = split(s0, P(None, "data", "tensor"))
        compiled = step.lower(args_s, s0_s).compile()  # what jit runs: checked and called
        hlo = compiled.as_text()
        (val, (o, fs)), g = compiled(args_s, s0_s)
        # no initial state: the op's zero state is replicated, its cotangent is not
        g0 = grad0(args_s)
    assert tuple(o.sharding.spec)[:3] == ("data", None, "tensor")
    local = lambda x: np.asarray(x, np.float32)  # noqa: E731 (explicit arrays: no jnp math)
    assert rel_rmse(local(o), o_ref) < 1e-6 and rel_rmse(local(fs), fs_ref) < 1e-6
    for a, b in zip(jax.tree.leaves(g), jax.tree.leaves(g_ref), strict=True):
        assert rel_rmse(local(a), b) < 1e-6
    assert abs(float(val) - float(ref)) <= 1e-5 * abs(float(ref))
    assert "all-gather" not in hlo
    assert rel_rmse(local(g0[2]), g0_ref[2]) < 1e-6


def test_vmap_folds_into_the_batch():
    """vmap over a leading axis (the kernels see one batch of 2 x B rows, so the Triton grid
    keeps three axes): forward and gradients equal those of each slice on its own."""
    B, T, H, K, V, C = 1, 20, 2, 16, 16, 16
    xs = [make_inputs(60 + i, B, T, H, K, V) for i in range(2)]
    args = tuple(jnp.stack(a) for a in zip(*(x[0] for x in xs), strict=True))
    s0 = jnp.stack([x[1] for x in xs])
    op = pallas_fn(C, poison=False)

    def loss(args, s0):
        o, fs = op(*args, scale=0.25, initial_state=s0, output_final_state=True)
        return jnp.sum(o * o) + jnp.sum(fs * fs)

    grad = jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))
    val, g = jax.jit(jax.vmap(jax.value_and_grad(loss, argnums=(0, 1))))(args, s0)
    for i in range(2):
        val_i, g_i = grad(tuple(a[i] for a in args), s0[i])
        assert abs(float(val[i]) - float(val_i)) <= 1e-5 * abs(float(val_i))
        for a, b in zip(jax.tree.leaves(g), jax.tree.leaves(g_i), strict=True):
            assert rel_rmse(a[i], b) < 1e-5


def test_launch_overrides_change_only_the_schedule():
    """Overriding warps/stages (what the GPU tuner does) leaves the interpret-mode result
    bitwise unchanged, and the overrides reach the Triton compiler params of that kernel."""
    from jaxlib_ext.pallas_kernels.mdn.config import launch_params

    args, s0 = make_inputs(6, 1, 20, 1, 16, 16)
    launch = (("mdn_state_fwd", 8, 2), ("mdn_chunk_bwd", 4, 1))
    o1, _ = pallas_fn(16, poison=False, interpret=True)(*args, scale=0.25)
    o2, _ = pallas_fn(16, poison=False, interpret=True, launch=launch)(*args, scale=0.25)
    assert bool(jnp.all(o1 == o2))
    assert launch_params("mdn_state_fwd", 128, launch) == (8, 2)
    assert launch_params("mdn_state_bwd", 128, launch) == launch_params("mdn_state_bwd", 128)
    assert launch_params("mdn_state_bwd", 256) == (8, 1)


@pytest.mark.slow
def test_gpu_check_cpu_half_runs():
    """The CPU half of benchmarks/gpu_check.sh (interpret mode, tiny shapes) runs cleanly."""
    env = dict(os.environ, PYTHON=sys.executable, JAX_PLATFORMS="cpu")
    res = subprocess.run(
        ["bash", str(REPO / "benchmarks" / "gpu_check.sh"), "--cpu"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert "| pallas | fwd+bwd |" in res.stdout
    assert "| pallas bwd=xla | fwd+bwd |" in res.stdout  # the bf16 run: GPU-only rows
    assert res.stdout.count("state_kernel=mosaic_gpu") == 2  # both Mosaic candidates checked


# ------------------------------------------------------------------------------------------
# GPU: compiled kernels (interpret=False) through the Pallas Triton lowering.
# ------------------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize(
    "seed,B,T,H,K,V,chunk",
    [
        (10, 2, 37, 2, 16, 32, 16),
        (11, 2, 301, 3, 64, 128, 64),
        (12, 1, 200, 2, 100, 256, 32),
    ],
)
def test_gpu_compiled_float32(seed, B, T, H, K, V, chunk):
    with jax.default_matmul_precision("highest"):
        check_case(seed, B, T, H, K, V, chunk, jnp.float32, 1e-4, interpret=False)


@pytest.mark.gpu
def test_gpu_compiled_bfloat16():
    check_case(13, 2, 257, 2, 128, 256, 64, jnp.bfloat16, 1e-2, interpret=False)


@pytest.mark.gpu
def test_gpu_compiled_bfloat16_k256_split_backward():
    """Padded K = 256: the default backward is the split one (config.default_backward)."""
    check_case(16, 1, 130, 2, 256, 64, 64, jnp.bfloat16, 1e-2, interpret=False, backward=None)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype,tol", [(jnp.bfloat16, 1e-2), (jnp.float32, 1e-4)])
def test_gpu_compiled_neumann_inverse(dtype, tol):
    """inverse="neumann" compiled: 3xTF32 dots for the powers of L on both paths (float32 at
    K = 128 takes chunk 32)."""
    chunk = 32 if dtype == jnp.float32 else 64
    with jax.default_matmul_precision("highest"):
        check_case(17, 2, 257, 2, 128, 256, chunk, dtype, tol, interpret=False, inverse="neumann")


@pytest.mark.gpu
def test_gpu_decode_step():
    B, H, K, V = 4, 6, 128, 256
    args, s0 = make_inputs(15, B, 3, H, K, V)
    with jax.default_matmul_precision("highest"):
        o_ref, fs_ref = reference_fn(*args, scale=0.1, initial_state=s0, output_final_state=True)
    state, outs = s0, []
    for t in range(3):
        o, state = momentum_delta_rule_step_pallas(*(x[:, t] for x in args), state, scale=0.1)
        outs.append(o)
    assert rel_rmse(jnp.stack(outs, axis=1), o_ref) < 1e-5
    assert rel_rmse(state, fs_ref) < 1e-5


@pytest.mark.gpu
def test_gpu_layer_shape_forward_vs_recurrent():
    """The 400M layer shape at T = 1024, float32 (chunk 32 at K = 128), forward only."""
    with jax.default_matmul_precision("highest"):
        check_case(14, 1, 1024, 6, 128, 256, 32, jnp.float32, 1e-4, grads=False, interpret=False)


@pytest.mark.parametrize("dtype,K,V", [(jnp.bfloat16, 128, 256), (jnp.float32, 40, 24)])
def test_lowers_through_triton_for_h200(dtype, K, V, lower_for_h200):
    """On CPU: trace and lower forward and forward+backward for CUDA with an abstract H200, which
    runs the Pallas Triton lowering of every kernel (the Triton compile itself needs a GPU)."""
    B, T, H = 1, 70, 2
    sds = lambda s, d=dtype: jax.ShapeDtypeStruct(s, d)
    args = [sds((B, T, H, K)), sds((B, T, H, K)), sds((B, T, H, V)), sds((B, T, H, K))]
    args += [sds((B, T, H), jnp.float32)] * 4 + [sds((2, B, H, K, V), jnp.float32)]

    def fwd(*a):
        return momentum_delta_rule_pallas(
            *a[:8], scale=K**-0.5, initial_state=a[8], output_final_state=True, chunk_size=64,
            config=MDNKernelConfig(),
        )  # fmt: skip

    def loss(*a):
        o, fs = fwd(*a)
        return jnp.sum(o.astype(jnp.float32)) + jnp.sum(fs)

    for f in (fwd, jax.grad(loss, argnums=tuple(range(9)))):
        assert "triton" in lower_for_h200(f, args)
    step = functools.partial(momentum_delta_rule_step_pallas, scale=0.1)
    one = [sds((B, H, K)), sds((B, H, K)), sds((B, H, V)), sds((B, H, K))]
    one += [sds((B, H), jnp.float32)] * 4 + [sds((2, B, H, K, V), jnp.float32)]
    assert "triton" in lower_for_h200(step, one)


# ------------------------------------------------------------------------------------------
# The Mosaic GPU forward state kernel (state_kernel="mosaic_gpu"): GPU interpret mode on CPU
# (race detector on, unwritten outputs NaN), lowering for an H200, compiled on a GPU.
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("stages", [2, 1])
def test_mosaic_state_kernel_matches_triton_state_kernel(stages):
    """Same preparation, both state kernels: Vt and the per-chunk states (bfloat16) agree to
    one bf16 rounding, the final states to float32 rounding. Four chunks (every buffer slot
    is reused), K = 128 (the benchmark's), two V-blocks, nonzero S0, M0; with the two-slot
    pipeline and with single buffers (the race detector checks the waits of both)."""
    from jaxlib_ext.pallas_kernels.mdn._chunk_algebra import _inverse_forward_substitution
    from jaxlib_ext.pallas_kernels.mdn.mosaic import state_fwd_mosaic
    from jaxlib_ext.pallas_kernels.mdn.prep import prep_call
    from jaxlib_ext.pallas_kernels.mdn.state import state_fwd_call

    B, T, H, K, V, C, BV = 1, 256, 2, 128, 64, 64, 32
    args, s0 = make_inputs(40, B, T, H, K, V, jnp.bfloat16)
    prec = jax.lax.Precision.DEFAULT
    config = MDNKernelConfig(interpret=True, poison_outputs=True)
    inverse = _inverse_forward_substitution
    prep = prep_call(*args, chunk=C, scale=K**-0.5, precision=prec, inverse=inverse, config=config)
    tri = state_fwd_call(prep, s0[0], s0[1], chunk=C, block_v=BV, precision=prec, config=config)
    mos = state_fwd_mosaic(prep, s0[0], s0[1], chunk=C, block_v=BV, stages=stages,
                           interpret=True)  # fmt: skip
    for name, a, b in zip(("vt", "hs", "hm", "st", "mt"), mos, tri, strict=True):
        assert a.shape == b.shape and a.dtype == b.dtype, name
        assert not bool(jnp.isnan(a.astype(jnp.float32)).any()), f"{name}: unwritten (NaN)"
        assert rel_rmse(a, b) < (1e-5 if a.dtype == jnp.float32 else 4e-3), name


def test_mosaic_state_kernel_op_forward_and_grads():
    """The op with the Mosaic forward state kernel (Triton backward) against the recurrence:
    bfloat16, odd T (padding), K != V (both padded), batch 2, nonzero initial state."""
    check_case(30, 2, 130, 1, 64, 40, 64, jnp.bfloat16, 1e-2, state_kernel="mosaic_gpu",
               block_v=32)  # fmt: skip


def test_mosaic_state_kernel_bad_arguments():
    args, s0 = make_inputs(31, 1, 64, 1, 64, 64, jnp.bfloat16)

    def op(*a, chunk_size=64, **fields):
        config = MDNKernelConfig(interpret=True, state_kernel="mosaic_gpu", **fields)
        return momentum_delta_rule_pallas(*a, scale=0.125, chunk_size=chunk_size, config=config)

    with pytest.raises(ValueError, match="state_kernel='mosaic_gpu': needs bfloat16"):
        op(*(x.astype(jnp.float32) for x in args[:4]), *args[4:])
    with pytest.raises(ValueError, match="chunk_size"):
        op(*args, chunk_size=32)
    small_k, _ = make_inputs(31, 1, 64, 1, 16, 64, jnp.bfloat16)
    with pytest.raises(ValueError, match="k: "):
        op(*small_k)
    big_k, _ = make_inputs(31, 1, 64, 1, 128, 128, jnp.bfloat16)
    with pytest.raises(ValueError, match="block_v: .*227 KiB"):
        op(*big_k, block_v=64)
    with pytest.raises(ValueError, match="launch: "):
        op(*args, block_v=32, launch=(("mdn_state_fwd_mosaic", 4, 3),))
    # one stage halves the shared memory: block_v 64 fits at K = 128 (about 120 KiB)
    from jaxlib_ext.pallas_kernels.mdn.pallas import _check_mosaic_state_kernel

    one_stage = MDNKernelConfig(block_v=64, launch=(("mdn_state_fwd_mosaic", 4, 1),))
    _check_mosaic_state_kernel(jnp.bfloat16, 64, 128, 64, one_stage)


def test_mosaic_state_kernel_lowers_for_h200(lower_for_h200):
    """On CPU: forward and forward+backward with the Mosaic state kernel lower for CUDA with
    an abstract H200, which runs Mosaic GPU's own lowering (layout inference, the wgmma
    operand checks, its shared-memory limit) down to the mosaic_gpu custom call."""
    B, T, H, K, V = 1, 200, 2, 128, 256
    sds = jax.ShapeDtypeStruct
    args = [sds((B, T, H, K), jnp.bfloat16)] * 2 + [sds((B, T, H, V), jnp.bfloat16)]
    args += [sds((B, T, H, K), jnp.bfloat16)] + [sds((B, T, H), jnp.float32)] * 4
    one_stage = (("mdn_state_fwd_mosaic", 4, 1),)
    for launch in ((), one_stage):
        config = MDNKernelConfig(state_kernel="mosaic_gpu", block_v=32, launch=launch)
        fwd = lambda *a, config=config: momentum_delta_rule_pallas(  # noqa: E731
            *a, scale=K**-0.5, config=config
        )[0]
        loss = lambda *a, fwd=fwd: jnp.sum(fwd(*a).astype(jnp.float32))  # noqa: E731
        fns = (fwd, jax.grad(loss, argnums=tuple(range(8)))) if not launch else (fwd,)
        for f in fns:
            assert "mosaic_gpu" in lower_for_h200(f, args)


@pytest.mark.gpu
def test_gpu_compiled_mosaic_state_kernel():
    check_case(18, 2, 257, 2, 128, 256, 64, jnp.bfloat16, 1e-2, interpret=False,
               state_kernel="mosaic_gpu", block_v=32)  # fmt: skip
