"""jaxlib_ext.core.images: the bundled MNIST digits and scikit-learn's 8x8 digits."""

import numpy as np
import pytest

from jaxlib_ext.core import images


def test_mnist_splits_shapes_labels_and_range():
    train = images.load_mnist("train")
    test = images.load_mnist("test")
    assert train.images.shape == (8500, 28, 28, 1) and train.images.dtype == np.float32
    assert test.images.shape == (1500, 28, 28, 1)
    assert train.labels.dtype == np.int32 and train.labels.shape == (8500,)
    for s in (train, test):
        assert s.images.min() == 0.0 and s.images.max() == 1.0
        counts = np.bincount(s.labels, minlength=10)
        assert counts.min() > 0.08 * len(s.labels)  # every class present, roughly balanced
    # real digits: ink on a dark background, about a fifth of the pixels lit
    assert 0.08 < train.images.mean() < 0.2
    assert 0.1 < (train.images > 0.5).mean() < 0.2


def test_mnist_train_and_test_are_disjoint():
    a = images.load_mnist("train").images.reshape(8500, -1)
    b = images.load_mnist("test").images.reshape(1500, -1)
    ka = {row.tobytes() for row in (a * 255).astype(np.uint8)}
    kb = {row.tobytes() for row in (b * 255).astype(np.uint8)}
    assert not ka & kb


def test_mnist_value_range_dtype_and_limit():
    unit = images.load_mnist("test", limit=10)
    signed = images.load_mnist("test", value_range=(-1, 1), dtype=np.float64, limit=10)
    assert signed.images.dtype == np.float64 and signed.images.shape == (10, 28, 28, 1)
    np.testing.assert_allclose(signed.images, 2 * unit.images - 1, atol=1e-6)
    np.testing.assert_array_equal(signed.labels, unit.labels)
    assert signed.images.min() == -1.0


def test_digits8():
    d = images.load_digits8()
    assert d.images.shape == (1797, 8, 8, 1) and d.images.dtype == np.float32
    assert d.images.min() == 0.0 and d.images.max() == 1.0
    assert set(np.unique(d.labels)) == set(range(10))
    s = images.load_digits8(value_range=(-1.0, 1.0), limit=5)
    assert s.images.shape == (5, 8, 8, 1) and s.images.min() == -1.0


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"split": "val"}, "split"),
        ({"dtype": np.int32}, "dtype"),
        ({"value_range": (1.0, 0.0)}, "value_range"),
        ({"value_range": 1.0}, "value_range"),
        ({"limit": 0}, "limit"),
        ({"limit": 2.5}, "limit"),
    ],
)
def test_bad_arguments(kwargs, match):
    with pytest.raises((ValueError, TypeError), match=match):
        images.load_mnist(**kwargs)
    if "split" not in kwargs:
        with pytest.raises((ValueError, TypeError), match=match):
            images.load_digits8(**kwargs)
