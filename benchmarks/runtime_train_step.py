"""Tokens/s of the jit and pmap training steps on 1, 2, 4 and 8 simulated CPU devices.

The device count of a JAX process is fixed when its backend starts, so the script runs
itself once per count (``--devices N`` in a child process) and prints one markdown table.
Same model (tiny Transformer), same global batch for every row; the time is the median of
timed steps after warm-up, each ended with ``block_until_ready``.

    python -m benchmarks.runtime_train_step [--steps 10] [--batch-size 32] [--seq-len 128]
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess
import sys


def measure(args) -> dict:
    import jax
    import numpy as np
    import optax
    from flax import nnx

    from benchmarks._harness import time_steps
    from jaxlib_ext.core import data, memory, sharding, train
    from jaxlib_ext.models import build_transformer

    corpus = data.load_corpus()
    mesh = sharding.make_mesh(None)
    model = build_transformer("tiny", vocab_size=256, rngs=nnx.Rngs(0))
    tx = optax.adamw(1e-3)
    graphdef, rest, state = train.init_state(model, tx, 0)
    loss_fn = train.make_loss_fn(graphdef, rest)
    state_sh = train.train_state_shardings(state, mesh)
    batch_sh = sharding.batch_sharding(mesh)
    offsets = data.batch_offsets(0, 0, args.batch_size, args.seq_len, len(corpus.train))
    out = {"devices": jax.device_count()}
    n = jax.local_device_count()
    for mode in ("pmap", "jit"):  # jit last: it donates (and so deletes) `state`
        if mode == "jit":
            step = train.make_train_step(tx, loss_fn, state_sh, batch_sh)
            s = jax.device_put(state, state_sh)
            batch = data.make_global_batch(corpus.train, offsets, args.seq_len, batch_sh)
            compiled = step.lower(s, batch).compile()
            out["jit_peak_bytes"] = memory.compiled_memory(compiled).get("peak", 0)
        else:
            step = train.make_pmap_train_step(tx, loss_fn)
            s = jax.tree.map(lambda x: np.stack([np.asarray(x)] * n), state)
            rows = corpus.train[offsets[:, None] + np.arange(args.seq_len + 1)[None, :]]
            batch = rows.reshape(n, -1, args.seq_len + 1)
        timing, _ = time_steps(lambda carry, step=step, batch=batch: step(carry[0], batch),
                               (s, None), warmup=args.warmup, repeats=args.steps)
        out[f"{mode}_tokens_per_s"] = args.batch_size * args.seq_len / timing.median
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--devices", type=int, default=None, help="(internal) one child run")
    p.add_argument("--counts", default="1,2,4,8")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--seq-len", type=int, default=128)
    args = p.parse_args()
    if args.devices is not None:
        print(json.dumps(measure(args)))
        return
    rows = []
    for n in map(int, args.counts.split(",")):
        env = {**os.environ, "JAX_PLATFORMS": "cpu", "JAX_NUM_CPU_DEVICES": str(n)}
        cmd = [sys.executable, "-m", "benchmarks.runtime_train_step", "--devices", str(n),
               "--steps", str(args.steps), "--warmup", str(args.warmup),
               "--batch-size", str(args.batch_size), "--seq-len", str(args.seq_len)]
        res = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True,
                             cwd=pathlib.Path(__file__).resolve().parents[1])
        rows.append(json.loads(res.stdout.strip().splitlines()[-1]))
    import jax

    print(f"tiny Transformer, global batch {args.batch_size} x {args.seq_len} tokens, "
          f"jax {jax.__version__}, {os.cpu_count()} CPU cores\n")
    print("| devices | jit tokens/s | pmap tokens/s | pmap / jit | jit peak MiB/device |")
    print("|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['devices']} | {r['jit_tokens_per_s']:,.0f} | {r['pmap_tokens_per_s']:,.0f} "
              f"| {r['pmap_tokens_per_s'] / r['jit_tokens_per_s']:.2f} "
              f"| {r['jit_peak_bytes'] / 2**20:.1f} |")


if __name__ == "__main__":
    main()
