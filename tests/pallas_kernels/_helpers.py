"""Helpers shared by the kernel tests: the error measure and random inputs of both ops.

Imported as ``tests.pallas_kernels._helpers`` (pytest's importlib mode names test modules from
the root directory, so sibling modules import by that name).
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np


def rel_rmse(out, ref) -> float:
    """Relative RMS error ``||out - ref|| / ||ref||`` in float64 (``||out - ref||`` when
    ``ref`` is zero)."""
    out = np.asarray(out).astype(np.float64)
    ref = np.asarray(ref).astype(np.float64)
    num = float(np.sqrt(np.mean((out - ref) ** 2)))
    den = float(np.sqrt(np.mean(ref**2)))
    return num if den == 0.0 else num / den


def mdn_inputs(seed, B, T, H, K, V, dtype=jnp.float32, with_state=True):
    """Random inputs of the momentum delta rule: ``((q, k, v, p, log_alpha, log_mu, beta, eta),
    initial_state)``, L2-normalised keys, ``p`` scaled by ``alpha``, gates in the ranges of a
    trained layer; the token arrays in ``dtype``, the gates and the state float32.

    Drawn with NumPy and cast on the host (no per-shape XLA compilation of the samplers)."""
    rng = np.random.default_rng(seed)

    def normal(shape):
        return rng.standard_normal(shape, dtype=np.float32)

    def unit(x):
        return x / np.linalg.norm(x, axis=-1, keepdims=True)

    def log_sigmoid(x):
        return -np.logaddexp(np.float32(0.0), -x)

    q = normal((B, T, H, K))
    k = unit(normal((B, T, H, K)))
    v = normal((B, T, H, V))
    la = log_sigmoid(rng.uniform(size=(B, T, H)).astype(np.float32)) / 2
    lm = log_sigmoid(rng.uniform(size=(B, T, H)).astype(np.float32)) / 2
    p = np.exp(la)[..., None] * unit(normal((B, T, H, K)))
    beta = 0.5 / (1.0 + np.exp(-normal((B, T, H))))
    eta = normal((B, T, H))
    s0 = jnp.asarray(0.5 * normal((2, B, H, K, V))) if with_state else None
    toks = tuple(jnp.asarray(x.astype(dtype)) for x in (q, k, v, p))
    gates = tuple(jnp.asarray(x.astype(np.float32)) for x in (la, lm, beta, eta))
    return toks + gates, s0


def gdn_inputs(seed, dtype, *, b, t, h, kd, vd):
    """Random inputs of the gated delta rule as a dict ``q, k, v, g, beta`` and the initial
    state ``[B, H, K, V]``: fla-style gates ``g = logsigmoid(U) / 0.8``, ``beta = sigmoid(N)``,
    L2-normalised ``q`` and ``k``."""
    rng = np.random.default_rng(seed)

    def unit(shape):
        x = rng.standard_normal(shape)
        return x / np.linalg.norm(x, axis=-1, keepdims=True)

    x = dict(
        q=unit((b, t, h, kd)),
        k=unit((b, t, h, kd)),
        v=rng.standard_normal((b, t, h, vd)),
        g=-np.logaddexp(0.0, -rng.uniform(size=(b, t, h))) / 0.8,
        beta=1.0 / (1.0 + np.exp(-rng.standard_normal((b, t, h)))),
    )
    s0 = 0.5 * rng.standard_normal((b, h, kd, vd))
    return {n: jnp.asarray(a, dtype) for n, a in x.items()}, jnp.asarray(s0, dtype)
