"""Gated DeltaNet (jaxlib_ext.models.gdn): the layer against a float64 NumPy derivation of the
gated delta rule (arXiv 2412.06464, a Python loop recurrence), its gates, presets. The contract
GDN shares with MDN (jit, grad, caches, decode) is in test_delta_lm.py.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxlib_ext.models import (
    GatedDeltaNet,
    LanguageModel,
    build_gdn,
    build_mdn,
    gdn_gates,
    param_count,
    preset_param_count,
)


def _np_layer(layer: GatedDeltaNet, x: np.ndarray, np_mixer_io) -> np.ndarray:
    P, qkv, output = np_mixer_io
    K = layer.cfg.head_dim
    x = x.astype(np.float64)
    q, k, v = qkv(layer, x)
    B, T, H, V = v.shape
    a, b = x @ P(layer.a_proj.kernel), x @ P(layer.b_proj.kernel)
    alpha = np.exp(-np.exp(P(layer.A_log)) * np.log1p(np.exp(a + P(layer.dt_bias))))
    beta = 1 / (1 + np.exp(-b))
    q = q / np.sqrt((q**2).sum(-1, keepdims=True) + 1e-6)
    k = k / np.sqrt((k**2).sum(-1, keepdims=True) + 1e-6)
    S = np.zeros((B, H, K, V))
    o = np.zeros((B, T, H, V))
    for t in range(T):
        S = alpha[:, t, :, None, None] * S  # decay first, then the delta-rule write
        u = v[:, t] - np.einsum("bhkv,bhk->bhv", S, k[:, t])
        S = S + beta[:, t, :, None, None] * k[:, t, :, :, None] * u[:, :, None, :]
        o[:, t] = np.einsum("bhkv,bhk->bhv", S, q[:, t] * K**-0.5)
    return output(layer, x, o, lambda g: g / (1 + np.exp(-g)))  # SiLU output gate


@pytest.mark.parametrize("method", ["reference", "xla"])
def test_gdn_layer_matches_numpy_derivation(method, small_cfg, perturb, rel, np_mixer_io):
    cfg = dataclasses.replace(small_cfg, method=method)
    layer = GatedDeltaNet(cfg, rngs=nnx.Rngs(3))
    perturb(layer, jax.random.key(4))
    x = jax.random.normal(jax.random.key(5), (2, 19, cfg.d_model))
    y, cache = layer(x)
    assert cache is None and y.shape == x.shape and y.dtype == jnp.float32
    assert rel(y, _np_layer(layer, np.asarray(x), np_mixer_io)) < 1e-5


def test_gdn_gates_ranges():
    a, b = 3.0 * jax.random.normal(jax.random.key(0), (2, 64, 4))
    g, beta = gdn_gates(a, b, A_log=jnp.log(jnp.arange(1.0, 5.0)), dt_bias=jnp.zeros(4))
    assert g.dtype == beta.dtype == jnp.float32 and g.shape == beta.shape == (64, 4)
    assert bool(jnp.all(g < 0)) and bool(jnp.all((beta > 0) & (beta < 1)))


def test_presets_param_counts():
    g400 = preset_param_count(build_gdn, "400m")
    n400 = 417_537_012  # preset_param_count(build_mdn, "400m"), checked in test_mdn.py
    assert 0.99 * n400 < g400 < n400  # GDN lacks m/e projections and three gate vectors
    tiny = nnx.eval_shape(lambda: build_gdn("tiny", rngs=nnx.Rngs(0)))
    assert isinstance(tiny, LanguageModel) and tiny.cfg.mixer_name == "gdn"
    assert tiny.cfg.vocab_size == 256
    assert param_count(tiny) < preset_param_count(build_mdn, "tiny")
