"""Time the tuning candidates of the momentum delta rule Pallas kernels on a GPU and keep the
fastest.

For each of ``candidates.TUNE_CANDIDATES`` (options of the Pallas op, ``mdn_probes.pallas_op``)
the forward+backward is compiled and timed (median after warm-up) at the benchmark shape; a
candidate that fails, e.g. a kernel over the shared-memory limit, is a row of the table, not an
abort; candidates stop being tried once ``--budget`` seconds are spent. The Mosaic GPU
candidates run only where that kernel applies (bfloat16, chunk 64, K padded to 64 or 128, its
V tile fitting shared memory); with ``--check`` each must first match the recurrence (forward
and gradients, ``check``), as must the defaults, at the benchmark shape (forward) and at a small
one (forward and gradients).

Run from the repository root::

    python -m tools.kernel_audit.tuning --check             # GPU, B=8 T=4096 H=6 K=128 V=256
    python -m tools.kernel_audit.tuning --cpu --check       # CPU, interpret mode, tiny shapes

On CPU (interpret mode) only the first two candidates are timed: that exercises the path, the
times mean nothing. Exit status 1 when a check fails or every candidate fails.
"""

import argparse
import functools
import sys
import time

import jax
import jax.numpy as jnp

from jaxlib_ext.core.timing import time_call

from .candidates import MOSAIC_CANDIDATES, TUNE_CANDIDATES
from .check import check_against_recurrent
from .inputs import random_inputs
from .mdn_probes import mosaic_state_kernel_applies, pallas_op

TUNE_BUDGET_S = 120.0  # stop trying candidates after this much wall time


def forward_backward(op):
    """The jitted gradient, with respect to all eight inputs, of ``sum(o)`` for an op with the
    public signature (the forward runs inside it)."""

    def loss(*a):
        return jnp.sum(op(*a)[0].astype(jnp.float32))

    return jax.jit(jax.grad(loss, argnums=tuple(range(8))))


def tune(pallas, inputs, warmup, iters, candidates=TUNE_CANDIDATES, budget_s=TUNE_BUDGET_S):
    """Time forward+backward of ``pallas`` with each candidate's overrides, print the table and
    return ``(label, op)`` of the fastest, or None when every candidate failed."""
    rows, best, t_start = [], None, time.perf_counter()
    print("\nTuning (fwd+bwd median ms; keyword overrides of the op):\n", flush=True)
    for label, overrides in candidates:
        if time.perf_counter() - t_start > budget_s:
            rows.append((label, "skipped (tuning budget spent)"))
            continue
        op = functools.partial(pallas, **overrides)
        try:
            t = time_call(forward_backward(op), *inputs, warmup=warmup, repeats=iters).median
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
    print(f"\nfastest: {best[1]}", flush=True)
    return best[1], best[2]


def mosaic_applies(K, V, T, chunk, dtype, options):
    """Whether a Mosaic candidate's ``options`` run at this shape (bfloat16, chunk 64, K padded
    to 64 or 128, its block_v dividing the padded V and fitting shared memory)."""
    launch = options.get("launch", ())
    return mosaic_state_kernel_applies(dtype, T, K, V, chunk, options["block_v"], launch)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
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
    ap.add_argument("--budget", type=float, default=TUNE_BUDGET_S, help="seconds of tuning")
    ap.add_argument(
        "--check", action="store_true", help="first compare with the recurrent reference"
    )
    args = ap.parse_args(argv)
    if args.cpu:
        args.B, args.T, args.H, args.K, args.V, args.chunk = 1, 24, 2, 16, 32, 16
        args.warmup, args.iters = 1, 1
    interpret = jax.default_backend() == "cpu"
    B, T, H, K, V = args.B, args.T, args.H, args.K, args.V
    dtype = jnp.dtype(args.dtype)
    inputs = random_inputs(B, T, H, K, V, dtype)
    print(
        f"MDN B={B} T={T} H={H} K={K} V={V} {args.dtype} chunk={args.chunk} "
        f"backend={jax.default_backend()} jax={jax.__version__} interpret={interpret}",
        flush=True,
    )
    pallas = functools.partial(
        pallas_op, scale=K**-0.5, chunk_size=args.chunk, interpret=interpret
    )
    failed = []

    def fail(label, e):  # on GPU a failure is reported and the run goes on; exit 1 at the end
        failed.append(f"{label}: {type(e).__name__}: {str(e)[:2000]}")
        print(f"CHECK FAILED: {failed[-1]}", flush=True)

    tol = 1e-2 if dtype == jnp.bfloat16 else 1e-4
    if args.check:
        # forward at the benchmark shape; forward and gradients at a small one
        small = inputs if args.cpu else random_inputs(2, min(T, 301), 2, K, V, dtype, seed=1)
        cases = ([] if args.cpu else [(inputs, False)]) + [(small, True)]
        for case, grads in cases:
            try:
                check_against_recurrent(case, K, args.chunk, interpret, tol, grads=grads)
            except Exception as e:  # noqa: BLE001 - on GPU one failed check must not cost
                # the tuning table of this (rare) run
                if args.cpu:
                    raise
                fail("check", e)
    cands = TUNE_CANDIDATES[:2] if interpret else TUNE_CANDIDATES  # CPU: exercise the path
    for cand in MOSAIC_CANDIDATES:
        ok = mosaic_applies(K, V, T, args.chunk, dtype, cand[1])
        if ok and args.check and not args.cpu:
            try:  # the Mosaic GPU state kernel is a candidate: it must be right to win
                check_against_recurrent(
                    small, K, args.chunk, interpret, tol, grads=True, **cand[1]
                )
            except Exception as e:  # noqa: BLE001 - report, drop the candidate, go on
                fail(f"check ({cand[0]})", e)
                ok = False
        if not ok:
            cands = tuple(c for c in cands if c is not cand)
    if tune(pallas, inputs, args.warmup, args.iters, cands, args.budget) is None:
        failed.append("tuning: every candidate failed")
    for msg in failed:
        print(f"FAILED {msg}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
