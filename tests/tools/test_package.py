"""The kernel_audit package: its commands run as documented (``python -m
tools.kernel_audit.<module>`` from the repository root), importing it pulls in nothing heavy,
and the wheel does not ship it."""

import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("module", ["xla_aot", "triton_resources"])
def test_commands_run_from_the_repository_root(module):
    """``--help`` of each command that imports no JAX at module level (the others import the
    kernels and are run by the slow tests)."""
    r = subprocess.run(
        [sys.executable, "-m", f"tools.kernel_audit.{module}", "--help"],
        cwd=REPO, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("usage:") and "H200" in r.stdout


def test_import_is_light():
    """The Triton compile stage imports the package in a python that may have no JAX."""
    code = "import sys, kernel_audit; print([m for m in ('jax', 'jaxlib_ext') if m in sys.modules])"
    env = dict(os.environ, PYTHONPATH=str(REPO / "tools"))
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]"


def test_the_wheel_does_not_ship_the_tools():
    cfg = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert not [p for p in cfg["packages"] if "tools" in p or "kernel_audit" in p]
    assert not [d for d in cfg["package-dir"].values() if d.split("/")[0] == "tools"]
