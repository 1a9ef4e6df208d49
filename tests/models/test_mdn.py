"""Momentum DeltaNet (jaxlib_ext.models.mdn): the layer against a float64 NumPy derivation of
arXiv 2605.05838 (explicit arctan/sin/cos, a Python loop recurrence), the 2x2 stability system
for gates drawn from the layer's parameterisation, bounded states over 10,000 steps, inits and
presets. The contract MDN shares with GDN (jit, grad, caches, decode) is in test_delta_lm.py.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxlib_ext.models import (
    DELTANET_PRESETS,
    LanguageModel,
    MDNGates,
    MomentumDeltaNet,
    build_mdn,
    l2_normalize,
    mdn_gates,
    momentum_eigenvalues,
    momentum_transition_matrix,
    param_count,
    preset_param_count,
)
from jaxlib_ext.pallas_kernels.mdn import momentum_delta_rule

# --------------------------------------------------------------------------- layer vs NumPy


def _np_layer(layer: MomentumDeltaNet, x: np.ndarray, np_mixer_io) -> np.ndarray:
    """The MDN layer written out in float64 NumPy with explicit arctan, sin and cos."""
    P, qkv, output = np_mixer_io
    c = layer.cfg
    K = c.head_dim
    x = x.astype(np.float64)
    q, k, v = qkv(layer, x)
    B, T, H, V = v.shape
    a, b = x @ P(layer.a_proj.kernel), x @ P(layer.b_proj.kernel)
    m, e = x @ P(layer.m_proj.kernel), x @ P(layer.e_proj.kernel)
    softplus = lambda z: np.log1p(np.exp(z))  # noqa: E731
    log_alpha_hat = -np.exp(P(layer.A_log)) * softplus(a + P(layer.dt_bias))
    log_mu = np.maximum(-np.exp(P(layer.Mu_log)) * softplus(m + P(layer.mu_bias)), c.min_log_mu)
    eta = np.tanh(e / np.sqrt(c.d_model / c.tau_factor)) + 1
    theta = np.arctan(eta * np.exp(P(layer.log_factor)))
    beta = np.sin(theta) ** 2 / (1 + np.exp(-b))
    alpha = np.cos(theta) ** 2 * np.exp(log_alpha_hat)
    mu = np.exp(log_mu)
    q = q - np.exp(P(layer.D_log))[:, None] * k  # output correction on the raw conv outputs
    q = q / np.sqrt((q**2).sum(-1, keepdims=True) + 1e-6)
    k = k / np.sqrt((k**2).sum(-1, keepdims=True) + 1e-6)
    S = np.zeros((B, H, K, V))
    M = np.zeros((B, H, K, V))
    o = np.zeros((B, T, H, V))
    for t in range(T):
        kt = eta[:, t, :, None] * k[:, t]  # k <- eta k_hat
        pt = alpha[:, t, :, None] * k[:, t]  # p <- alpha k_hat
        w = np.einsum("bhkv,bhk->bhv", S, pt) - v[:, t]
        M = mu[:, t, :, None, None] * M + kt[..., None] * w[..., None, :]
        S = alpha[:, t, :, None, None] * S - beta[:, t, :, None, None] * M
        o[:, t] = np.einsum("bhkv,bhk->bhv", S, q[:, t] * K**-0.5)
    return output(layer, x, o, lambda g: 1 / (1 + np.exp(-g)))


@pytest.mark.parametrize("method", ["reference", "xla"])
def test_mdn_layer_matches_numpy_derivation(method, small_cfg, perturb, rel, np_mixer_io):
    cfg = dataclasses.replace(small_cfg, method=method)
    layer = MomentumDeltaNet(cfg, rngs=nnx.Rngs(3))
    perturb(layer, jax.random.key(4))
    x = jax.random.normal(jax.random.key(5), (2, 19, cfg.d_model))
    y, cache = layer(x)
    assert cache is None and y.shape == x.shape and y.dtype == jnp.float32
    assert rel(y, _np_layer(layer, np.asarray(x), np_mixer_io)) < 1e-5


# --------------------------------------------------------------------------- stability


def _random_gate_draws(cfg, key, n_layers=4, h=128, n_tokens=256):
    """Gates from the layer's parameterisation: ``n_layers`` layers of ``h`` heads each (so
    ``n_layers * h`` independent draws of the paper's inits), with a training-like random drift
    of the gate parameters, on raw projections ``N(0, 2^2)`` and through the layer itself."""
    gates = []
    for i, k_ in enumerate(jax.random.split(key, n_layers)):
        cfg_i = dataclasses.replace(cfg, n_heads=h, head_dim=2, expand_v=1,
                                    tau_factor=[1.0, 8.0][i % 2], min_log_mu=[-2.0, -1.0][i % 2])
        layer = MomentumDeltaNet(cfg_i, rngs=nnx.Rngs(i))
        k1, k2, k3 = jax.random.split(k_, 3)
        names = ("A_log", "Mu_log", "dt_bias", "mu_bias", "log_factor")
        params = {n: getattr(layer, n)[...] + 0.5 * jax.random.normal(kk, (h,))
                  for n, kk in zip(names, jax.random.split(k1, 5), strict=True)}
        a, b, m, e = 2.0 * jax.random.normal(k2, (4, n_tokens, h))
        e = e * cfg_i.tau  # tanh(e / tau) covers the whole of (0, 2)
        gates.append(mdn_gates(a, b, m, e, tau=cfg_i.tau, min_log_mu=cfg_i.min_log_mu, **params))
        x = 3.0 * jax.random.normal(k3, (1, n_tokens, cfg_i.d_model))
        gates.append(layer.gates(x))
    return MDNGates(*(jnp.concatenate([g[j].reshape(-1) for g in gates]) for j in range(4)))


def test_gate_ranges_and_spectral_radius_below_one(small_cfg):
    g = _random_gate_draws(small_cfg, jax.random.key(0))
    assert g.beta.size > 200_000
    assert bool(jnp.all(g.beta >= 0)) and bool(jnp.all(g.beta <= 1))
    assert bool(jnp.all((g.eta >= 0) & (g.eta <= 2)))  # (0, 2), closed by float32 rounding
    assert bool(jnp.all(g.log_alpha < 0)) and bool(jnp.all(g.log_mu >= -2.0))
    with jax.enable_x64(True):
        g64 = jax.tree.map(lambda z: jnp.asarray(np.asarray(z, np.float64)), g)
        alpha, mu = np.exp(np.asarray(g64.log_alpha)), np.exp(np.asarray(g64.log_mu))
        lam = np.asarray(momentum_eigenvalues(*g64))
        mats = np.asarray(momentum_transition_matrix(*g64))
    radius = np.abs(lam).max(-1)
    assert radius.max() < 1.0, radius.max()
    # closed form == numerical eigenvalues
    lam_np = np.linalg.eigvals(mats)
    np.testing.assert_allclose(np.sort(np.abs(lam_np), -1), np.sort(np.abs(lam), -1), atol=1e-9)
    # complex pair: |lambda| = sqrt(alpha mu)
    cplx = np.abs(lam[:, 0].imag) > 0
    assert cplx.sum() > 100 and (~cplx).sum() > 100  # both regimes are exercised
    modulus = np.broadcast_to(np.sqrt(alpha * mu)[cplx, None], (int(cplx.sum()), 2))
    np.testing.assert_allclose(np.abs(lam[cplx]), modulus, rtol=1e-12)
    # the theta constraint: alpha * beta * eta <= eta / 4 < 1/2
    assert float(np.max(alpha * np.asarray(g64.beta) * np.asarray(g64.eta))) <= 0.5


def test_states_bounded_over_10k_steps(small_cfg):
    T, H, K, V = 10_000, 4, 8, 8
    key = jax.random.key(11)
    k1, k2, k3, k4 = jax.random.split(key, 4)
    layer = MomentumDeltaNet(dataclasses.replace(small_cfg, n_heads=H), rngs=nnx.Rngs(5))
    a, b, m, e = 2.0 * jax.random.normal(k1, (4, 1, T, H))
    # push some heads towards slow decays and large eta, where the momentum matters most
    m = m - jnp.array([0.0, 4.0, 8.0, 8.0])
    a = a - jnp.array([0.0, 4.0, 8.0, 0.0])
    e = e * layer.cfg.tau + jnp.array([0.0, 0.0, 1.0, 2.0]) * layer.cfg.tau
    g = mdn_gates(a, b, m, e, A_log=layer.A_log[...], Mu_log=layer.Mu_log[...],
                  dt_bias=layer.dt_bias[...], mu_bias=layer.mu_bias[...],
                  log_factor=layer.log_factor[...], tau=layer.cfg.tau,
                  min_log_mu=layer.cfg.min_log_mu)
    k_hat = l2_normalize(jax.random.normal(k2, (1, T, H, K)))
    q_hat = l2_normalize(jax.random.normal(k3, (1, T, H, K)))
    v = jax.random.normal(k4, (1, T, H, V))
    p = jnp.exp(g.log_alpha)[..., None] * k_hat
    o, state = momentum_delta_rule(q_hat, k_hat, v, p, *g, output_final_state=True,
                                   method="reference")
    assert bool(jnp.all(jnp.isfinite(o))) and bool(jnp.all(jnp.isfinite(state)))
    # a bounded input gives a bounded output: |o| stays of the order of |v|
    assert float(jnp.max(jnp.abs(o))) < 50.0
    assert float(jnp.max(jnp.linalg.norm(state.reshape(2, H, -1), axis=-1))) < 500.0
    # no drift: the second half is not larger than the first
    half = T // 2
    assert float(jnp.max(jnp.abs(o[:, half:]))) < 3.0 * float(jnp.max(jnp.abs(o[:, :half]))) + 1


# --------------------------------------------------------------------------- inits, presets


def test_inits_and_metadata(small_cfg):
    layer = MomentumDeltaNet(dataclasses.replace(small_cfg, n_heads=64), rngs=nnx.Rngs(0))
    np.testing.assert_array_equal(layer.mu_bias[...], layer.dt_bias[...])
    dt = jax.nn.softplus(layer.dt_bias[...])
    assert bool(jnp.all((dt >= 1e-3 * 0.999) & (dt <= 0.1 * 1.001)))
    for name, hi in (("A_log", 16.0), ("Mu_log", 16.0), ("log_factor", 4.0), ("D_log", 1.0)):
        val = jnp.exp(getattr(layer, name)[...])
        assert bool(jnp.all((val > 0) & (val <= hi))), name
        assert float(val.max()) > 0.5 * hi  # really spread over (0, hi]
        assert getattr(layer, name).weight_decay is False
    assert float(jnp.std(layer.q_proj.kernel[...])) == pytest.approx(0.02, rel=0.1)


def test_presets_param_counts_and_shapes():
    abstract = nnx.eval_shape(lambda: build_mdn("400m", rngs=nnx.Rngs(0)))
    n400 = param_count(abstract)
    assert n400 == 417_537_012  # the preset's own vocabulary (GPT-2, 50257)
    assert 1.3e9 < preset_param_count(build_mdn, "1.3b") < 1.6e9
    c = DELTANET_PRESETS["400m"]
    assert (c.d_model, c.n_layers, c.n_heads, c.head_dim, c.value_dim) == (1024, 21, 6, 128, 256)
    assert c.tau == 32.0 and c.min_log_mu == -2.0 and c.hidden == 2816 and c.vocab_size == 50257
    c = DELTANET_PRESETS["1.3b"]
    assert (c.d_model, c.head_dim, c.value_dim, c.tau, c.min_log_mu) == (2048, 256, 512, 16.0, -1.0)
    attn = abstract.blocks[0].attn
    assert attn.q_proj.kernel.shape == (1024, 768) and attn.v_proj.kernel.shape == (1024, 1536)
    assert attn.o_proj.kernel.shape == (1536, 1024) and attn.q_conv.weight.shape == (4, 768)
    assert abstract.blocks[0].mlp.gate.kernel.shape == (1024, 2816)
    tiny = nnx.eval_shape(lambda: build_mdn("tiny", rngs=nnx.Rngs(0)))
    assert tiny.max_seq_len == 256 and isinstance(tiny, LanguageModel)
    assert tiny.cfg.mixer_name == "mdn"
    assert tiny.cfg.vocab_size == 256
    assert param_count(tiny) == preset_param_count(build_mdn, "tiny")


def test_bad_config():
    with pytest.raises(ValueError, match="tau_factor"):
        dataclasses.replace(DELTANET_PRESETS["tiny"], tau_factor=0.0)
    with pytest.raises(ValueError, match="chunk_size"):
        dataclasses.replace(DELTANET_PRESETS["tiny"], chunk_size=48)
    with pytest.raises(ValueError, match="method"):
        build_mdn("tiny", rngs=nnx.Rngs(0), method="fast")
