"""models.unet: shapes at odd sizes, jit, gradients, conditioning, bad input."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxlib_ext.models import UNet
from jaxlib_ext.models.unet import sinusoidal_embedding


def _x(shape, seed=0):
    """Standard normal test inputs, drawn with NumPy: no XLA program per shape (jax.random's
    partitionable threefry takes seconds to compile on CPU for 4-D shapes)."""
    return jnp.asarray(np.random.default_rng(seed).standard_normal(shape, dtype=np.float32))


# one compiled program per model and shape (eager NNX dispatch compiles op by op: slower)
_apply = nnx.jit(lambda m, x, t=None, c=None: m(x, t, c))


def _unet(*args, **kwargs):
    """``UNet(*args, **kwargs)`` initialised with the non-partitionable threefry: the same
    initialisers and distributions, other bits. Construction draws every parameter eagerly,
    and the default (partitionable) threefry takes up to seconds of CPU compilation per 4-D
    kernel shape (about 20 s for the model below, 4 s this way)."""
    with jax.threefry_partitionable(False):
        return UNet(*args, **kwargs)


@pytest.fixture(scope="module")
def model():
    """Two levels, time embedding, one conditioning channel; shared by most tests."""
    return _unet(1, 1, base_channels=8, channel_mults=(1, 2), cond_channels=1, rngs=nnx.Rngs(0))


# an even size and an odd, non-square one by default; (7, 7) is a size sweep
@pytest.mark.parametrize("hw", [(28, 28), pytest.param((7, 7), marks=pytest.mark.slow), (5, 9)])
def test_output_shape_at_any_size(model, hw):
    x, cond = _x((2, *hw, 1)), _x((2, *hw, 1), 1)
    y = _apply(model, x, jnp.array([3.0, 500.0]), cond)
    assert y.shape == (2, *hw, 1) and y.dtype == jnp.float32
    assert bool(jnp.all(jnp.isfinite(y)))


def test_three_levels_other_channels_and_a_single_level():
    deep = _unet(3, 2, base_channels=8, channel_mults=(1, 2, 2), cond_channels=2,
                 rngs=nnx.Rngs(1))
    y = _apply(deep, _x((2, 7, 9, 3)), jnp.array([1.0, 2.0]), _x((2, 7, 9, 2), 1))
    assert y.shape == (2, 7, 9, 2)
    flat = _unet(2, 2, base_channels=8, channel_mults=(1,), time_embedding=False,
                 rngs=nnx.Rngs(2))
    assert _apply(flat, _x((1, 1, 1, 2))).shape == (1, 1, 1, 2)
    with pytest.raises(ValueError, match="t"):
        flat(jnp.zeros((1, 8, 8, 2)), jnp.zeros(1))
    with pytest.raises(ValueError, match="cond"):
        flat(jnp.zeros((1, 8, 8, 2)), None, jnp.zeros((1, 8, 8, 1)))


def test_jit_matches_eager_and_batch_elements_are_independent(model):
    # the shapes of the conditioning tests below: their programs are compiled once
    x, t, c = _x((2, 8, 8, 1)), jnp.array([1.0, 100.0]), _x((2, 8, 8, 1), 4)
    jitted = _apply(model, x, t, c)
    graphdef, state = nnx.split(model)
    pure = jax.jit(lambda s, a, b, cc: nnx.merge(graphdef, s)(a, b, cc))
    np.testing.assert_allclose(pure(state, x, t, c), jitted, atol=1e-5)
    # GroupNorm normalises per image: one image's output does not depend on the others
    np.testing.assert_allclose(_apply(model, x[1:2], t[1:2], c[1:2]), jitted[1:2], atol=1e-5)
    # a scalar t is broadcast over the batch
    np.testing.assert_allclose(_apply(model, x, 10.0, c), _apply(model, x, jnp.full(2, 10.0), c),
                               atol=1e-5)


def test_gradients_reach_every_parameter_and_the_inputs(model):
    x, cond, t = _x((2, 7, 7, 1)), _x((2, 7, 7, 1), 2), jnp.array([5.0, 50.0])

    def loss(m, a, c):
        return jnp.mean((m(a, t, c) - a) ** 2)

    # parameter, input and conditioning gradients (an energy model differentiates in both) in
    # one program
    grads, gx, gc = nnx.jit(nnx.grad(loss, argnums=(0, 1, 2)))(model, x, cond)
    leaves = jax.tree.leaves(grads)
    assert leaves and all(bool(jnp.all(jnp.isfinite(g))) for g in leaves)
    assert all(float(jnp.linalg.norm(g)) > 0 for g in leaves), "a parameter gets no gradient"
    assert float(jnp.linalg.norm(gx)) > 0 and float(jnp.linalg.norm(gc)) > 0


def test_time_and_image_conditioning_change_the_output(model):
    x, cond = _x((2, 8, 8, 1)), _x((2, 8, 8, 1), 3)
    y = _apply(model, x, jnp.array([1.0, 1.0]), cond)
    assert float(jnp.abs(_apply(model, x, jnp.array([300.0, 300.0]), cond) - y).max()) > 1e-3
    assert float(jnp.abs(_apply(model, x, jnp.array([1.0, 1.0]), cond + 1.0) - y).max()) > 1e-3


def test_time_scale_multiplies_t(model):
    scaled = nnx.clone(model)
    scaled.time_scale = 1000.0
    x, c = _x((2, 8, 8, 1)), _x((2, 8, 8, 1), 5)
    np.testing.assert_allclose(_apply(scaled, x, jnp.array([0.1, 0.5]), c),
                               _apply(model, x, jnp.array([100.0, 500.0]), c), atol=1e-4)


def test_sinusoidal_embedding():
    e = sinusoidal_embedding(jnp.array([0.0, 1.0, 999.0]), 16)
    assert e.shape == (3, 16)
    np.testing.assert_allclose(e[0], np.r_[np.zeros(8), np.ones(8)], atol=1e-7)
    np.testing.assert_allclose(jnp.sum(e**2, -1), 8.0, rtol=1e-5)
    with pytest.raises(ValueError, match="dim"):
        sinusoidal_embedding(jnp.zeros(2), 5)


@pytest.mark.parametrize(
    "args, match",
    [
        (((8, 8, 1), (1,), (1, 8, 8, 1)), "x"),
        (((1, 8, 8, 3), (1,), (1, 8, 8, 1)), "x"),
        (((2, 8, 8, 1), (3,), (2, 8, 8, 1)), "t"),
        (((2, 8, 8, 1), None, (2, 8, 8, 1)), "t"),
        (((2, 8, 8, 1), (2,), None), "cond"),
        (((2, 8, 8, 1), (2,), (2, 7, 8, 1)), "cond"),
        (((2, 8, 8, 1), (2,), (2, 8, 8, 2)), "cond"),
    ],
)
def test_bad_input_names_the_argument(model, args, match):
    x, t, c = (None if s is None else jnp.zeros(s) for s in args)
    with pytest.raises(ValueError, match=match):
        model(x, t, c)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"base_channels": 0}, "base_channels"),
        ({"channel_mults": ()}, "channel_mults"),
        ({"channel_mults": (1, 0)}, "channel_mults"),
        ({"cond_channels": -1}, "cond_channels"),
        ({"num_res_blocks": 0}, "num_res_blocks"),
    ],
)
def test_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        UNet(1, 1, rngs=nnx.Rngs(0), **kwargs)
