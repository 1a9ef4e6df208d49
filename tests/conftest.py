"""Test-wide setup: 8 simulated CPU devices, float32 matmuls at full precision."""

import os

# Must happen before JAX initialises its backend.
os.environ.setdefault("JAX_NUM_CPU_DEVICES", "8")

import jax  # noqa: E402
import pytest  # noqa: E402

jax.config.update("jax_default_matmul_precision", "highest")


def _has_gpu() -> bool:
    try:
        return bool(jax.devices("gpu"))
    except RuntimeError:
        return False


def pytest_collection_modifyitems(config, items):
    if _has_gpu():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (jax.devices('gpu') is empty)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
