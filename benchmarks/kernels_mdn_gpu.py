"""Time the momentum delta rule kernels: Pallas (ours) vs our XLA chunk path vs fla's GDN.

Prints one markdown table: median time after warm-up of the forward and the forward+backward
of

* ``pallas``: ``jaxlib_ext.pallas_kernels.mdn.kernel.momentum_delta_rule_pallas`` (compiled
  through the Pallas Triton lowering on GPU, ``interpret=True`` on CPU);
* ``chunk``: ``momentum_delta_rule(..., method="chunk")``, the XLA chunkwise path;
* ``fla gdn``: ``fla.ops.gated_delta_rule.chunk_gated_delta_rule`` (PyTorch + Triton, package
  ``fla-core``), the peer named by issue 4, timed with ``triton.testing.do_bench``; skipped with
  a note when torch or fla cannot be imported or no CUDA device is present.

The ratio column is against ``chunk`` (same direction). TFLOP/s uses the matmul FLOPs of the
chunkwise algorithm (``kernel.flops_forward``; forward+backward counted as 3x forward, the usual
convention), GB/s the compulsory HBM traffic (inputs read once, output written once; 3x for
forward+backward). Ceilings printed beside them: H200 ~790 TFLOP/s bf16 dense, ~4.8 TB/s HBM.

Usage::

    python benchmarks/mdn_gpu.py                  # GPU, B=8 T=4096 H=6 K=128 V=256 bf16
    python benchmarks/mdn_gpu.py --cpu            # CPU, interpret mode, tiny shapes
    python benchmarks/mdn_gpu.py --tune           # GPU: first time a few tilings/launch
                                                  # configs (TUNE_CANDIDATES), keep the best

The defaults of the kernels' tiling and launch parameters come from an offline compile for
sm_90a (``benchmarks/xla_aot.py``: shared memory, registers, spills), not from GPU
timings; ``--tune`` is the measurement that confirms or replaces them. Two candidates swap
the Triton forward state kernel for the Mosaic GPU one (``MOSAIC_CANDIDATES``: two pipeline
slots, or one for two blocks per SM); with ``--check`` each is first checked against the
recurrence (forward and gradients) and dropped if it fails.
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import sys
import time

# JAX must leave room on the GPU for PyTorch (the fla peer runs in the same process).
os.environ.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.6")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from jaxlib_ext.pallas_kernels.mdn import momentum_delta_rule  # noqa: E402
from jaxlib_ext.pallas_kernels.mdn.decode import momentum_delta_rule_step_pallas  # noqa: E402
from jaxlib_ext.pallas_kernels.mdn.kernel import (  # noqa: E402
    flops_forward,
    momentum_delta_rule_pallas,
)

# (label, keyword overrides of momentum_delta_rule_pallas), most informative first (the budget
# may cut the tail): the state recurrences are latency-bound, so the candidates trade V-tile
# size (programs in flight) against warps and software pipelining; the backward's
# chunk-parallel half runs fused (one kernel, 4.1 KB of spills per thread) or split in two
# (0.6 KB + 4.6 KB, plus ~1 GB of HBM round trip at this shape). XLA compiles all of them for
# an H200 (benchmarks/xla_aot.py --candidates; figures: jaxlib 0.11.2, see BENCHMARKS.md).
_STATE_8W = (("mdn_state_fwd", 8, 1), ("mdn_state_bwd", 8, 1))
_MOSAIC = {"state_kernel": "mosaic_gpu", "block_v": 32}
MOSAIC_CANDIDATES = (
    # TMA-pipelined chunk tiles, wgmma; 167 registers, ~185 KiB of shared memory: one block
    # per SM against two for Triton's
    ("mosaic state_fwd", _MOSAIC),
    # single buffers: ~95 KiB, two blocks per SM, no prefetch
    ("mosaic state_fwd 1 stage", _MOSAIC | {"launch": (("mdn_state_fwd_mosaic", 4, 1),)}),
)
TUNE_CANDIDATES = (
    ("default", {}),
    # T = (I + L)^{-1} by 10 chained 64 x 64 3xTF32 matmuls instead of 63 dependent row
    # updates (each two cross-thread reductions); runs in mdn_prep and both backward kernels
    ("neumann inverse", {"inverse": "neumann"}),
    # the forward state recurrence in Pallas Mosaic GPU
    *MOSAIC_CANDIDATES,
    ("split backward", {"backward": "pallas_split"}),
    ("state 8 warps", {"launch": _STATE_8W}),
    ("block_v=16", {"block_v": 16}),
    ("state_fwd 8w/2 stages", {"launch": (("mdn_state_fwd", 8, 2), ("mdn_state_bwd", 8, 1))}),
    ("block_v=64, state 8 warps", {"block_v": 64, "launch": _STATE_8W}),
    ("chunk_bwd 4 warps", {"launch": (("mdn_chunk_bwd", 4, 1),)}),
    # C = 32: mdn_prep spills nothing and mdn_chunk_bwd 6.0 KB of spill traffic per thread
    # against 12.2 KB at C = 64 (XLA's compile, session 7), twice the chunk states in HBM
    # (fwd+bwd temp 2.2 GB instead of 1.4 GB)
    ("chunk_size=32", {"chunk_size": 32}),
)
TUNE_BUDGET_S = 120.0  # stop trying candidates after this much wall time

PEAK_TFLOPS = 790.0  # H200 bf16 dense, measured here (KINDS.md)
PEAK_GBS = 4800.0  # H200 HBM3e


def make_inputs(B, T, H, K, V, dtype, seed=0):
    ks = jax.random.split(jax.random.key(seed), 8)
    unit = lambda x: x / jnp.linalg.norm(x, axis=-1, keepdims=True)
    q = unit(jax.random.normal(ks[0], (B, T, H, K)))
    k = unit(jax.random.normal(ks[1], (B, T, H, K)))
    v = jax.random.normal(ks[2], (B, T, H, V))
    la = jax.nn.log_sigmoid(jax.random.normal(ks[3], (B, T, H))) / 8
    lm = jax.nn.log_sigmoid(jax.random.normal(ks[4], (B, T, H))) / 8
    p = jnp.exp(la)[..., None] * k
    beta = jax.nn.sigmoid(jax.random.normal(ks[5], (B, T, H))) * 0.5
    eta = jnp.tanh(jax.random.normal(ks[6], (B, T, H))) + 1.0
    toks = tuple(x.astype(dtype) for x in (q, k, v, p))
    return toks + (la, lm, beta, eta)


def median_time(fn, args, warmup, iters):
    """Median wall time of ``fn(*args)`` (blocked) after ``warmup`` calls, in seconds."""
    for _ in range(warmup):
        jax.block_until_ready(fn(*args))
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def jax_fns(op):
    """(forward, forward+backward) jitted closures of an op with the public signature."""

    def fwd(*a):
        return op(*a)[0]

    def loss(*a):
        return jnp.sum(op(*a)[0].astype(jnp.float32))

    return jax.jit(fwd), jax.jit(jax.grad(loss, argnums=tuple(range(8))))


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
    ap.add_argument(
        "--tune", action="store_true", help="time TUNE_CANDIDATES first and use the fastest"
    )
    ap.add_argument(
        "--check", action="store_true", help="first compare pallas with the recurrent reference"
    )
    args = ap.parse_args(argv)
    if args.cpu:
        args.B, args.T, args.H, args.K, args.V, args.chunk = 1, 24, 2, 16, 32, 16
        args.warmup, args.iters = 1, 1
    interpret = jax.default_backend() == "cpu"
    B, T, H, K, V = args.B, args.T, args.H, args.K, args.V
    dtype = jnp.dtype(args.dtype)
    inputs = make_inputs(B, T, H, K, V, dtype)

    pallas = functools.partial(
        momentum_delta_rule_pallas, scale=K**-0.5, chunk_size=args.chunk, interpret=interpret
    )
    chunk = functools.partial(
        momentum_delta_rule, scale=K**-0.5, method="chunk", chunk_size=args.chunk
    )
    failed = []

    def fail(what, label, e):  # on GPU a failure is reported and the run goes on; exit 1 at end
        failed.append(f"{label}: {type(e).__name__}: {str(e)[:2000]}")
        print(f"{what} FAILED: {failed[-1]}", flush=True)

    if args.check:
        tol = 1e-2 if dtype == jnp.bfloat16 else 1e-4
        # forward at the benchmark shape; forward and gradients at a small one
        small = inputs if args.cpu else make_inputs(2, min(T, 301), 2, K, V, dtype, seed=1)
        cases = ([] if args.cpu else [(inputs, False)]) + [(small, True)]
        for case, grads in cases:
            try:
                check(case, K, args.chunk, interpret, tol, grads=grads)
            except Exception as e:  # noqa: BLE001 - on GPU a failed check must not cost the
                # timings of this (rare) run
                if args.cpu:
                    raise
                fail("CHECK", "check", e)
    cands = TUNE_CANDIDATES[:2] if interpret else TUNE_CANDIDATES  # CPU: exercise the path
    for cand in MOSAIC_CANDIDATES:
        ok = mosaic_applies(K, V, T, args.chunk, dtype, cand[1])
        if ok and args.check and not args.cpu:
            try:  # the Mosaic GPU state kernel is a tuning candidate: it must be right to win
                check(small, K, args.chunk, interpret, tol, grads=True, **cand[1])
            except Exception as e:  # noqa: BLE001 - report, drop the candidate, go on
                fail("CHECK", f"check ({cand[0]})", e)
                ok = False
        if not ok:
            cands = tuple(c for c in cands if c is not cand)
    if args.tune:
        tuned = tune(pallas, inputs, args.warmup, args.iters, cands)
        if tuned is None:
            failed.append("tuning: every candidate failed (the rows below use the defaults)")
        else:
            pallas = tuned
    rows = []
    ops = [("pallas", pallas, True)]
    if not args.cpu:  # the backward="xla" variant: kernel state recurrence + XLA chunk math
        ops.append(("pallas bwd=xla", functools.partial(pallas, backward="xla"), False))
    if not args.skip_chunk:
        ops.append(("chunk", chunk, True))
    for name, op, with_fwd in ops:
        f, fb = jax_fns(op)
        for direction, fn in ([("fwd", f)] if with_fwd else []) + [("fwd+bwd", fb)]:
            try:
                rows.append((name, direction, median_time(fn, inputs, args.warmup, args.iters)))
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
    base = {d: t for n, d, t in rows if n == "chunk"}
    if "fwd+bwd" in base and "fwd+bwd" in pf:
        print(f"chunk / pallas fwd+bwd: {base['fwd+bwd'] / pf['fwd+bwd']:.2f}x (target >= 3x)")
    for msg in failed:
        print(f"FAILED {msg}")
    return 1 if failed else 0


def tune(pallas, inputs, warmup, iters, candidates=TUNE_CANDIDATES):
    """Time forward+backward of each candidate (a failure, e.g. a kernel over the
    shared-memory limit, is a row, not an abort); print the table; return the fastest op, or
    None when every candidate failed."""
    rows, best, t_start = [], None, time.perf_counter()
    print("\nTuning (fwd+bwd median ms; keyword overrides of the op):\n", flush=True)
    for label, overrides in candidates:
        if time.perf_counter() - t_start > TUNE_BUDGET_S:
            rows.append((label, "skipped (tuning budget spent)"))
            continue
        op = functools.partial(pallas, **overrides)
        try:
            t = median_time(jax_fns(op)[1], inputs, warmup, iters)
        except Exception as e:  # noqa: BLE001 - a config that fails to compile is a result
            rows.append((label, f"FAILED: {type(e).__name__}: {str(e)[:300]}"))
            continue
        rows.append((label, f"{t * 1e3:.3f}"))
        if best is None or t < best[0]:
            best = (t, label, op)
    print("| config | fwd+bwd ms |\n|---|---|")
    for label, cell in rows:
        print(f"| {label} | {cell} |")
    if best is None:
        print("\ntuning: every candidate failed", flush=True)
        return None
    print(f"\nfastest: {best[1]} (used for the pallas rows below)", flush=True)
    return best[2]


def mosaic_applies(K, V, T, chunk, dtype, options):
    """Whether a Mosaic candidate's ``options`` run at this shape (bfloat16, chunk 64, K padded
    to 64 or 128, its block_v dividing the padded V and fitting shared memory)."""
    from jaxlib_ext.pallas_kernels.mdn.kernel import _mosaic_state_kernel_applies

    launch = options.get("launch", ())
    return _mosaic_state_kernel_applies(dtype, T, K, V, chunk, options["block_v"], launch)


def check(inputs, K, chunk, interpret, tol, grads, **options):
    """rel-RMSE of pallas vs method="recurrent" (outputs, final state, optionally gradients);
    ``options`` go to ``momentum_delta_rule_pallas``."""
    B, T, H, _ = inputs[0].shape
    V = inputs[2].shape[-1]
    s0 = 0.1 * jax.random.normal(jax.random.key(7), (2, B, H, K, V))
    kw = dict(scale=K**-0.5, initial_state=s0, output_final_state=True)
    pallas = functools.partial(
        momentum_delta_rule_pallas, chunk_size=chunk, interpret=interpret, **kw, **options
    )
    ref = functools.partial(momentum_delta_rule, method="recurrent", **kw)
    rel = lambda a, b: float(
        jnp.linalg.norm((a.astype(jnp.float32) - b.astype(jnp.float32)).ravel())
        / jnp.linalg.norm(b.astype(jnp.float32).ravel())
    )
    with jax.default_matmul_precision("highest"):
        (o, fs), (o_r, fs_r) = pallas(*inputs), ref(*inputs)
        errs = {"o": rel(o, o_r), "final_state": rel(fs, fs_r)}
        if grads:
            loss = lambda f: lambda *a: jnp.sum(f(*a)[0].astype(jnp.float32) * o_r) + jnp.sum(
                f(*a)[1] * fs_r
            )
            argn = tuple(range(8))
            g = jax.grad(loss(pallas), argnums=argn)(*inputs)
            g_r = jax.grad(loss(ref), argnums=argn)(*inputs)
            names = ("q", "k", "v", "p", "log_alpha", "log_mu", "beta", "eta")
            errs.update({f"d{n}": rel(a, b) for n, a, b in zip(names, g, g_r)})
    worst = max(errs.values())
    status = "PASS" if worst < tol and all(e == e for e in errs.values()) else "FAIL"
    print(
        f"check B={B} T={T} H={H} K={K} V={V} {inputs[0].dtype}"
        + "".join(f" {k}={v}" for k, v in options.items())
        + f": {status} (tol {tol:g}) "
        + " ".join(f"{k}={v:.1e}" for k, v in errs.items()),
        flush=True,
    )
    if status != "PASS":
        raise SystemExit(f"pallas vs recurrent check failed: {errs}")


def decode_table(inputs, K, interpret, warmup, iters):
    """One decoding step (token t = 0 against a random cached state): Pallas step kernel vs
    the XLA recurrent op on a length-1 sequence. GB/s counts reading and writing (S, M)."""
    B, _, H, _ = inputs[0].shape
    V = inputs[2].shape[-1]
    state = 0.1 * jax.random.normal(jax.random.key(3), (2, B, H, K, V))
    one = tuple(x[:, 0] for x in inputs)
    step = jax.jit(
        functools.partial(momentum_delta_rule_step_pallas, scale=K**-0.5, interpret=interpret)
    )

    def xla_step(*a):
        o, st = momentum_delta_rule(
            *(x[:, None] for x in a[:8]),
            scale=K**-0.5,
            initial_state=a[8],
            output_final_state=True,
            method="recurrent",
        )
        return o[:, 0], st

    rows = []
    for name, fn in (("pallas step", step), ("xla step", jax.jit(xla_step))):
        try:
            rows.append((name, median_time(fn, one + (state,), warmup, iters)))
        except Exception as e:  # noqa: BLE001
            print(f"{name} FAILED: {type(e).__name__}: {str(e)[:2000]}")
    nbytes = 2 * 2 * B * H * K * V * 4
    print(f"\nDecode step B={B} H={H} K={K} V={V}\n")
    print("| path | median us | vs xla step | GB/s (of ~4800) |")
    print("|---|---|---|---|")
    base = dict(rows).get("xla step")
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
    base = {d: t for n, d, t in rows if n == "chunk"}
    print(
        f"\nMDN B={B} T={T} H={H} K={K} V={V} {args.dtype} chunk={args.chunk} "
        f"backend={jax.default_backend()} jax={jax.__version__} interpret={interpret}\n"
    )
    print("| path | pass | median ms | vs chunk | TFLOP/s (of ~790) | GB/s (of ~4800) |")
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
