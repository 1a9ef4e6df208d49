"""mLSTM op: the XLA forms (chunkwise, quadratic parallel) vs the reference, time and memory.

Baseline: ``method="reference"`` (the stabilised ``lax.scan`` recurrence) in the same run, against
``method="xla"`` with ``xla_form="parallel"`` and ``xla_form="chunk"``. Shape defaults to
B=2, T=2048, H=4, K=V=64, float32. Forward returns the outputs and the final state;
forward+backward is the gradient of a scalar of both with respect to every input. Times are the
median of ``--repeats`` runs after one warm-up call, each ending in ``block_until_ready``; memory
is XLA's compiled ``memory_analysis`` (arguments + outputs + temporaries - aliased bytes) of the
jitted function, the planned peak of that executable.

    .venv/bin/python -m benchmarks.kernels_mlstm [--T 2048] [--chunk-size 64] [--repeats 5]
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks._harness import environment, forward_backward, forward_backward_table, parser
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


def fns(method, chunk_size, xla_form="chunk"):
    def fwd(x):
        return mlstm(**x, output_final_state=True, method=method, xla_form=xla_form,
                     chunk_size=chunk_size)

    def loss(x):
        h, (C, n, m) = fwd(x)
        return jnp.sum(h * h) + jnp.sum(jnp.exp(m)[..., None, None] * C) + jnp.sum(n)

    return jax.jit(fwd), jax.jit(jax.grad(loss))


def main():
    ap = parser(__doc__)
    ap.add_argument("--B", type=int, default=2)
    ap.add_argument("--T", type=int, default=2048)
    ap.add_argument("--H", type=int, default=4)
    ap.add_argument("--K", type=int, default=64)
    ap.add_argument("--V", type=int, default=64)
    ap.add_argument("--chunk-size", type=int, default=64)
    a = ap.parse_args()

    x = make_inputs(a.B, a.T, a.H, a.K, a.V)
    c, r = a.chunk_size, a.repeats
    res = {
        "reference": forward_backward(*fns("reference", c), x, repeats=r),
        "xla (parallel)": forward_backward(*fns("xla", c, "parallel"), x, repeats=r),
        f"xla (chunk, C={c})": forward_backward(*fns("xla", c, "chunk"), x, repeats=r),
    }
    print(f"mlstm, B={a.B} T={a.T} H={a.H} K={a.K} V={a.V}, float32, {environment()}, "
          f"median of {a.repeats} after warm-up\n")
    print(forward_backward_table(res, ("reference", list(res)[-1]), "reference / xla (chunk)"))

if __name__ == "__main__":
    main()
