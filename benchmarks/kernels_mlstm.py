"""mLSTM op: chunkwise and quadratic parallel vs the recurrent reference, time and memory.

Baseline: ``method="recurrent"`` (the stabilised ``lax.scan``) in the same run. Shape defaults to
B=2, T=2048, H=4, K=V=64, float32. Forward returns the outputs and the final state;
forward+backward is the gradient of a scalar of both with respect to every input. Times are the
median of ``--repeats`` runs after one warm-up call, each ending in ``block_until_ready``; memory
is XLA's compiled ``memory_analysis`` (arguments + outputs + temporaries - aliased bytes) of the
jitted function, the planned peak of that executable.

    .venv/bin/python benchmarks/kernels_mlstm.py [--T 2048] [--chunk-size 64] [--repeats 5]
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

from jaxlib_ext.core.memory import compiled_memory
from jaxlib_ext.pallas_kernels.mlstm import mlstm


def make_inputs(B, T, H, K, V, seed=0):
    rng = np.random.default_rng(seed)
    x = dict(
        q=rng.standard_normal((B, T, H, K)),
        k=rng.standard_normal((B, T, H, K)),
        v=rng.standard_normal((B, T, H, V)),
        i_gate=2.0 * rng.standard_normal((B, T, H)),
        f_gate=3.0 + 1.5 * rng.standard_normal((B, T, H)),
    )
    return {n: jnp.asarray(a, jnp.float32) for n, a in x.items()}


def fns(method, chunk_size):
    def fwd(x):
        return mlstm(**x, output_final_state=True, method=method, chunk_size=chunk_size)

    def loss(x):
        h, (C, n, m) = fwd(x)
        return jnp.sum(h * h) + jnp.sum(jnp.exp(m)[..., None, None] * C) + jnp.sum(n)

    return jax.jit(fwd), jax.jit(jax.grad(loss))


def median_seconds(fn, x, repeats):
    jax.block_until_ready(fn(x))  # compile + warm-up
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(fn(x))
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def measure(pair, x, repeats):
    fwd, fwdbwd = pair
    return dict(
        fwd_s=median_seconds(fwd, x, repeats),
        bwd_s=median_seconds(fwdbwd, x, repeats),
        fwd_mem=compiled_memory(fwd.lower(x).compile()).get("peak", float("nan")),
        bwd_mem=compiled_memory(fwdbwd.lower(x).compile()).get("peak", float("nan")),
    )


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--B", type=int, default=2)
    ap.add_argument("--T", type=int, default=2048)
    ap.add_argument("--H", type=int, default=4)
    ap.add_argument("--K", type=int, default=64)
    ap.add_argument("--V", type=int, default=64)
    ap.add_argument("--chunk-size", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=5)
    a = ap.parse_args()

    x = make_inputs(a.B, a.T, a.H, a.K, a.V)
    res = {
        "recurrent": measure(fns("recurrent", a.chunk_size), x, a.repeats),
        "parallel": measure(fns("parallel", a.chunk_size), x, a.repeats),
        f"chunk (C={a.chunk_size})": measure(fns("chunk", a.chunk_size), x, a.repeats),
    }
    print(
        f"mlstm, B={a.B} T={a.T} H={a.H} K={a.K} V={a.V}, float32, "
        f"backend={jax.default_backend()}, jax {jax.__version__}, "
        f"{platform.processor() or platform.machine()}, median of {a.repeats} after warm-up\n"
    )
    cols = list(res)
    rec = res["recurrent"]
    print("| metric | " + " | ".join(cols) + " | recurrent / chunk |")
    print("|---|" + "---:|" * (len(cols) + 1))
    rows = [
        ("forward time (ms)", "fwd_s", 1e3),
        ("forward+backward time (ms)", "bwd_s", 1e3),
        ("forward peak memory (MiB)", "fwd_mem", 2.0**-20),
        ("forward+backward peak memory (MiB)", "bwd_mem", 2.0**-20),
    ]
    chunk = res[cols[-1]]
    for label, key, mult in rows:
        vals = " | ".join(f"{res[c][key] * mult:.1f}" for c in cols)
        print(f"| {label} | {vals} | {rec[key] / chunk[key]:.1f}x |")


if __name__ == "__main__":
    main()
