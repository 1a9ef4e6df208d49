import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxlib_ext.models import (
    TRANSFORMER_PRESETS,
    apply_rope,
    build_transformer,
    causal_attention,
    param_count,
)


def _naive_attention(q, k, v):
    b, t, h, d = q.shape
    out = np.zeros_like(np.asarray(v))
    for i in range(t):
        s = np.einsum("bhd,bjhd->bhj", q[:, i], k[:, : i + 1]) / np.sqrt(d)
        p = np.exp(s - s.max(-1, keepdims=True))
        p /= p.sum(-1, keepdims=True)
        out[:, i] = np.einsum("bhj,bjhd->bhd", p, v[:, : i + 1])
    return out


def test_causal_attention_matches_a_loop():
    q, k, v = jax.random.normal(jax.random.key(0), (3, 2, 7, 3, 8))
    ref = _naive_attention(np.asarray(q), np.asarray(k), np.asarray(v))
    out = np.asarray(causal_attention(q, k, v))
    assert np.linalg.norm(out - ref) / np.linalg.norm(ref) < 1e-6


def test_rope_preserves_norm_and_relative_positions():
    x = jax.random.normal(jax.random.key(1), (2, 5, 3, 8))
    pos = jnp.arange(5)
    y = apply_rope(x, pos)
    np.testing.assert_allclose(jnp.linalg.norm(y, axis=-1), jnp.linalg.norm(x, axis=-1), rtol=1e-5)
    q, k = x[:, :1], x[:, 1:2]
    d1 = jnp.sum(apply_rope(q, jnp.array([3])) * apply_rope(k, jnp.array([1])), -1)
    d2 = jnp.sum(apply_rope(q, jnp.array([7])) * apply_rope(k, jnp.array([5])), -1)
    np.testing.assert_allclose(d1, d2, rtol=1e-4, atol=1e-5)


def test_lm_is_causal_and_differentiable():
    model = build_transformer("tiny", vocab_size=64, rngs=nnx.Rngs(0), max_seq_len=32)
    tokens = jax.random.randint(jax.random.key(2), (2, 11), 0, 64)
    changed = tokens.at[:, 6:].set((tokens[:, 6:] + 1) % 64)

    def loss(m, t):
        logits = m(t)
        return jnp.mean(logits**2), logits

    value_and_grad = nnx.jit(nnx.value_and_grad(loss, has_aux=True))
    (_, logits), grads = value_and_grad(model, tokens)
    (_, logits_changed), _ = value_and_grad(model, changed)
    assert logits.shape == (2, 11, 64) and logits.dtype == jnp.float32
    np.testing.assert_allclose(logits_changed[:, :6], logits[:, :6], rtol=1e-5, atol=1e-6)
    assert all(bool(jnp.all(jnp.isfinite(g))) for g in jax.tree.leaves(grads))


def test_presets_and_errors():
    counts = {}
    for name in TRANSFORMER_PRESETS:
        m = nnx.eval_shape(lambda n=name: build_transformer(n, vocab_size=50257, rngs=nnx.Rngs(0)))
        counts[name] = param_count(m)
    assert counts["tiny"] < counts["small"] < counts["125m"] < counts["400m"]
    assert 3.5e8 < counts["400m"] < 5e8
    with pytest.raises(ValueError, match="preset"):
        build_transformer("huge", rngs=nnx.Rngs(0))
    model = build_transformer("tiny", rngs=nnx.Rngs(0), max_seq_len=8)
    with pytest.raises(ValueError, match="max_seq_len"):
        model(jnp.zeros((1, 9), jnp.int32))
