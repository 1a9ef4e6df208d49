"""kernel_audit.triton_resources: Triton IR dump of the momentum delta rule kernels (CPU) and
their compile for sm_90a with pip ``triton`` (the ``kernel-check`` extra): shared memory,
registers, spills.

The default run dumps the kernels at a small shape and compiles one of them; the slow tests
are the pre-flight check for a GPU run at the benchmark shape: XLA refuses to launch a Triton
kernel whose shared memory exceeds the device's 232448 bytes per block. They run the compile
stage under ``$TRITON_PYTHON`` when set (e.g. ``python3.12 -m venv /tmp/tri &&
/tmp/tri/bin/pip install triton``), else under this interpreter when it has triton; without
either they skip.
"""

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from kernel_audit import triton_resources
from kernel_audit.target import SHARED_LIMIT

from jaxlib_ext.pallas_kernels.mdn.config import KERNELS as _KERNELS

KERNELS = [*_KERNELS, "mdn_step"]  # every launch-tunable kernel, and the decode step
SMALL = (1, 128, 2, 32, 64)  # B, T, H, K, V


def need_abstract_device():
    try:
        from jax.sharding import AbstractDevice, AbstractMesh, use_abstract_mesh  # noqa: F401
    except ImportError as e:
        pytest.skip(f"no abstract-device lowering in this JAX: {e}")


def triton_python():
    """$TRITON_PYTHON, else this interpreter if it has triton, else None."""
    env = os.environ.get("TRITON_PYTHON")
    if env:
        return env if shutil.which(env) else None
    return sys.executable if importlib.util.find_spec("triton") is not None else None


@pytest.fixture(scope="module")
def small_dump(tmp_path_factory):
    """``(folder, kernels.json dict, (lowering hooks before, after))`` of one bfloat16 dump at
    the small shape, shared by the module's tests."""
    need_abstract_device()
    from jax._src.pallas.triton import pallas_call_registration as reg

    hooks = lambda: (reg.lowering.lower_jaxpr_to_triton_module, reg.mlir.custom_call)
    out = tmp_path_factory.mktemp("ttir")
    before = hooks()
    meta = triton_resources.dump(out, shape=SMALL, dtype="bfloat16")
    return out, meta, (before, hooks())


def test_dump_writes_each_kernel_once(small_dump):
    out, meta, (before, after) = small_dump
    assert after == before  # the lowering hooks are restored

    assert json.loads((out / "kernels.json").read_text()) == meta
    assert meta["shape"] == dict(zip("BTHKV", SMALL))
    names = [k["name"] for k in meta["kernels"]]
    assert sorted(names) == sorted(KERNELS)  # deduplicated: mdn_prep runs in both passes
    by_name = {k["name"]: k for k in meta["kernels"]}
    assert by_name["mdn_prep"]["passes"] == ["forward", "backward", "backward (split)"]
    # the forward's kernels are one call (batch_and_head_parallel), so mdn_out is lowered in
    # the backward passes too, though their loss does not read o (XLA's compile drops it)
    assert by_name["mdn_out"]["passes"] == ["forward", "backward", "backward (split)"]
    assert by_name["mdn_chunk_bwd"]["passes"] == ["backward"]
    assert by_name["mdn_prep_bwd"]["passes"] == ["backward (split)"]
    assert by_name["mdn_step"]["passes"] == ["decode"]
    assert sorted(p.name for p in out.glob("*.ttir")) == sorted(k["file"] for k in meta["kernels"])
    for k in meta["kernels"]:
        for key in ("num_warps", "num_stages"):
            assert type(k[key]) is int and k[key] >= 1, (k["name"], key, k[key])
        assert len(k["grid"]) == 3 and all(type(g) is int and g >= 1 for g in k["grid"])
        assert "tt.func" in (out / k["file"]).read_text()


def test_one_kernel_compiles_for_sm90(small_dump, tmp_path, capsys):
    """The compile stage on one kernel (mdn_prep, in the forward and both backwards): pip
    Triton compiles it for sm_90a with its own warps/stages, ptxas reports its registers, and
    it fits an H200's shared memory; the report is the table and the JSON."""
    pytest.importorskip("triton")
    out, meta, _ = small_dump
    [prep] = [k for k in meta["kernels"] if k["name"] == "mdn_prep"]
    shutil.copy(out / prep["file"], tmp_path)
    (tmp_path / "kernels.json").write_text(json.dumps(meta | dict(kernels=[prep])))
    report = tmp_path / "resources.json"
    assert triton_resources.compile_dir(tmp_path, json_out=report) == 0
    [row] = json.loads(report.read_text())["kernels"]
    assert row["status"] in ("ok", "spills"), row
    assert 0 < row["shared"] <= SHARED_LIMIT and 0 < row["registers"] <= 255, row
    assert "| mdn_prep | 8 | 1 |" in capsys.readouterr().out


def test_compile_stage_needs_no_jax(tmp_path):
    """``compile`` runs in a python without jax: with jax and triton both unimportable it stops
    at the missing triton, with the hint how to get one, not at an import of jax."""
    (tmp_path / "kernels.json").write_text(json.dumps(dict(kernels=[])))
    code = (
        "import sys, runpy; sys.modules['jax'] = None; sys.modules['triton'] = None; "
        f"sys.argv = ['triton_resources', 'compile', '--dir', {str(tmp_path)!r}]; "
        "runpy.run_module('kernel_audit.triton_resources', run_name='__main__')"
    )
    tools = Path(triton_resources.__file__).resolve().parents[1]
    env = dict(os.environ, PYTHONPATH=str(tools))
    r = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 1, r.stderr
    assert "has no triton" in r.stderr and "pip install triton" in r.stderr, r.stderr


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_kernels_fit_h200_shared_memory(tmp_path, dtype):
    """Benchmark shape (B=8, T=4096, H=6, K=128, V=256; bfloat16, the timed case, and float32,
    what the GPU correctness tests run): every kernel, compiled for sm_90a with its own
    warps/stages by the compile stage in its own process, fits in the H200's shared memory per
    block."""
    python = triton_python()
    if python is None:
        pytest.skip("no python with triton (set TRITON_PYTHON)")
    need_abstract_device()
    triton_resources.dump(tmp_path, dtype=dtype)
    out = tmp_path / "resources.json"
    status = triton_resources.run_compile_stage(python, tmp_path, json_out=out)
    assert out.exists(), status
    report = json.loads(out.read_text())
    assert sorted(k["name"] for k in report["kernels"]) == sorted(KERNELS)
    failed = [k for k in report["kernels"] if "error" in k]
    assert not failed, failed
    over = [k["name"] for k in report["kernels"] if k["shared"] > SHARED_LIMIT]
    assert not over, f"over {SHARED_LIMIT} bytes of shared memory: {over}"
    assert status == 0
