"""POET-X layer: forward+backward time and planned peak memory of one layer.

Rows, all in one run on the same inputs: a plain dense layer ``x @ w`` (gradients of ``x`` and
``w``: what AdamW trains), naive POET (``method="reference"``: the dense rotations ``R_in``,
``R_out`` and ``W_eff = R_in w R_out`` materialised, gradients through them to the thetas, as
the original POET), POET-X (``method="xla"``, input-centric, autodiff), POET-X memory mode
(``memory_saving=True``: the recomputing ``custom_vjp``), and on a GPU (or with ``--pallas``) the
same two through the Pallas kernels. POET rows differentiate ``x`` and both thetas (the base
weight is frozen). Times are medians of ``--repeats`` calls after a warm-up, each ending in
``block_until_ready``; peak memory is XLA's compiled ``memory_analysis`` of the jitted
forward+backward (arguments + outputs + temporaries - aliased), the planned peak of this
one-layer program; "saved for backward" is the bytes of the residuals ``jax.vjp`` of the jitted
layer keeps (inputs included), what every layer of a deep network holds from its forward to its
backward pass.

    .venv/bin/python -m benchmarks.kernels_poet                 # CPU: 1024x1024, 1024x3584
    python -m benchmarks.kernels_poet --gpu                     # 4096x4096, 4096x14336, bf16
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks._harness import environment, parser, peak_bytes, time_call
from jaxlib_ext.core.memory import format_bytes
from jaxlib_ext.pallas_kernels.poet import num_block_params, poet_linear


def inputs(n, m, b, tokens, dtype, seed=0):
    r = np.random.default_rng(seed)
    p = num_block_params(b)
    cast = lambda a: jnp.asarray(a, dtype)  # noqa: E731
    return dict(
        x=cast(r.standard_normal((tokens, n))),
        w=cast(r.standard_normal((n, m)) / np.sqrt(n)),
        ti=cast(0.01 * r.standard_normal((n // b, p))),
        to=cast(0.01 * r.standard_normal((m // b, p))),
        pi=jnp.asarray(r.permutation(n), jnp.int32),
        po=jnp.asarray(r.permutation(m), jnp.int32),
        dy=cast(r.standard_normal((tokens, m))),
    )


def saved_bytes(layer, args, n_diff):
    """Bytes of the residuals ``jax.vjp`` keeps for the backward pass of the jitted layer (what
    each layer of a deep network holds from its forward until its backward), inputs included."""
    diff, rest = args[:n_diff], args[n_diff:]
    _, vjp = jax.vjp(jax.jit(lambda *d: layer(*d, *rest)), *diff)
    return sum(leaf.nbytes for leaf in jax.tree.leaves(vjp) if hasattr(leaf, "nbytes"))


def dense_fn():
    layer = lambda x, w: x @ w  # noqa: E731

    def loss(x, w, dy):
        return jnp.sum(layer(x, w).astype(jnp.float32) * dy.astype(jnp.float32))

    g = jax.jit(jax.grad(loss, argnums=(0, 1)))
    args = lambda a: (a["x"], a["w"], a["dy"])  # noqa: E731
    return (lambda a: g(*args(a)), lambda a: (g, args(a)),
            lambda a: saved_bytes(layer, args(a)[:2], 2))


def poet_fn(b, method, memory):
    def layer(x, ti, to, w, pi, po):
        return poet_linear(x, w, ti, to, pi, po, block_size=b, method=method,
                           memory_saving=memory)

    def loss(x, ti, to, w, pi, po, dy):
        return jnp.sum(layer(x, ti, to, w, pi, po).astype(jnp.float32) * dy.astype(jnp.float32))

    g = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))
    args = lambda a: (a["x"], a["ti"], a["to"], a["w"], a["pi"], a["po"], a["dy"])  # noqa: E731
    return (lambda a: g(*args(a)), lambda a: (g, args(a)),
            lambda a: saved_bytes(layer, args(a)[:6], 3))


def rows(b, pallas):
    out = {
        "dense layer (x @ w)": dense_fn(),
        "naive POET (W_eff materialised)": poet_fn(b, "reference", False),
        "POET-X (xla)": poet_fn(b, "xla", False),
        "POET-X memory mode (xla)": poet_fn(b, "xla", True),
    }
    if pallas:
        out["POET-X (pallas)"] = poet_fn(b, "pallas", False)
        out["POET-X memory mode (pallas)"] = poet_fn(b, "pallas", True)
    return out


def main(argv=None):
    ap = parser(__doc__)
    ap.add_argument("--gpu", action="store_true", help="the paper's shapes in bfloat16")
    ap.add_argument("--shapes", default=None, help="n x m pairs, e.g. 1024x1024,1024x3584")
    ap.add_argument("--block-size", type=int, default=256)
    ap.add_argument("--tokens", type=int, default=2048)
    ap.add_argument("--pallas", action="store_true", help="also the Pallas rows (GPU default)")
    ap.add_argument("--skip-naive", action="store_true")
    a = ap.parse_args(argv)
    on_gpu = jax.default_backend() == "gpu"
    shapes = a.shapes or ("4096x4096,4096x14336" if a.gpu else "1024x1024,1024x3584")
    shapes = [tuple(int(v) for v in s.split("x")) for s in shapes.split(",")]
    dtype = jnp.bfloat16 if a.gpu else jnp.float32
    print(f"POET-X layer forward+backward, b={a.block_size}, {a.tokens} tokens, "
          f"{jnp.dtype(dtype).name}; {environment()}; median of {a.repeats}\n")
    print("| n x m | layer | fwd+bwd ms | vs dense | naive POET / this | peak memory | "
          "saved for backward |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for n, m in shapes:
        args = inputs(n, m, a.block_size, a.tokens, dtype)
        results = {}
        for name, (fn, prog, saved) in rows(a.block_size, a.pallas or on_gpu).items():
            if a.skip_naive and name.startswith("naive"):
                continue
            g, gargs = prog(args)
            mem = peak_bytes(g, *gargs)
            results[name] = (time_call(fn, args, repeats=a.repeats).median, mem, saved(args))
        dense_t = results["dense layer (x @ w)"][0]
        naive_t = results.get("naive POET (W_eff materialised)", (float("nan"),))[0]
        for name, (t, mem, kept) in results.items():
            print(f"| {n}x{m} | {name} | {1e3 * t:.2f} | {t / dense_t:.2f}x | "
                  f"{naive_t / t:.2f}x | {format_bytes(mem)} | {format_bytes(kept)} |",
                  flush=True)


if __name__ == "__main__":
    main()
