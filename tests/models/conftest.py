"""Shared pieces of the delta-rule model tests: a small config and two helpers as fixtures."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxlib_ext.models import DeltaNetConfig


@pytest.fixture(scope="session")
def small_cfg() -> DeltaNetConfig:
    """Two layers of two heads, K = 8, V = 16, chunk 16: every code path at a tiny size."""
    return DeltaNetConfig(
        vocab_size=61, d_model=32, n_layers=2, n_heads=2, head_dim=8, expand_v=2,
        mlp_multiple_of=16, max_seq_len=64, chunk_size=16, tau_factor=2.0, min_log_mu=-2.0,
    )


def _rel(out, ref) -> float:
    """Relative Frobenius error ``||out - ref|| / ||ref||`` in float64."""
    out, ref = np.asarray(out, np.float64), np.asarray(ref, np.float64)
    return float(np.linalg.norm(out - ref) / np.linalg.norm(ref))


def _perturb(module, key, scale=0.3):
    """Move every parameter away from its init so that no term is accidentally ~0 or ~1."""
    params = nnx.state(module, nnx.Param)
    leaves, treedef = jax.tree.flatten(params)
    keys = jax.random.split(key, len(leaves))
    new = [p + scale * jax.random.normal(k_, p.shape) * (jnp.std(p) + 0.1)
           for p, k_ in zip(leaves, keys, strict=True)]
    nnx.update(module, jax.tree.unflatten(treedef, new))


@pytest.fixture(scope="session")
def rel():
    return _rel


@pytest.fixture(scope="session")
def perturb():
    return _perturb


def np_conv_silu(z, w):
    """Causal depthwise conv of ``z [B, T, C]`` with taps ``w [W, C]`` then SiLU, float64."""
    b, t, _ = z.shape
    zp = np.concatenate([np.zeros((b, w.shape[0] - 1, z.shape[-1])), z], 1)
    y = sum(w[i] * zp[:, i : i + t] for i in range(w.shape[0]))
    return y / (1 + np.exp(-y))


@pytest.fixture(scope="session")
def np_mixer_io():
    """``(qkv, output)`` of a delta mixer in float64 NumPy: the shared conv inputs and the gated
    head norm with output projection (``act`` given)."""

    def param(v):
        return np.asarray(v[...], np.float64)

    def qkv(layer, x):
        c = layer.cfg
        B, T, _ = x.shape
        q = np_conv_silu(x @ param(layer.q_proj.kernel), param(layer.q_conv.weight))
        k = np_conv_silu(x @ param(layer.k_proj.kernel), param(layer.k_conv.weight))
        v = np_conv_silu(x @ param(layer.v_proj.kernel), param(layer.v_conv.weight))
        return (q.reshape(B, T, c.n_heads, c.head_dim), k.reshape(B, T, c.n_heads, c.head_dim),
                v.reshape(B, T, c.n_heads, c.value_dim))

    def output(layer, x, o, act):
        c = layer.cfg
        B, T, H, V = o.shape
        o = o / np.sqrt((o**2).mean(-1, keepdims=True) + c.norm_eps) * param(layer.o_norm.scale)
        g = (x @ param(layer.g_proj.kernel)).reshape(B, T, H, V)
        return (o * act(g)).reshape(B, T, H * V) @ param(layer.o_proj.kernel)

    return param, qkv, output
