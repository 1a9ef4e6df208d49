"""The momentum delta rule's eight sequence inputs at a shape ``(B, T, H, K, V)``: abstract
(``ShapeDtypeStruct``, for lowering and compiling without allocating) or random (for timing and
checking on a device).

The inputs are ``q, k`` [B, T, H, K], ``v`` [B, T, H, V], ``p`` [B, T, H, K] in the token dtype
and the four float32 gates ``log_alpha, log_mu, beta, eta`` [B, T, H]; the decode step takes one
token of each and the float32 state [2, B, H, K, V]. JAX is imported on use only, so that the
Triton compile stage (``triton_resources compile``) runs in a python without it.
"""

import argparse

DEFAULT_SHAPE = (8, 4096, 6, 128, 256)  # B, T, H, K, V: the benchmark shape


def parse_shape(text):
    """``"B,T,H,K,V"`` -> a tuple of five positive ints (an ``argparse`` type)."""
    try:
        vals = tuple(int(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected B,T,H,K,V integers, got {text!r}") from None
    if len(vals) != 5 or min(vals) < 1:
        raise argparse.ArgumentTypeError(f"expected five positive integers B,T,H,K,V: {text!r}")
    return vals


def abstract_inputs(shape, dtype):
    """(sequence inputs, decode-step inputs) as ``ShapeDtypeStruct``s for
    ``shape = (B, T, H, K, V)`` and token dtype ``dtype``."""
    import jax
    import jax.numpy as jnp

    b, t, h, kdim, vdim = shape
    dt, f32, sds = jnp.dtype(dtype), jnp.float32, jax.ShapeDtypeStruct
    seq = [sds((b, t, h, kdim), dt)] * 2 + [sds((b, t, h, vdim), dt), sds((b, t, h, kdim), dt)]
    seq += [sds((b, t, h), f32)] * 4
    one = [sds((b, h, kdim), dt)] * 2 + [sds((b, h, vdim), dt), sds((b, h, kdim), dt)]
    one += [sds((b, h), f32)] * 4 + [sds((2, b, h, kdim, vdim), f32)]
    return seq, one


def random_inputs(B, T, H, K, V, dtype, seed=0):
    """Random sequence inputs in the op's domain: unit-norm ``q, k``; ``p = alpha * k``;
    ``log_alpha, log_mu`` in (-inf, 0) scaled by 1/8 (slow decay); ``beta`` in (0, 0.5);
    ``eta`` in (0, 2). ``q, k, v, p`` in ``dtype``, the gates in float32."""
    import jax
    import jax.numpy as jnp

    ks = jax.random.split(jax.random.key(seed), 8)
    unit = lambda x: x / jnp.linalg.norm(x, axis=-1, keepdims=True)
    q = unit(jax.random.normal(ks[0], (B, T, H, K)))
    k = unit(jax.random.normal(ks[1], (B, T, H, K)))
    v = jax.random.normal(ks[2], (B, T, H, V))
    la = jax.nn.log_sigmoid(jax.random.normal(ks[3], (B, T, H))) / 8
    lm = jax.nn.log_sigmoid(jax.random.normal(ks[4], (B, T, H))) / 8
    p = jnp.exp(la)[..., None] * k
    beta = jax.nn.sigmoid(jax.random.normal(ks[5], (B, T, H))) * 0.5
    eta = jnp.tanh(jax.random.normal(ks[6], (B, T, H))) + 1.0
    toks = tuple(x.astype(dtype) for x in (q, k, v, p))
    return toks + (la, lm, beta, eta)
