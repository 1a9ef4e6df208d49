"""LatentMoE dispatch: the sorted grouped-matmul path vs the dense reference, forward and
forward+backward.

One :class:`~jaxlib_ext.models.latent_moe.LatentMoE` layer (arXiv 2601.18089) at E = 64
experts, top-8, d = 512, latent width 128, expert width 256, no shared expert, 4096 tokens,
float32, timed with ``method="xla"`` (tokens sorted by expert, grouped matmuls by
``moe.gmm(method="xla")``: on CPU its tiled work-item form, ``jax.lax.ragged_dot`` elsewhere) and
``method="reference"`` (every expert on every token, masked: ``E / k = 8`` times the routed
FLOPs),
with the same parameters and inputs. ``method="pallas"`` is interpreted on CPU (not a timing)
and is left out. Times are the median of ``--repeats`` runs after one warm-up call, each ending
in ``block_until_ready``; memory is XLA's compiled ``memory_analysis`` of the jitted function.
The FLOP column counts the matmuls of the routed experts and projections per token.

    .venv/bin/python -m benchmarks.models_latent_moe_dispatch [--tokens 4096] [--repeats 5]
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from benchmarks._harness import MIB, environment, parser, peak_bytes, time_call
from jaxlib_ext.models.latent_moe import LatentMoE, LatentMoEConfig


def layer_fns(args, method):
    config = LatentMoEConfig(
        num_experts=args.experts, top_k=args.top_k, expert_dim=args.expert_dim,
        latent_dim=args.latent, method=method,
    )  # fmt: skip
    layer = LatentMoE(args.d, config, rngs=nnx.Rngs(0))
    graphdef, params, rest = nnx.split(layer, nnx.Param, ...)

    def forward(params, x):
        return nnx.merge(graphdef, params, rest)(x)[0]

    def loss(params, x):
        return jnp.sum(jnp.square(forward(params, x)))

    return params, jax.jit(forward), jax.jit(jax.grad(loss, argnums=(0, 1)))


def routed_flops(args, dense: bool) -> float:
    """Matmul FLOPs per token: router, projections and the routed (or all, when dense) experts."""
    experts = args.experts if dense else args.top_k
    return (
        2 * args.d * args.experts
        + 2 * 2 * args.d * args.latent
        + experts * 2 * 2 * args.latent * args.expert_dim
    )


def main():
    ap = parser(__doc__)
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--d", type=int, default=512)
    ap.add_argument("--latent", type=int, default=128)
    ap.add_argument("--experts", type=int, default=64)
    ap.add_argument("--top-k", type=int, default=8)
    ap.add_argument("--expert-dim", type=int, default=256)
    a = ap.parse_args()

    x = jax.random.normal(jax.random.key(1), (a.tokens, a.d), jnp.float32)
    res = {}
    for method in ("xla", "reference"):
        params, fwd, fwdbwd = layer_fns(a, method)
        res[method] = dict(
            fwd=time_call(fwd, params, x, repeats=a.repeats).median,
            bwd=time_call(fwdbwd, params, x, repeats=a.repeats).median,
            fwd_mem=peak_bytes(fwd, params, x) * MIB,
            bwd_mem=peak_bytes(fwdbwd, params, x) * MIB,
            flops=routed_flops(a, method == "reference"),
        )
    print(
        f"LatentMoE layer, T={a.tokens} d={a.d} latent={a.latent} E={a.experts} "
        f"top-{a.top_k} expert_dim={a.expert_dim}, no shared expert, float32, "
        f"{environment()}, median of {a.repeats} after warm-up\n"
    )
    print("| metric | xla (sorted, grouped matmul) | reference (dense) | reference / xla |")
    print("|---|---:|---:|---:|")
    rows = [
        ("forward time (ms)", "fwd", 1e3),
        ("forward+backward time (ms)", "bwd", 1e3),
        ("forward tokens/s", None, None),
        ("forward peak memory (MiB)", "fwd_mem", 1.0),
        ("forward+backward peak memory (MiB)", "bwd_mem", 1.0),
        ("matmul MFLOP per token (forward)", "flops", 1e-6),
    ]
    r, d = res["xla"], res["reference"]
    for label, key, mult in rows:
        if key is None:
            tr, td = a.tokens / r["fwd"], a.tokens / d["fwd"]
            print(f"| {label} | {tr:,.0f} | {td:,.0f} | {tr / td:.2f}x |")
            continue
        print(f"| {label} | {r[key] * mult:.1f} | {d[key] * mult:.1f} | {d[key] / r[key]:.2f}x |")


if __name__ == "__main__":
    main()
