"""Momentum DeltaNet / Gated DeltaNet layers and LMs (jaxlib_ext.models.mdn).

Checks: the short conv against a direct sum and in pieces; the whole MDN layer against a float64
NumPy re-derivation of notes section 1.3 (explicit arctan/sin/cos, a Python loop recurrence);
token-by-token decode == full forward; the 2x2 stability system for gates drawn from the layer's
parameterisation; bounded states over T = 10,000 steps; inits, metadata, presets, bad inputs.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxlib_ext.models import mdn
from jaxlib_ext.models.short_conv import ShortConvolution, causal_depthwise_conv
from jaxlib_ext.pallas_kernels.mdn import momentum_delta_rule

SMALL = mdn.DeltaNetConfig(
    vocab_size=61, d_model=32, n_layers=2, n_heads=2, head_dim=8, expand_v=2, mlp_multiple_of=16,
    max_seq_len=64, chunk_size=16, tau_factor=2.0, min_log_mu=-2.0,
)


def rel(out, ref):
    out, ref = np.asarray(out, np.float64), np.asarray(ref, np.float64)
    return float(np.linalg.norm(out - ref) / np.linalg.norm(ref))


# --------------------------------------------------------------------------- short conv


def test_short_conv_direct_sum_and_pieces():
    rng = np.random.default_rng(0)
    b, t, c, w = 2, 11, 5, 4
    x = rng.normal(size=(b, t, c)).astype(np.float32)
    wt = rng.normal(size=(w, c)).astype(np.float32)
    y, state = causal_depthwise_conv(jnp.asarray(x), jnp.asarray(wt), activation=None)
    xp = np.concatenate([np.zeros((b, w - 1, c), np.float32), x], 1)
    ref = np.stack([sum(wt[i] * xp[:, s + i] for i in range(w)) for s in range(t)], 1)
    np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(state, x[:, -(w - 1) :])
    # in pieces with the carried state (including pieces shorter than W - 1)
    outs, st = [], None
    for lo, hi in ((0, 2), (2, 3), (3, 9), (9, 11)):
        yi, st = causal_depthwise_conv(jnp.asarray(x[:, lo:hi]), jnp.asarray(wt), st,
                                       activation="silu")
        outs.append(yi)
    np.testing.assert_allclose(np.concatenate(outs, 1), jax.nn.silu(ref), rtol=1e-5, atol=1e-6)
    mod = ShortConvolution(c, w, rngs=nnx.Rngs(0))
    assert mod.weight.logical_axes == (None, "heads")
    assert mod.init_state(3).shape == (3, w - 1, c)
    with pytest.raises(ValueError, match="weight"):
        causal_depthwise_conv(jnp.asarray(x), jnp.ones((w, c + 1)))
    with pytest.raises(ValueError, match="state"):
        causal_depthwise_conv(jnp.asarray(x), jnp.asarray(wt), jnp.zeros((b, w, c)))


# --------------------------------------------------------------------------- layer vs NumPy


def _np_layer(layer: mdn.MomentumDeltaNet, x: np.ndarray) -> np.ndarray:
    """Notes section 1.3 written out in float64 NumPy with explicit arctan, sin and cos."""
    c = layer.cfg
    P = lambda v: np.asarray(v[...], np.float64)  # noqa: E731
    H, K, V = c.n_heads, c.head_dim, c.value_dim
    B, T, _ = x.shape
    x = x.astype(np.float64)

    def conv(z, w):
        zp = np.concatenate([np.zeros((B, w.shape[0] - 1, z.shape[-1])), z], 1)
        y = sum(w[i] * zp[:, i : i + T] for i in range(w.shape[0]))
        return y / (1 + np.exp(-y))  # SiLU

    q = conv(x @ P(layer.q_proj.kernel), P(layer.q_conv.weight)).reshape(B, T, H, K)
    k = conv(x @ P(layer.k_proj.kernel), P(layer.k_conv.weight)).reshape(B, T, H, K)
    v = conv(x @ P(layer.v_proj.kernel), P(layer.v_conv.weight)).reshape(B, T, H, V)
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
    o = o / np.sqrt((o**2).mean(-1, keepdims=True) + c.norm_eps) * P(layer.o_norm.scale)
    g = (x @ P(layer.g_proj.kernel)).reshape(B, T, H, V)
    o = o / (1 + np.exp(-g))
    return o.reshape(B, T, H * V) @ P(layer.o_proj.kernel)


def _perturb(module, key, scale=0.3):
    """Move every parameter away from its init so that no term is accidentally ~0 or ~1."""
    params = nnx.state(module, nnx.Param)
    leaves, treedef = jax.tree.flatten(params)
    keys = jax.random.split(key, len(leaves))
    new = [p + scale * jax.random.normal(k_, p.shape) * (jnp.std(p) + 0.1)
           for p, k_ in zip(leaves, keys, strict=True)]
    nnx.update(module, jax.tree.unflatten(treedef, new))


@pytest.mark.parametrize("method", ["recurrent", "chunk"])
def test_mdn_layer_matches_numpy_derivation(method):
    cfg = dataclasses.replace(SMALL, method=method)
    layer = mdn.MomentumDeltaNet(cfg, rngs=nnx.Rngs(3))
    _perturb(layer, jax.random.key(4))
    x = jax.random.normal(jax.random.key(5), (2, 19, cfg.d_model))
    y, cache = layer(x)
    assert cache is None and y.shape == x.shape and y.dtype == jnp.float32
    assert rel(y, _np_layer(layer, np.asarray(x))) < 1e-5


# --------------------------------------------------------------------------- layers: jit, grad


@pytest.mark.parametrize("cls", [mdn.MomentumDeltaNet, mdn.GatedDeltaNet])
def test_layer_jit_grad_and_cache_shapes(cls):
    layer = cls(SMALL, rngs=nnx.Rngs(0))
    x = jax.random.normal(jax.random.key(1), (3, 21, SMALL.d_model))
    y_jit, _ = nnx.jit(lambda l, x: l(x))(layer, x)
    assert y_jit.shape == (3, 21, SMALL.d_model) and bool(jnp.all(jnp.isfinite(y_jit)))

    def loss(l, x):
        y, _ = l(x)
        return jnp.mean(y**2)

    grads = nnx.jit(nnx.grad(loss))(layer, x)
    leaves = jax.tree.leaves(grads)
    assert leaves and all(bool(jnp.all(jnp.isfinite(g))) for g in leaves)
    assert sum(float(jnp.sum(g**2)) for g in leaves) > 0
    cache = layer.init_cache(3)
    state_shape = (3, 2, 8, 16) if cls is mdn.GatedDeltaNet else (2, 3, 2, 8, 16)
    assert cache.state.shape == state_shape
    assert cache.conv_q.shape == (3, 3, 16) and cache.conv_v.shape == (3, 3, 32)
    _, new_cache = layer(x, cache)
    assert jax.tree.map(jnp.shape, new_cache) == jax.tree.map(jnp.shape, cache)


# --------------------------------------------------------------------------- decode == forward


@pytest.mark.parametrize("build", [mdn.build_mdn, mdn.build_gdn])
def test_decode_matches_full_forward(build):
    model = build("tiny", vocab_size=61, rngs=nnx.Rngs(0), **{
        k: getattr(SMALL, k) for k in ("d_model", "n_heads", "head_dim", "mlp_multiple_of",
                                       "max_seq_len", "chunk_size")
    })
    _perturb(model, jax.random.key(7), scale=0.2)
    tokens = jax.random.randint(jax.random.key(2), (2, 37), 0, 61)
    full = nnx.jit(lambda m, t: m(t))(model, tokens)  # chunk path, T = 37 pads to 48
    assert full.shape == (2, 37, 61) and full.dtype == jnp.float32
    step = nnx.jit(lambda m, t, c: m.decode_step(t, c))
    cache = model.init_cache(2)
    outs = []
    for i in range(37):
        logits, cache = step(model, tokens[:, i : i + 1], cache)
        outs.append(logits)
    assert int(cache.position) == 37
    assert rel(jnp.concatenate(outs, 1), full) < 1e-5
    # prefill 20 tokens (recurrent path since 20 <= 64), then the rest in one chunked call
    cache = model.init_cache(2)
    l1, cache = step(model, tokens[:, :20], cache)
    model.cfg  # noqa: B018  (config is static)
    l2, cache = model.decode_step(tokens[:, 20:], cache)
    assert rel(jnp.concatenate([l1, l2], 1), full) < 1e-5


# --------------------------------------------------------------------------- stability


def _random_gate_draws(key, n_layers=4, h=128, n_tokens=256):
    """Gates from the layer's parameterisation: ``n_layers`` layers of ``h`` heads each (so
    ``n_layers * h`` independent draws of the paper's inits), with a training-like random drift
    of the gate parameters, on raw projections ``N(0, 2^2)`` and through the layer itself."""
    gates = []
    for i, k_ in enumerate(jax.random.split(key, n_layers)):
        cfg = dataclasses.replace(SMALL, n_heads=h, head_dim=2, expand_v=1,
                                  tau_factor=[1.0, 8.0][i % 2], min_log_mu=[-2.0, -1.0][i % 2])
        layer = mdn.MomentumDeltaNet(cfg, rngs=nnx.Rngs(i))
        k1, k2, k3 = jax.random.split(k_, 3)
        names = ("A_log", "Mu_log", "dt_bias", "mu_bias", "log_factor")
        params = {n: getattr(layer, n)[...] + 0.5 * jax.random.normal(kk, (h,))
                  for n, kk in zip(names, jax.random.split(k1, 5), strict=True)}
        a, b, m, e = 2.0 * jax.random.normal(k2, (4, n_tokens, h))
        e = e * cfg.tau  # tanh(e / tau) covers the whole of (0, 2)
        gates.append(mdn.mdn_gates(a, b, m, e, tau=cfg.tau, min_log_mu=cfg.min_log_mu, **params))
        x = 3.0 * jax.random.normal(k3, (1, n_tokens, cfg.d_model))
        gates.append(layer.gates(x))
    return mdn.MDNGates(*(jnp.concatenate([g[j].reshape(-1) for g in gates]) for j in range(4)))


def test_gate_ranges_and_spectral_radius_below_one():
    g = _random_gate_draws(jax.random.key(0))
    assert g.beta.size > 200_000
    assert bool(jnp.all(g.beta >= 0)) and bool(jnp.all(g.beta <= 1))
    assert bool(jnp.all((g.eta >= 0) & (g.eta <= 2)))  # (0, 2), closed by float32 rounding
    assert bool(jnp.all(g.log_alpha < 0)) and bool(jnp.all(g.log_mu >= -2.0))
    with jax.enable_x64(True):
        g64 = jax.tree.map(lambda z: jnp.asarray(np.asarray(z, np.float64)), g)
        alpha, mu = np.exp(np.asarray(g64.log_alpha)), np.exp(np.asarray(g64.log_mu))
        lam = np.asarray(mdn.momentum_eigenvalues(*g64))
        mats = np.asarray(mdn.momentum_transition_matrix(*g64))
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


def test_states_bounded_over_10k_steps():
    T, H, K, V = 10_000, 4, 8, 8
    key = jax.random.key(11)
    k1, k2, k3, k4 = jax.random.split(key, 4)
    layer = mdn.MomentumDeltaNet(dataclasses.replace(SMALL, n_heads=H), rngs=nnx.Rngs(5))
    a, b, m, e = 2.0 * jax.random.normal(k1, (4, 1, T, H))
    # push some heads towards slow decays and large eta, where the momentum matters most
    m = m - jnp.array([0.0, 4.0, 8.0, 8.0])
    a = a - jnp.array([0.0, 4.0, 8.0, 0.0])
    e = e * layer.cfg.tau + jnp.array([0.0, 0.0, 1.0, 2.0]) * layer.cfg.tau
    g = mdn.mdn_gates(a, b, m, e, A_log=layer.A_log[...], Mu_log=layer.Mu_log[...],
                      dt_bias=layer.dt_bias[...], mu_bias=layer.mu_bias[...],
                      log_factor=layer.log_factor[...], tau=layer.cfg.tau,
                      min_log_mu=layer.cfg.min_log_mu)
    k_hat = mdn.l2_normalize(jax.random.normal(k2, (1, T, H, K)))
    q_hat = mdn.l2_normalize(jax.random.normal(k3, (1, T, H, K)))
    v = jax.random.normal(k4, (1, T, H, V))
    p = jnp.exp(g.log_alpha)[..., None] * k_hat
    o, state = momentum_delta_rule(q_hat, k_hat, v, p, *g, output_final_state=True,
                                   method="recurrent")
    assert bool(jnp.all(jnp.isfinite(o))) and bool(jnp.all(jnp.isfinite(state)))
    # a bounded input gives a bounded output: |o| stays of the order of |v|
    assert float(jnp.max(jnp.abs(o))) < 50.0
    assert float(jnp.max(jnp.linalg.norm(state.reshape(2, H, -1), axis=-1))) < 500.0
    # no drift: the second half is not larger than the first
    half = T // 2
    assert float(jnp.max(jnp.abs(o[:, half:]))) < 3.0 * float(jnp.max(jnp.abs(o[:, :half]))) + 1


# --------------------------------------------------------------------------- inits, presets


def test_inits_and_metadata():
    layer = mdn.MomentumDeltaNet(dataclasses.replace(SMALL, n_heads=64), rngs=nnx.Rngs(0))
    np.testing.assert_array_equal(layer.mu_bias[...], layer.dt_bias[...])
    dt = jax.nn.softplus(layer.dt_bias[...])
    assert bool(jnp.all((dt >= 1e-3 * 0.999) & (dt <= 0.1 * 1.001)))
    for name, hi in (("A_log", 16.0), ("Mu_log", 16.0), ("log_factor", 4.0), ("D_log", 1.0)):
        val = jnp.exp(getattr(layer, name)[...])
        assert bool(jnp.all((val > 0) & (val <= hi))), name
        assert float(val.max()) > 0.5 * hi  # really spread over (0, hi]
        assert getattr(layer, name).weight_decay is False
    assert float(jnp.std(layer.q_proj.kernel[...])) == pytest.approx(0.02, rel=0.1)
    # every parameter carries logical axes of the right rank
    model = nnx.eval_shape(lambda: mdn.build_mdn("tiny", vocab_size=61, rngs=nnx.Rngs(0)))
    for path, var in nnx.to_flat_state(nnx.state(model, nnx.Param)):
        axes = var.get_metadata().get("logical_axes")
        assert axes is not None and len(axes) == len(var.shape), path


def test_presets_param_counts_and_shapes():
    n400 = mdn.preset_param_count("mdn-400m")
    n13 = mdn.preset_param_count("mdn-1.3b")
    g400 = mdn.preset_param_count("400m", family="gdn")
    assert 0.38e9 < n400 < 0.45e9, n400
    assert 1.3e9 < n13 < 1.6e9, n13
    assert 0.99 * n400 < g400 < n400  # GDN lacks m/e projections and three gate vectors
    c = mdn.MDN_PRESETS["mdn-400m"]
    assert (c.d_model, c.n_layers, c.n_heads, c.head_dim, c.value_dim) == (1024, 21, 6, 128, 256)
    assert c.tau == 32.0 and c.min_log_mu == -2.0 and c.hidden == 2816
    c = mdn.MDN_PRESETS["mdn-1.3b"]
    assert (c.d_model, c.head_dim, c.value_dim, c.tau, c.min_log_mu) == (2048, 256, 512, 16.0, -1.0)
    abstract = nnx.eval_shape(lambda: mdn.build_mdn("mdn-400m", vocab_size=50257,
                                                    rngs=nnx.Rngs(0)))
    attn = abstract.blocks[0].attn
    assert attn.q_proj.kernel.shape == (1024, 768) and attn.v_proj.kernel.shape == (1024, 1536)
    assert attn.o_proj.kernel.shape == (1536, 1024) and attn.q_conv.weight.shape == (4, 768)
    assert abstract.blocks[0].mlp.gate.kernel.shape == (1024, 2816)
    tiny = nnx.eval_shape(lambda: mdn.build_mdn("tiny", vocab_size=256, rngs=nnx.Rngs(0)))
    assert tiny.max_seq_len == 256 and isinstance(tiny, mdn.MDNLanguageModel)
    gdn = nnx.eval_shape(lambda: mdn.build_gdn("gdn-tiny", rngs=nnx.Rngs(0)))
    assert isinstance(gdn, mdn.GDNLanguageModel)
    assert mdn.param_count(tiny) == mdn.preset_param_count("tiny") > mdn.param_count(gdn)


def test_bad_inputs():
    with pytest.raises(ValueError, match="preset"):
        mdn.build_mdn("mdn-7b", rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match="tau_factor"):
        mdn.DeltaNetConfig(tau_factor=0.0)
    with pytest.raises(ValueError, match="chunk_size"):
        mdn.DeltaNetConfig(chunk_size=48)
    model = mdn.build_mdn("tiny", vocab_size=61, rngs=nnx.Rngs(0), max_seq_len=16)
    with pytest.raises(ValueError, match="max_seq_len"):
        model(jnp.zeros((1, 17), jnp.int32))
    with pytest.raises(ValueError, match="tokens"):
        model(jnp.zeros((1, 4, 2), jnp.int32))
    with pytest.raises(ValueError, match="integer"):
        model(jnp.zeros((1, 4), jnp.float32))
    layer = model.blocks[0].attn
    with pytest.raises(ValueError, match="d_model"):
        layer(jnp.zeros((1, 4, 7)))
    with pytest.raises(ValueError, match="batch"):
        layer(jnp.zeros((2, 4, 128)), layer.init_cache(3))
    with pytest.raises(ValueError, match="layers"):
        model.decode_step(jnp.zeros((1, 1), jnp.int32), mdn.LMCache((), jnp.zeros((), jnp.int32)))
