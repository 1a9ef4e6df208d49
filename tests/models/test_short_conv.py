"""The short causal depthwise convolution: a direct sum, pieces with a carried state, errors."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxlib_ext.models import ShortConvolution, causal_depthwise_conv


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
