"""Helpers shared by the kernel tests: the error measure and random inputs of both ops.

Imported as ``tests.pallas_kernels._helpers`` (pytest's importlib mode names test modules from
the root directory, so sibling modules import by that name).
"""

from __future__ import annotations

import jax
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
    trained layer; the token arrays in ``dtype``, the gates and the state float32."""
    ks = jax.random.split(jax.random.key(seed), 10)
    normal = lambda i, s: jax.random.normal(ks[i], s, jnp.float32)
    unit = lambda x: x / jnp.linalg.norm(x, axis=-1, keepdims=True)
    q = normal(0, (B, T, H, K))
    k = unit(normal(1, (B, T, H, K)))
    v = normal(2, (B, T, H, V))
    la = jax.nn.log_sigmoid(jax.random.uniform(ks[4], (B, T, H))) / 2
    lm = jax.nn.log_sigmoid(jax.random.uniform(ks[5], (B, T, H))) / 2
    p = jnp.exp(la)[..., None] * unit(normal(3, (B, T, H, K)))
    beta = jax.nn.sigmoid(normal(6, (B, T, H))) * 0.5
    eta = normal(7, (B, T, H))
    s0 = 0.5 * normal(8, (2, B, H, K, V)) if with_state else None
    toks = tuple(x.astype(dtype) for x in (q, k, v, p))
    return toks + (la, lm, beta, eta), s0


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
