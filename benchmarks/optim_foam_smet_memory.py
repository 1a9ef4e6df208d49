"""Optimizer-state (and gradient) bytes of FOAM and SMET vs optax.adamw on LLaMA shapes.

Measured on the actual state pytrees built by ``init`` under ``jax.eval_shape`` (no memory is
allocated, so the 1B shapes run on a laptop), and update time per step under ``jit`` on CPU for
one size, all as ratios to ``optax.adamw`` in the same run.

LLaMA shapes of the GaLore/FOAM/SMET pretraining runs (hidden, intermediate, layers; vocab 32000,
Flax ``(in, out)`` kernels: q/k/v/o, gate/up/down per layer, two RMSNorm scales, embedding, LM
head, final norm). Folded (FOAM) and sparse (SMET) leaves are the default masks: every matrix
except the embedding and the LM head.

Usage::

    python -m benchmarks.optim_foam_smet_memory       # all sizes, timing on LLaMA-60M
    python -m benchmarks.optim_foam_smet_memory --time-size 130m --time-steps 10
    python -m benchmarks.optim_foam_smet_memory --no-time   # memory tables only
"""

from __future__ import annotations

import argparse
import math
import platform
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from jaxlib_ext.optim import _common, foam, smet
from jaxlib_ext.optim.smet_layer import SparseLinear

CONFIGS = {  # hidden, intermediate, layers (GaLore configs/llama_*.json), vocab 32000
    "60m": (512, 1376, 8),
    "130m": (768, 2048, 12),
    "350m": (1024, 2736, 24),
    "1b": (2048, 5461, 24),
}
VOCAB = 32000


def llama_shapes(size: str, dtype=jnp.float32):
    h, f, n = CONFIGS[size]
    s = lambda *shape: jax.ShapeDtypeStruct(shape, dtype)  # noqa: E731
    layer = lambda: {  # noqa: E731
        "attn": {"q": {"kernel": s(h, h)}, "k": {"kernel": s(h, h)},
                 "v": {"kernel": s(h, h)}, "o": {"kernel": s(h, h)}},
        "mlp": {"gate": {"kernel": s(h, f)}, "up": {"kernel": s(h, f)},
                "down": {"kernel": s(f, h)}},
        "attn_norm": {"scale": s(h)},
        "mlp_norm": {"scale": s(h)},
    }
    return {
        "embed": {"embedding": s(VOCAB, h)},
        "layers": {str(i): layer() for i in range(n)},
        "final_norm": {"scale": s(h)},
        "lm_head": {"kernel": s(h, VOCAB)},
    }


def nbytes(tree) -> int:
    return int(sum(math.prod(x.shape) * np.dtype(x.dtype).itemsize for x in jax.tree.leaves(tree)))


def matrix_leaves(params):
    mask = jax.tree_util.tree_map_with_path(_common.default_matrix_mask, params)
    return [p for p, m in zip(jax.tree.leaves(params), jax.tree.leaves(mask), strict=True) if m]


def foam_state_bytes(params, level):
    st = jax.eval_shape(foam(1e-3, level=level).init, params)[0]
    mask = jax.tree.leaves(jax.tree_util.tree_map_with_path(_common.default_matrix_mask, params))
    folded = sum(nbytes(a) + nbytes(b) for a, b, m in zip(
        jax.tree.leaves(st.mu), jax.tree.leaves(st.nu), mask, strict=True) if m)
    return nbytes(st), folded


def smet_state_bytes(params, density, block_size):
    opt = smet(1e-3, density=density, total_steps=1000, block_size=block_size,
               key=jax.random.key(0))
    st = jax.eval_shape(opt.init, params)
    s = st[0]
    leaves = [jax.tree.leaves(t) for t in (s.idx, s.step, s.mu, s.nu)]
    sparse = sum(nbytes(per_leaf) for per_leaf in zip(*leaves, strict=True) if per_leaf[0].size)
    return nbytes(st), sparse


def sparse_linear_grad_bytes(params, density, block_size):
    """Gradient bytes of SparseLinear layers replacing every matrix, via eval_shape of jax.grad."""
    cache, total = {}, 0
    for p in matrix_leaves(params):
        din, dout = p.shape
        if (din, dout) not in cache:
            layer = nnx.eval_shape(lambda din=din, dout=dout: SparseLinear(
                din, dout, density=density, block_size=block_size, use_bias=False,
                rngs=nnx.Rngs(0)))
            graphdef, values, rest = nnx.split(layer, nnx.Param, ...)

            def loss(v, rest, x, graphdef=graphdef):
                return jnp.sum(nnx.merge(graphdef, v, rest)(x))

            x = jax.ShapeDtypeStruct((2, din), jnp.float32)
            g = jax.eval_shape(jax.grad(loss), values, rest, x)
            cache[(din, dout)] = nbytes(g)
        total += cache[(din, dout)]
    return total


def memory_tables(sizes):
    rows_total, rows_foam, rows_smet = [], [], []
    for size in sizes:
        params = llama_shapes(size)
        n_params = sum(math.prod(x.shape) for x in jax.tree.leaves(params))
        adam_total = nbytes(jax.eval_shape(optax.adamw(1e-3).init, params))
        mats = matrix_leaves(params)
        adam_mats = 2 * nbytes(mats)  # mu + nu of the matrices
        grad_mats = nbytes(mats)
        row = [size, f"{n_params / 1e6:.0f}M", f"{adam_total / 2**20:.0f}"]
        for level in (2, 4):
            tot, fold = foam_state_bytes(params, level)
            rows_foam.append([size, level, f"{fold / adam_mats:.3f}", f"{tot / adam_total:.3f}"])
            row.append(f"{tot / adam_total:.3f}")
        for d in (0.5, 0.1):
            for bs in (1, 4, 16):
                tot, sp = smet_state_bytes(params, d, bs)
                gb = sparse_linear_grad_bytes(params, d, bs)
                ratio_mats = (sp + gb) / (adam_mats + grad_mats)
                rows_smet.append([size, d, bs, f"{sp / adam_mats:.3f}", f"{gb / grad_mats:.3f}",
                                  f"{ratio_mats:.3f}", f"{ratio_mats / d:.2f}",
                                  f"{tot / adam_total:.3f}"])
                if bs == 1:
                    row.append(f"{tot / adam_total:.3f}")
        rows_total.append(row)
    return rows_total, rows_foam, rows_smet


def table(header, rows):
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(lines)


def time_updates(size, steps, seed=0):
    shapes = llama_shapes(size)
    key = jax.random.key(seed)
    leaves, treedef = jax.tree.flatten(shapes)
    keys = jax.random.split(key, len(leaves))
    params = treedef.unflatten(
        [0.02 * jax.random.normal(k, s.shape, s.dtype) for k, s in zip(keys, leaves)]
    )
    grads = jax.tree.map(lambda p: 0.01 * jnp.sin(p * 37.0), params)
    opts = {
        "optax.adamw": optax.adamw(1e-3, weight_decay=0.0),
        "foam l=2": foam(1e-3, level=2),
        "foam l=4": foam(1e-3, level=4),
        "smet d=0.5 bs=1": smet(1e-3, density=0.5, total_steps=10**6, update_every=10**6,
                                key=jax.random.key(1)),
        "smet d=0.1 bs=16": smet(1e-3, density=0.1, total_steps=10**6, update_every=10**6,
                                 block_size=16, key=jax.random.key(1)),
    }
    steps_fn, states = {}, {}
    for name, opt in opts.items():

        @jax.jit
        def step(p, s, g, opt=opt):
            u, s = opt.update(g, s, p)
            return optax.apply_updates(p, u), s

        steps_fn[name] = step
        states[name] = step(params, opt.init(params), grads)  # compile + one step
        jax.block_until_ready(states[name])
    # interleave the optimizers round by round so machine load hits all of them alike
    times = {name: [] for name in opts}
    for _ in range(steps):
        for name in opts:
            p, s = states[name]
            t0 = time.perf_counter()
            out = steps_fn[name](p, s, grads)
            jax.block_until_ready(out)
            times[name].append(time.perf_counter() - t0)
            states[name] = out
    results = {name: float(np.median(t)) for name, t in times.items()}
    base = results["optax.adamw"]
    return [[n, f"{t * 1e3:.1f}", f"{t / base:.2f}"] for n, t in results.items()]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="60m,130m,350m,1b")
    ap.add_argument("--time-size", default="60m")
    ap.add_argument("--time-steps", type=int, default=5)
    ap.add_argument("--no-time", action="store_true")
    args = ap.parse_args(argv)
    sizes = args.sizes.split(",")
    print(f"jax {jax.__version__}, optax {optax.__version__}, {platform.processor() or 'cpu'}, "
          f"{jax.devices()[0].platform}, float32 params")
    rows_total, rows_foam, rows_smet = memory_tables(sizes)
    print("\n### Whole-model optimizer state / optax.adamw state\n")
    print(table(["size", "params", "adamw state MiB", "foam l=2", "foam l=4", "smet d=0.5",
                 "smet d=0.1"], rows_total))
    print("\n### FOAM on the folded matrices (target: l=2 <= 0.30, l=4 <= 0.10)\n")
    print(table(["size", "level", "state / adamw (matrices)", "state / adamw (model)"], rows_foam))
    print("\n### SMET on the sparse matrices (target: (state+grad) <= 2 x density at bs=1)\n")
    print(table(["size", "density", "block", "state / adam", "SparseLinear grad / dense grad",
                 "(state+grad) / adam", "... / density", "model state / adamw"], rows_smet))
    if not args.no_time:
        print(f"\n### Update time per step, jit, CPU, LLaMA-{args.time_size} "
              f"(median of {args.time_steps})\n")
        print(table(["optimizer", "ms / step", "vs optax.adamw"],
                    time_updates(args.time_size, args.time_steps)))


if __name__ == "__main__":
    main()
