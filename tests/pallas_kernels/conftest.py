"""Fixtures shared by the Pallas kernel tests."""

import warnings

import jax
import pytest


def _lower_for_h200(fn, args):
    """StableHLO text of ``fn(*args)`` lowered for CUDA against an abstract H200 (on CPU:
    runs each Pallas backend's own lowering, whose module is in the custom call's config;
    skips where this JAX has no abstract GPU device)."""
    try:
        from jax.sharding import AbstractDevice, AbstractMesh, AxisType, use_abstract_mesh
    except ImportError as e:  # older JAX: no abstract GPU device to lower against
        pytest.skip(f"no abstract-device lowering in this JAX: {e}")
    dev = AbstractDevice(device_kind="NVIDIA H200", num_cores=132, platform="gpu")
    mesh = AbstractMesh((1,), ("x",), (AxisType.Explicit,), abstract_device=dev)
    with use_abstract_mesh(mesh), warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # "Pallas Triton is deprecated"
        return jax.jit(fn).trace(*args).lower(lowering_platforms=("cuda",)).as_text()


@pytest.fixture
def lower_for_h200():
    return _lower_for_h200
