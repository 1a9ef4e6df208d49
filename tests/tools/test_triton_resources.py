"""benchmarks/triton_resources.py: Triton IR dump of the momentum delta rule kernels (CPU) and,
where a python with the ``triton`` package is at hand, their shared memory on H200 (sm_90a).

The slow test is the pre-flight check for a GPU run: XLA refuses to launch a Triton kernel whose
shared memory exceeds the device's 232448 bytes per block. Point it at a triton environment with
``TRITON_PYTHON=/path/to/python`` (e.g. ``python3.12 -m venv /tmp/tri &&
/tmp/tri/bin/pip install triton``); without one it skips.
"""

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from jaxlib_ext.pallas_kernels.mdn._launch import _KERNELS

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "benchmarks" / "triton_resources.py"
KERNELS = [*_KERNELS, "mdn_step"]  # every launch-tunable kernel, and the decode step


def load_script():
    spec = importlib.util.spec_from_file_location("triton_resources", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


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


def test_dump_writes_each_kernel_once(tmp_path):
    need_abstract_device()
    from jax._src.pallas.triton import pallas_call_registration as reg

    tr = load_script()
    before = (reg.lowering.lower_jaxpr_to_triton_module, reg.mlir.custom_call)
    meta = tr.dump(tmp_path, shape=(1, 128, 2, 32, 64), dtype="bfloat16")
    assert (reg.lowering.lower_jaxpr_to_triton_module, reg.mlir.custom_call) == before

    assert json.loads((tmp_path / "kernels.json").read_text()) == meta
    assert meta["shape"] == dict(B=1, T=128, H=2, K=32, V=64)
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
    assert sorted(p.name for p in tmp_path.glob("*.ttir")) == sorted(
        k["file"] for k in meta["kernels"]
    )
    for k in meta["kernels"]:
        for key in ("num_warps", "num_stages"):
            assert type(k[key]) is int and k[key] >= 1, (k["name"], key, k[key])
        assert len(k["grid"]) == 3 and all(type(g) is int and g >= 1 for g in k["grid"])
        assert "tt.func" in (tmp_path / k["file"]).read_text()


def test_compile_stage_needs_no_jax(tmp_path):
    """``compile`` runs in a python without jax: with jax and triton both unimportable it stops
    at the missing triton, with the hint how to get one, not at an import of jax."""
    (tmp_path / "kernels.json").write_text(json.dumps(dict(kernels=[])))
    code = (
        "import sys; sys.modules['jax'] = None; sys.modules['triton'] = None; "
        f"sys.argv = ['x', 'compile', '--dir', {str(tmp_path)!r}]; "
        f"import runpy; runpy.run_path({str(SCRIPT)!r}, run_name='__main__')"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 1, r.stderr
    assert "has no triton" in r.stderr and "pip install triton" in r.stderr, r.stderr


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_kernels_fit_h200_shared_memory(tmp_path, dtype):
    """Default benchmark shape (B=8, T=4096, H=6, K=128, V=256; bfloat16, the timed case, and
    float32, what the GPU correctness tests run): every kernel, compiled for sm_90a with its
    own warps/stages, fits in the H200's shared memory per block."""
    python = triton_python()
    if python is None:
        pytest.skip("no python with triton (set TRITON_PYTHON)")
    need_abstract_device()
    tr = load_script()
    tr.dump(tmp_path, dtype=dtype)
    out = tmp_path / "resources.json"
    cmd = [python, str(SCRIPT), "compile", "--dir", str(tmp_path), "--json", str(out)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert out.exists(), r.stdout + r.stderr
    report = json.loads(out.read_text())
    assert sorted(k["name"] for k in report["kernels"]) == sorted(KERNELS)
    failed = [k for k in report["kernels"] if "error" in k]
    assert not failed, r.stdout
    over = [k["name"] for k in report["kernels"] if k["shared"] > tr.SHARED_LIMIT]
    assert not over, f"over {tr.SHARED_LIMIT} bytes of shared memory: {over}\n{r.stdout}"
    assert r.returncode == 0, r.stdout + r.stderr
