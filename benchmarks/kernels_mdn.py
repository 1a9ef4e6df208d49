"""Momentum delta rule op: xla (chunkwise) vs reference, forward and forward+backward, time, memory.

Baseline: ``method="reference"`` (the ``lax.scan`` recurrence) in the same run, against
``method="xla"`` (the chunkwise form). Shape defaults to
B=2, T=2048, H=4, K=64, V=128. Times are the median of ``--repeats`` runs after one
warm-up call, each ending in ``block_until_ready``; memory is XLA's compiled ``memory_analysis``
(arguments + outputs + temporaries - aliased bytes) of the jitted function, i.e. the planned peak
of that executable. The Gated DeltaNet ``"xla"`` (chunk) path is timed too, for context.

    .venv/bin/python -m benchmarks.kernels_mdn [--T 2048] [--chunk-size 64] [--repeats 5]
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks._harness import environment, forward_backward, forward_backward_table, parser
from jaxlib_ext.pallas_kernels.gated_delta import gated_delta_rule
from jaxlib_ext.pallas_kernels.mdn import momentum_delta_rule


def make_inputs(B, T, H, K, V, seed=0):
    rng = np.random.default_rng(seed)

    def unit(shape):
        x = rng.standard_normal(shape)
        return x / np.linalg.norm(x, axis=-1, keepdims=True)

    log_alpha = -np.logaddexp(0.0, -rng.uniform(size=(B, T, H)))  # logsigmoid(U(0,1))
    x = dict(
        q=unit((B, T, H, K)),
        k=unit((B, T, H, K)),
        v=rng.standard_normal((B, T, H, V)),
        p=np.exp(log_alpha)[..., None] * unit((B, T, H, K)),
        log_alpha=log_alpha,
        log_mu=-np.logaddexp(0.0, -rng.uniform(size=(B, T, H))) / 4.0,
        beta=0.5 / (1.0 + np.exp(-rng.standard_normal((B, T, H)))),
        eta=1.0 + np.tanh(rng.standard_normal((B, T, H))),
    )
    x = {n: jnp.asarray(a, jnp.float32) for n, a in x.items()}
    h0 = jnp.asarray(0.1 * rng.standard_normal((2, B, H, K, V)), jnp.float32)
    return x, h0


def mdn_fns(method, chunk_size):
    def fwd(x, h0):
        return momentum_delta_rule(
            **x, initial_state=h0, output_final_state=True, method=method, chunk_size=chunk_size
        )

    def loss(x, h0):
        o, fin = fwd(x, h0)
        return jnp.sum(o * o) + jnp.sum(fin)

    return jax.jit(fwd), jax.jit(jax.grad(loss, argnums=(0, 1)))


def gdn_fns(method, chunk_size):
    def fwd(x, s0):
        return gated_delta_rule(
            x["q"],
            x["k"],
            x["v"],
            x["log_alpha"],
            x["beta"],
            initial_state=s0[0],
            output_final_state=True,
            method=method,
            chunk_size=chunk_size,
        )

    def loss(x, s0):
        o, fin = fwd(x, s0)
        return jnp.sum(o * o) + jnp.sum(fin)

    return jax.jit(fwd), jax.jit(jax.grad(loss, argnums=(0, 1)))


def main():
    ap = parser(__doc__)
    ap.add_argument("--B", type=int, default=2)
    ap.add_argument("--T", type=int, default=2048)
    ap.add_argument("--H", type=int, default=4)
    ap.add_argument("--K", type=int, default=64)
    ap.add_argument("--V", type=int, default=128)
    ap.add_argument("--chunk-size", type=int, default=64)
    ap.add_argument("--no-gdn", action="store_true", help="skip the Gated DeltaNet context column")
    a = ap.parse_args()

    x, h0 = make_inputs(a.B, a.T, a.H, a.K, a.V)
    c, r = a.chunk_size, a.repeats
    res = {
        "MDN reference": forward_backward(*mdn_fns("reference", c), x, h0, repeats=r),
        f"MDN xla (chunk, C={c})": forward_backward(*mdn_fns("xla", c), x, h0, repeats=r),
    }
    if not a.no_gdn:
        res[f"GDN xla (chunk, C={c})"] = forward_backward(*gdn_fns("xla", c), x, h0, repeats=r)
    cols = list(res)

    print(f"momentum_delta_rule, B={a.B} T={a.T} H={a.H} K={a.K} V={a.V}, float32, "
          f"{environment()}, median of {a.repeats} after warm-up\n")
    print(forward_backward_table(res, (cols[0], cols[1]), "reference / xla (chunk)"))

if __name__ == "__main__":
    main()
