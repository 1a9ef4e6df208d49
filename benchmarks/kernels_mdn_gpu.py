"""Time the momentum delta rule kernels: Pallas (ours) vs our XLA chunk path vs fla's GDN.

Prints markdown tables: median time after warm-up of the forward and the forward+backward of

* ``pallas``: ``jaxlib_ext.pallas_kernels.mdn.momentum_delta_rule_pallas`` with its
  default tiling and launch parameters (compiled through the Pallas Triton lowering on GPU,
  ``interpret=True`` on CPU), and ``pallas bwd=xla`` (forward+backward only, on GPU): the
  kernels' state recurrence with the backward's chunk algebra in XLA;
* ``xla (chunk)``: ``momentum_delta_rule(..., method="xla")``, the XLA chunkwise path;
* ``fla gdn``: ``fla.ops.gated_delta_rule.chunk_gated_delta_rule`` (PyTorch + Triton, package
  ``fla-core``), the Gated DeltaNet kernel of flash-linear-attention, timed with
  ``triton.testing.do_bench``; skipped with a note when torch or fla cannot be imported or no
  CUDA device is present;

then one decoding step: the Pallas step kernel against the op's ``"reference"`` recurrence (XLA)
on one token.

The ratio column is against ``xla (chunk)`` (same direction). TFLOP/s uses the matmul FLOPs of the
chunkwise algorithm (``flops_forward``; forward+backward counted as 3x forward, the usual
convention), GB/s the compulsory HBM traffic (inputs read once, output written once; 3x for
forward+backward). Ceilings printed beside them: H200 ~790 TFLOP/s bf16 dense, ~4.8 TB/s HBM.

Usage::

    python -m benchmarks.kernels_mdn_gpu          # GPU, B=8 T=4096 H=6 K=128 V=256 bf16
    python -m benchmarks.kernels_mdn_gpu --cpu    # CPU, interpret mode, tiny shapes

Run from the repository root, as a module: the inputs and the timing loop are
``tools.kernel_audit``'s.

Correctness against the recurrence and the timing of other tilings and launch parameters are
the kernel authors' tools: ``python -m tools.kernel_audit.tuning --check``.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys

# JAX must leave room on the GPU for PyTorch (the fla peer runs in the same process).
os.environ.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.6")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from jaxlib_ext.core.timing import time_call  # noqa: E402
from jaxlib_ext.pallas_kernels.mdn import (  # noqa: E402
    MDNKernelConfig,
    momentum_delta_rule,
    momentum_delta_rule_pallas,
)
from jaxlib_ext.pallas_kernels.mdn.decode import momentum_delta_rule_step_pallas  # noqa: E402
from tools.kernel_audit.inputs import random_inputs  # noqa: E402
from tools.kernel_audit.tuning import forward_backward  # noqa: E402

PEAK_TFLOPS = 790.0  # H200 bf16 dense
PEAK_GBS = 4800.0  # H200 HBM3e
XLA_CHUNK = "xla (chunk)"  # the table label of momentum_delta_rule(method="xla")


def jax_fns(op):
    """(forward, forward+backward) jitted closures of an op with the public signature."""

    def fwd(*a):
        return op(*a)[0]

    return jax.jit(fwd), forward_backward(op)


def fla_times(B, T, H, K, V, warmup, iters):
    """(fwd, fwd+bwd) seconds of fla's chunk_gated_delta_rule, or a string saying why not
    (not importable, no CUDA device, or the call failed)."""
    try:
        import torch
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule
        from triton.testing import do_bench
    except Exception as e:  # noqa: BLE001 - any import failure means "skip the peer"
        return f"skipped ({type(e).__name__}: {e})"
    if not torch.cuda.is_available():
        return "skipped (no CUDA device for torch)"
    dev, dt = "cuda", torch.bfloat16
    torch.manual_seed(0)
    mk = lambda *s: torch.randn(*s, device=dev, dtype=dt)
    q = torch.nn.functional.normalize(mk(B, T, H, K), dim=-1).requires_grad_()
    k = torch.nn.functional.normalize(mk(B, T, H, K), dim=-1).requires_grad_()
    v = mk(B, T, H, V).requires_grad_()
    g = torch.nn.functional.logsigmoid(mk(B, T, H).float()).div(8).requires_grad_()
    beta = torch.sigmoid(mk(B, T, H).float()).mul(0.5).to(dt).requires_grad_()

    def fwd():
        return chunk_gated_delta_rule(q, k, v, g, beta, scale=K**-0.5)[0]

    def fwd_bwd():
        o = fwd()
        o.sum().backward()

    try:
        with torch.no_grad():
            t_f = do_bench(fwd, warmup=warmup * 10, rep=iters * 10, return_mode="median")
        t_fb = do_bench(fwd_bwd, warmup=warmup * 10, rep=iters * 10, return_mode="median")
    except Exception as e:  # noqa: BLE001 - e.g. an fla/triton version mismatch on the machine
        return f"failed ({type(e).__name__}: {str(e)[:1000]})"
    return t_f / 1e3, t_fb / 1e3


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cpu", action="store_true", help="tiny shapes, interpret mode")
    ap.add_argument("--B", type=int, default=8)
    ap.add_argument("--T", type=int, default=4096)
    ap.add_argument("--H", type=int, default=6)
    ap.add_argument("--K", type=int, default=128)
    ap.add_argument("--V", type=int, default=256)
    ap.add_argument("--chunk", type=int, default=64)
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--skip-chunk", action="store_true", help="do not time the XLA chunk path")
    ap.add_argument("--skip-fla", action="store_true", help="do not time fla's GDN")
    args = ap.parse_args(argv)
    if args.cpu:
        args.B, args.T, args.H, args.K, args.V, args.chunk = 1, 24, 2, 16, 32, 16
        args.warmup, args.iters = 1, 1
    interpret = jax.default_backend() == "cpu"
    B, T, H, K, V = args.B, args.T, args.H, args.K, args.V
    dtype = jnp.dtype(args.dtype)
    inputs = random_inputs(B, T, H, K, V, dtype)

    pallas = functools.partial(
        momentum_delta_rule_pallas, scale=K**-0.5, chunk_size=args.chunk,
        config=MDNKernelConfig(interpret=interpret),
    )  # fmt: skip
    chunk = functools.partial(
        momentum_delta_rule, scale=K**-0.5, method="xla", chunk_size=args.chunk
    )
    failed = []

    def fail(what, label, e):  # on GPU a failure is reported and the run goes on; exit 1 at end
        failed.append(f"{label}: {type(e).__name__}: {str(e)[:2000]}")
        print(f"{what} FAILED: {failed[-1]}", flush=True)

    rows = []
    ops = [("pallas", pallas, True)]
    if not args.cpu:  # the backward="xla" variant: kernel state recurrence + XLA chunk math
        bwd_xla = MDNKernelConfig(interpret=interpret, backward="xla")
        ops.append(("pallas bwd=xla", functools.partial(pallas, config=bwd_xla), False))
    if not args.skip_chunk:
        ops.append((XLA_CHUNK, chunk, True))
    for name, op, with_fwd in ops:
        f, fb = jax_fns(op)
        for direction, fn in ([("fwd", f)] if with_fwd else []) + [("fwd+bwd", fb)]:
            try:
                t = time_call(fn, *inputs, warmup=args.warmup, repeats=args.iters).median
                rows.append((name, direction, t))
            except Exception as e:  # noqa: BLE001 - report and keep timing the other paths
                if args.cpu:
                    raise
                fail("TIMING", f"{name} {direction}", e)
        print(f"timed {name}", flush=True)
    print_table(rows, args, dtype)
    decode_table(inputs, K, interpret, args.warmup, args.iters)
    if interpret:
        peer = "skipped (CPU)"
    elif args.skip_fla:
        peer = "skipped (--skip-fla)"
    else:
        peer = fla_times(B, T, H, K, V, args.warmup, args.iters)
    if isinstance(peer, tuple):
        rows.append(("fla gdn", "fwd", peer[0]))
        rows.append(("fla gdn", "fwd+bwd", peer[1]))
        print_table(rows, args, dtype)
    pf = {d: t for n, d, t in rows if n == "pallas"}
    if not isinstance(peer, tuple):
        print(f"\nfla gdn: {peer}")
    elif "fwd" in pf and "fwd+bwd" in pf:
        print(
            f"\npallas / fla gdn time: fwd {pf['fwd'] / peer[0]:.2f}x, "
            f"fwd+bwd {pf['fwd+bwd'] / peer[1]:.2f}x (target <= 1.3x)"
        )
    base = {d: t for n, d, t in rows if n == XLA_CHUNK}
    if "fwd+bwd" in base and "fwd+bwd" in pf:
        print(f"{XLA_CHUNK} / pallas fwd+bwd: {base['fwd+bwd'] / pf['fwd+bwd']:.2f}x "
              "(target >= 3x)")
    for msg in failed:
        print(f"FAILED {msg}")
    return 1 if failed else 0


def flops_forward(b, t, h, kdim, vdim, chunk=64):
    """Matmul FLOPs of one forward pass of the chunkwise algorithm."""
    n = -(-t // chunk)
    c = chunk
    per_chunk = (
        2 * c * c * c * 2  # gamma and gamma_prev
        + 2 * c * c * kdim * 2  # P Kt^T, sQ Kt^T
        + 2 * c * c * vdim  # T V
        + 2 * c * c * kdim * 2  # T (A P), T (b P)
        + 2 * c * kdim * vdim * 4  # Y S, Z M, Kgs^T Vt, Kgm^T Vt
        + 2 * c * kdim * vdim * 2  # Qa S, Qb M
        + 2 * c * c * vdim  # Attn Vt
    )
    return b * h * n * per_chunk


def decode_table(inputs, K, interpret, warmup, iters):
    """One decoding step (token t = 0 against a random cached state): Pallas step kernel vs
    the op's ``"reference"`` recurrence on a length-1 sequence. GB/s counts reading and writing
    (S, M)."""
    B, _, H, _ = inputs[0].shape
    V = inputs[2].shape[-1]
    state = 0.1 * jax.random.normal(jax.random.key(3), (2, B, H, K, V))
    one = tuple(x[:, 0] for x in inputs)
    step = jax.jit(
        functools.partial(momentum_delta_rule_step_pallas, scale=K**-0.5, interpret=interpret)
    )

    def reference_step(*a):
        o, st = momentum_delta_rule(
            *(x[:, None] for x in a[:8]),
            scale=K**-0.5,
            initial_state=a[8],
            output_final_state=True,
            method="reference",
        )
        return o[:, 0], st

    rows = []
    for name, fn in (("pallas step", step), ("reference step", jax.jit(reference_step))):
        try:
            rows.append((name, time_call(fn, *one, state, warmup=warmup, repeats=iters).median))
        except Exception as e:  # noqa: BLE001
            print(f"{name} FAILED: {type(e).__name__}: {str(e)[:2000]}")
    nbytes = 2 * 2 * B * H * K * V * 4
    print(f"\nDecode step B={B} H={H} K={K} V={V}\n")
    print(f"| path | median us | vs reference step | GB/s (of ~{PEAK_GBS:.0f}) |")
    print("|---|---|---|---|")
    base = dict(rows).get("reference step")
    for name, t in rows:
        ratio = f"{base / t:.2f}x" if base else "-"
        print(f"| {name} | {t * 1e6:.1f} | {ratio} | {nbytes / t / 1e9:.0f} |")
    sys.stdout.flush()


def print_table(rows, args, dtype):
    B, T, H, K, V = args.B, args.T, args.H, args.K, args.V
    interpret = jax.default_backend() == "cpu"
    flops_f = flops_forward(B, T, H, K, V, args.chunk)
    itemsize = dtype.itemsize
    bytes_f = B * T * H * (3 * K + 2 * V) * itemsize + B * T * H * 4 * 4
    base = {d: t for n, d, t in rows if n == XLA_CHUNK}
    print(
        f"\nMDN B={B} T={T} H={H} K={K} V={V} {args.dtype} chunk={args.chunk} "
        f"backend={jax.default_backend()} jax={jax.__version__} interpret={interpret}\n"
    )
    print(
        f"| path | pass | median ms | vs {XLA_CHUNK} | TFLOP/s (of ~{PEAK_TFLOPS:.0f}) "
        f"| GB/s (of ~{PEAK_GBS:.0f}) |"
    )
    print("|---|---|---|---|---|---|")
    for name, direction, t in rows:
        mult = 1 if direction == "fwd" else 3
        ratio = f"{base[direction] / t:.2f}x" if direction in base else "-"
        tf = mult * flops_f / t / 1e12
        gbs = mult * bytes_f / t / 1e9
        print(f"| {name} | {direction} | {t * 1e3:.3f} | {ratio} | {tf:.1f} | {gbs:.0f} |")
    sys.stdout.flush()


if __name__ == "__main__":
    sys.exit(main())
