"""Test-wide setup: 8 simulated CPU devices, float32 matmuls at full precision, and one
persistent compilation cache for the whole run (its worker processes and the subprocesses
they start), so that a program compiled by one test is read back by the next, and XLA's CPU
backend compiling without LLVM's optimisation passes: test shapes are tiny, so compilation, not
execution, is what a test waits for (the flags change how code is generated, not what it
computes)."""

import os
import pathlib

# Must happen before JAX initialises its backend.
os.environ.setdefault("JAX_NUM_CPU_DEVICES", "8")
os.environ.setdefault(
    "JAX_COMPILATION_CACHE_DIR",
    str(pathlib.Path(__file__).resolve().parents[1] / ".cache" / "jax-tests"))
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.2")
os.environ.setdefault(
    "XLA_FLAGS", "--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true")

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
