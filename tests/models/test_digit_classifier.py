"""models.digit_classifier: shapes, jit, a short training run on MNIST digits scored on held-out
ones, the Fréchet distance on its features, the checkpoint round trip and the cache of
load_or_train, bad input."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxlib_ext.core.images import load_mnist
from jaxlib_ext.models import digit_classifier as dc
from jaxlib_ext.samplers.inverse import frechet_distance

STEPS, BATCH, N_TRAIN = 60, 64, 2000
# Held-out accuracy after STEPS steps of BATCH digits from the first N_TRAIN training digits at
# the default learning rate: measured 0.93 (chance is 0.1); bound with margin.
ACCURACY_BOUND = 0.75


@pytest.fixture(scope="module")
def data():
    train = load_mnist("train", limit=N_TRAIN)
    test = load_mnist("test", limit=500)
    return train, test


@pytest.fixture(scope="module")
def trained(data):
    train, _ = data
    return dc.train_digit_classifier(jax.random.key(0), train.images, train.labels,
                                     steps=STEPS, batch_size=BATCH, progress=False)


def test_short_training_beats_chance_on_held_out_digits(trained, data):
    model, info = trained
    _, test = data
    acc = dc.accuracy(model, test.images, test.labels)
    assert acc > ACCURACY_BOUND, acc
    assert info["steps"] == STEPS and info["train_images"] == N_TRAIN
    assert info["log"][-1]["step"] == STEPS and np.isfinite(info["log"][-1]["loss"])


def test_shapes_and_jit(trained, data):
    model, _ = trained
    x = jnp.asarray(data[1].images[:5])
    f, out = dc.features(model, x), dc.logits(model, x)
    assert f.shape == (5, 128) and out.shape == (5, 10)
    assert bool(jnp.all(f >= 0))
    np.testing.assert_allclose(nnx.jit(dc.features)(model, x), f, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(nnx.jit(dc.logits)(model, x), out, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(model.head(f), out, rtol=1e-5, atol=1e-5)


def _frechet_float64(a, b):
    """The Fréchet distance in float64 NumPy (eigh roots, the trace term by an SVD)."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    ca, cb = np.cov(a, rowvar=False), np.cov(b, rowvar=False)

    def root(c):
        w, v = np.linalg.eigh(c)
        return (v * np.sqrt(np.maximum(w, 0.0))) @ v.T

    cross = np.linalg.svd(root(ca) @ root(cb), compute_uv=False).sum()
    return np.sum((a.mean(0) - b.mean(0)) ** 2) + np.trace(ca) + np.trace(cb) - 2 * cross


def test_frechet_distance_of_its_features(trained, data):
    """float32 on the rank-deficient covariances of ReLU features (units that never fire): 0
    on one set, the float64 value between two halves of the held-out digits (square roots of
    the eigenvalues of C_a^1/2 C_b C_a^1/2 are off by about 2% here), and noise is farther."""
    model, _ = trained
    x = jnp.asarray(data[1].images)
    f = np.asarray(dc.features(model, x))
    assert np.sum(np.all(f == 0, axis=0)) > 0  # the covariance is singular
    scale = float(np.trace(np.cov(f, rowvar=False)))
    assert abs(float(frechet_distance(f, f))) <= 1e-5 * scale
    halves = float(frechet_distance(f[:250], f[250:]))
    np.testing.assert_allclose(halves, _frechet_float64(f[:250], f[250:]), rtol=1e-3)
    noisy = jnp.clip(x[250:] + 0.2 * jax.random.normal(jax.random.key(1), x[250:].shape), 0, 1)
    assert float(frechet_distance(f[:250], dc.features(model, noisy))) > 2 * halves


def test_save_load_and_the_cache_of_load_or_train(trained, data, tmp_path):
    model, info = trained
    train, test = data
    x = jnp.asarray(test.images[:8])
    dc.save(tmp_path, model, {**info, "seed": 0})
    loaded, meta = dc.load(tmp_path)
    np.testing.assert_array_equal(dc.logits(loaded, x), dc.logits(model, x))
    assert meta["data"] == info["data"] and meta["architecture"] == dc.ARCHITECTURE

    # the same run (key(0) is seed 0) is read back, not retrained
    cached, _ = dc.load_or_train(tmp_path, train.images, train.labels, seed=0, steps=STEPS,
                                 batch_size=BATCH, progress=False)
    np.testing.assert_array_equal(dc.logits(cached, x), dc.logits(model, x))
    with pytest.raises(ValueError, match="^path: .* differs in steps"):
        dc.load_or_train(tmp_path, train.images, train.labels, seed=0, steps=STEPS + 1,
                         batch_size=BATCH)
    with pytest.raises(ValueError, match="^path: .* differs in data"):
        dc.load_or_train(tmp_path, train.images[:10], train.labels[:10], seed=0, steps=STEPS,
                         batch_size=BATCH)
    with pytest.raises(FileNotFoundError, match="^path:"):
        dc.load(tmp_path / "missing")


def test_bad_input_is_named(trained, data):
    model, _ = trained
    train, _ = data
    with pytest.raises(ValueError, match="^x:"):
        dc.features(model, jnp.zeros((2, 28, 28)))
    with pytest.raises(ValueError, match="^x:"):
        dc.logits(model, jnp.zeros((2, 32, 32, 1)))
    with pytest.raises(ValueError, match="^x:"):
        dc.logits(model, jnp.zeros((2, 28, 28, 1), jnp.int32))
    with pytest.raises(ValueError, match="^labels:"):
        dc.accuracy(model, train.images[:4], train.labels[:3])
    with pytest.raises(ValueError, match="^labels:"):
        dc.accuracy(model, train.images[:2], np.array([0, 10]))
    with pytest.raises(ValueError, match="^images:"):
        dc.train_digit_classifier(jax.random.key(0), train.images[:4, :, :, 0],
                                  train.labels[:4], steps=1)
    for kwargs, name in (({"steps": 0}, "steps"), ({"batch_size": 1.5}, "batch_size"),
                         ({"learning_rate": -1.0}, "learning_rate")):
        with pytest.raises(ValueError, match=f"^{name}:"):
            dc.train_digit_classifier(jax.random.key(0), train.images[:4], train.labels[:4],
                                      **kwargs)
    with pytest.raises(ValueError, match="^labels:"):
        dc.load_or_train("unused", train.images[:4])
