"""Time one LatentMoE layer's grouped matmuls on a GPU: ``ragged_dot`` vs our Pallas ``gmm``.

One :class:`~jaxlib_ext.models.latent_moe.LatentMoE` layer at the Nemotron 3 Super shape
(arXiv 2601.18089; d = 4096, latent 1024, E = 512, top-22, expert width 2688, shared expert
5376, routed scaling 5) on 8192 tokens, bfloat16 parameters and activations, with
``method="xla"`` (``jax.lax.ragged_dot``, XLA's grouped matmul) and ``method="pallas"``
(``moe.gmm_pallas`` with its default ``GMMKernelConfig``). First a check: the Pallas layer's
output and input gradient against the XLA one (relative RMS, bfloat16 tolerance 2e-2). Then
medians after warm-up of forward and forward+backward (gradients of every parameter and the
input): ms, tokens/s and the matmul TFLOP/s of the routed experts and projections (forward:
``T (2 d E + 4 d l + 4 k l m + 4 d m_s)``; forward+backward counted as 3x).

    python -m benchmarks.kernels_moe_gpu           # GPU, the shape above
    python -m benchmarks.kernels_moe_gpu --cpu     # CPU, interpret mode, a tiny shape
    python -m benchmarks.kernels_moe_gpu --contrast    # also a standard MoE at matched FLOPs

``--contrast`` adds rows for a standard (non-latent) MoE with about the same routed FLOPs per
token (E = 128, top-6, expert width 2688 at d = 4096, the same shared expert), both methods.

Run from the repository root, as a module: the timing loop is ``jaxlib_ext.core.timing``'s. The
layer is the forward of ``LatentMoE`` (sigmoid top-k router, sort by expert, two grouped
matmuls with squared ReLU, weighted sum, up-projection, shared expert) written here as a pure
function of its parameters over ``moe.gmm``, so that the GPU image needs JAX only (no Flax);
``method="xla"`` is ``moe.gmm(method="xla")`` (``ragged_dot`` on a GPU), as in LatentMoE's
dispatch.
"""

from __future__ import annotations

import argparse
import functools
import sys

import jax
import jax.numpy as jnp
import numpy as np

from jaxlib_ext.core.timing import time_call
from jaxlib_ext.pallas_kernels.moe import gmm
from jaxlib_ext.pallas_kernels.moe.config import GMMKernelConfig

SUPER = dict(d=4096, latent=1024, experts=512, top_k=22, expert_dim=2688, shared=5376, tokens=8192)
STANDARD = dict(SUPER, latent=None, experts=128, top_k=6)
TINY = dict(d=64, latent=32, experts=8, top_k=2, expert_dim=48, shared=64, tokens=200)


def init_params(shape, dtype, seed=0):
    """Normal(0.02) parameters of one layer (``latent=None``: a standard MoE)."""
    d, e, m, ms = shape["d"], shape["experts"], shape["expert_dim"], shape["shared"]
    width = shape["latent"] or d
    dims = dict(router=(d, e), w1=(e, width, m), w2=(e, m, width), shared_w1=(d, ms),
                shared_w2=(ms, d))  # fmt: skip
    if shape["latent"]:
        dims.update(down=(d, width), up=(width, d))
    keys = jax.random.split(jax.random.key(seed), len(dims))
    return {
        n: (0.02 * jax.random.normal(k, s, jnp.float32)).astype(dtype)
        for k, (n, s) in zip(keys, sorted(dims.items()), strict=True)
    }


def layer_forward(params, x, *, top_k, method, config):
    """LatentMoE's forward (``models/latent_moe.py``), routed scaling 5, normalised weights."""
    t = x.shape[0]
    scores = jax.nn.sigmoid(jnp.dot(x.astype(jnp.float32), params["router"].astype(jnp.float32)))
    _, experts = jax.lax.top_k(scores, top_k)
    weights = jnp.take_along_axis(scores, experts, axis=-1)
    weights = 5.0 * weights / (jnp.sum(weights, axis=-1, keepdims=True) + 1e-20)
    z = jnp.dot(x, params["down"]) if "down" in params else x
    flat = experts.reshape(-1)
    order = jnp.argsort(flat, stable=True)
    inverse = jnp.zeros_like(order).at[order].set(jnp.arange(order.shape[0], dtype=order.dtype))
    sizes = jnp.zeros((params["w1"].shape[0],), jnp.int32).at[flat].add(1)
    rows = jnp.take(z, order // top_k, axis=0)
    h = jnp.square(jax.nn.relu(gmm(rows, params["w1"], sizes, method=method, config=config)))
    y = gmm(h, params["w2"], sizes, method=method, config=config)
    y = y * weights.reshape(-1)[order][:, None].astype(y.dtype)
    y = jnp.sum(jnp.take(y, inverse, axis=0).reshape(t, top_k, -1), axis=1)
    y = jnp.dot(y, params["up"]) if "up" in params else y
    shared = jnp.square(jax.nn.relu(jnp.dot(x, params["shared_w1"])))
    return y + jnp.dot(shared, params["shared_w2"])


def layer_fns(shape, method, dtype, interpret):
    params = init_params(shape, dtype)
    config = GMMKernelConfig(interpret=interpret) if method == "pallas" else None
    forward = functools.partial(layer_forward, top_k=shape["top_k"], method=method, config=config)

    def loss(params, x):
        return jnp.sum(forward(params, x).astype(jnp.float32))

    return params, jax.jit(forward), jax.jit(jax.grad(loss, argnums=(0, 1)))


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
    fns = {m: layer_fns(shape, m, dtype, a.cpu) for m in ("xla", "pallas")}
    shapes = {m: shape for m in fns}
    p, fwd, grad = fns["xla"]
    y_ref, (gp_ref, gx_ref) = fwd(p, x), grad(p, x)
    _, fwd2, grad2 = fns["pallas"]
    y, (gp, gx) = fwd2(p, x), grad2(p, x)
    errs = {"output": rel_rmse(y, y_ref), "d x": rel_rmse(gx, gx_ref)}
    errs.update({f"d {k}": rel_rmse(gp[k], gp_ref[k]) for k in ("w1", "w2")})
    tol = 1e-4 if a.cpu else 2e-2
    ok = all(e < tol for e in errs.values())
    print("check pallas vs xla (rel RMS): "
          + ", ".join(f"{k} {v:.2e}" for k, v in errs.items())
          + f" -> {'OK' if ok else 'FAILED'} (tol {tol})\n", flush=True)  # fmt: skip

    print("| path | forward ms | forward tokens/s | forward TFLOP/s "
          "| fwd+bwd ms | fwd+bwd tokens/s | fwd+bwd TFLOP/s |")  # fmt: skip
    print("|---|---:|---:|---:|---:|---:|---:|")
    if a.contrast:
        std = dict(STANDARD, tokens=shape["tokens"]) if not a.cpu else dict(TINY, latent=None)
        for m in ("xla", "pallas"):
            fns[f"standard MoE, {m}"] = layer_fns(std, m, dtype, a.cpu)
            shapes[f"standard MoE, {m}"] = std
    for method, (params, fwd, grad) in fns.items():
        flops = flops_forward(shapes[method])
        tf = time_call(fwd, params, x, warmup=a.warmup, repeats=a.iters).median
        tb = time_call(grad, params, x, warmup=a.warmup, repeats=a.iters).median
        t = shape["tokens"]
        print(
            f"| {method} | {tf * 1e3:.2f} | {t / tf:,.0f} | {flops / tf / 1e12:.1f} "
            f"| {tb * 1e3:.2f} | {t / tb:,.0f} | {3 * flops / tb / 1e12:.1f} |",
            flush=True,
        )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
