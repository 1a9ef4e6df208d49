"""Time one LatentMoE layer's grouped matmuls on a GPU: ``ragged_dot`` vs our Pallas ``gmm``.

One :class:`~jaxlib_ext.models.latent_moe.LatentMoE` layer at the Nemotron 3 Super shape
(arXiv 2601.18089; d = 4096, latent 1024, E = 512, top-22, expert width 2688, shared expert
5376, routed scaling 5) on 8192 tokens, bfloat16 parameters and activations, with
``method="ragged"`` (``jax.lax.ragged_dot``, XLA's grouped matmul) and ``method="pallas"``
(``moe.gmm_pallas`` with its default ``GMMKernelConfig``). First a check: the Pallas layer's
output and input gradient against the ragged one (relative RMS, bfloat16 tolerance 2e-2). Then
medians after warm-up of forward and forward+backward (gradients of every parameter and the
input): ms, tokens/s and the matmul TFLOP/s of the routed experts and projections (forward:
``T (2 d E + 4 d l + 4 k l m + 4 d m_s)``; forward+backward counted as 3x).

    python -m benchmarks.kernels_moe_gpu           # GPU, the shape above
    python -m benchmarks.kernels_moe_gpu --cpu     # CPU, interpret mode, a tiny shape
    python -m benchmarks.kernels_moe_gpu --contrast    # also a standard MoE at matched FLOPs

``--contrast`` adds rows for a standard (non-latent) MoE with about the same routed FLOPs per
token (E = 128, top-6, expert width 2688 at d = 4096, the same shared expert), both methods.

Run from the repository root, as a module: the timing loop is ``tools.kernel_audit``'s.
"""

from __future__ import annotations

import argparse
import sys

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxlib_ext.models.latent_moe import LatentMoE
from jaxlib_ext.pallas_kernels.moe.config import GMMKernelConfig
from tools.kernel_audit.tuning import median_time

SUPER = dict(d=4096, latent=1024, experts=512, top_k=22, expert_dim=2688, shared=5376, tokens=8192)
STANDARD = dict(SUPER, latent=None, experts=128, top_k=6)
TINY = dict(d=64, latent=32, experts=8, top_k=2, expert_dim=48, shared=64, tokens=200)


def layer_fns(shape, method, dtype, interpret):
    layer = LatentMoE(
        shape["d"], num_experts=shape["experts"], top_k=shape["top_k"],
        expert_dim=shape["expert_dim"], latent_dim=shape["latent"],
        shared_expert_dim=shape["shared"], routed_scaling=5.0, method=method,
        gmm_config=GMMKernelConfig(interpret=interpret), param_dtype=dtype, rngs=nnx.Rngs(0),
    )  # fmt: skip
    graphdef, params, rest = nnx.split(layer, nnx.Param, ...)

    def forward(params, rest, x):
        return nnx.merge(graphdef, params, rest)(x)[0]

    def loss(params, rest, x):
        return jnp.sum(forward(params, rest, x).astype(jnp.float32))

    return (params, rest), jax.jit(forward), jax.jit(jax.grad(loss, argnums=(0, 2)))


def rel_rmse(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.sqrt(np.mean((a - b) ** 2)) / max(np.sqrt(np.mean(b**2)), 1e-30))


def flops_forward(s):
    width = s["latent"] or s["d"]
    per_token = 2 * s["d"] * s["experts"] + (4 * s["d"] * s["latent"] if s["latent"] else 0)
    per_token += 4 * s["top_k"] * width * s["expert_dim"] + 4 * s["d"] * s["shared"]
    return s["tokens"] * per_token


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cpu", action="store_true", help="interpret mode, a tiny shape")
    ap.add_argument("--tokens", type=int, default=None)
    ap.add_argument("--contrast", action="store_true", help="also a standard MoE, matched FLOPs")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--iters", type=int, default=5)
    a = ap.parse_args(argv)
    shape = dict(TINY if a.cpu else SUPER)
    if a.tokens:
        shape["tokens"] = a.tokens
    dtype = jnp.float32 if a.cpu else jnp.bfloat16
    x = jax.random.normal(jax.random.key(1), (shape["tokens"], shape["d"]), jnp.float32)
    x = x.astype(dtype)
    print(
        f"LatentMoE layer {shape}, {jnp.dtype(dtype).name}, backend={jax.default_backend()}, "
        f"{jax.devices()[0].device_kind}, jax {jax.__version__}\n",
        flush=True,
    )
    fns = {m: layer_fns(shape, m, dtype, a.cpu) for m in ("ragged", "pallas")}
    shapes = {m: shape for m in fns}
    (p, r), fwd, grad = fns["ragged"]
    y_ref, (gp_ref, gx_ref) = fwd(p, r, x), grad(p, r, x)
    (p2, r2), fwd2, grad2 = fns["pallas"]
    y, (gp, gx) = fwd2(p2, r2, x), grad2(p2, r2, x)
    errs = {"output": rel_rmse(y, y_ref), "d x": rel_rmse(gx, gx_ref)}
    errs.update({f"d {k}": rel_rmse(gp[k][...], gp_ref[k][...]) for k in ("w1", "w2")})
    tol = 1e-4 if a.cpu else 2e-2
    ok = all(e < tol for e in errs.values())
    print("check pallas vs ragged (rel RMS): "
          + ", ".join(f"{k} {v:.2e}" for k, v in errs.items())
          + f" -> {'OK' if ok else 'FAILED'} (tol {tol})\n", flush=True)  # fmt: skip

    print("| path | forward ms | forward tokens/s | forward TFLOP/s "
          "| fwd+bwd ms | fwd+bwd tokens/s | fwd+bwd TFLOP/s |")  # fmt: skip
    print("|---|---:|---:|---:|---:|---:|---:|")
    if a.contrast:
        std = dict(STANDARD, tokens=shape["tokens"]) if not a.cpu else dict(TINY, latent=None)
        for m in ("ragged", "pallas"):
            fns[f"standard MoE, {m}"] = layer_fns(std, m, dtype, a.cpu)
            shapes[f"standard MoE, {m}"] = std
    for method, ((params, rest), fwd, grad) in fns.items():
        flops = flops_forward(shapes[method])
        tf = median_time(fwd, (params, rest, x), a.warmup, a.iters)
        tb = median_time(grad, (params, rest, x), a.warmup, a.iters)
        t = shape["tokens"]
        print(
            f"| {method} | {tf * 1e3:.2f} | {t / tf:,.0f} | {flops / tf / 1e12:.1f} "
            f"| {tb * 1e3:.2f} | {t / tb:,.0f} | {3 * flops / tb / 1e12:.1f} |",
            flush=True,
        )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
