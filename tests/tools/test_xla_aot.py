"""kernel_audit.xla_aot: XLA's deviceless compile of the momentum delta rule programs for an
H200, with its toolchain (``toolchain``) and SASS reader (``sass``). The parsers and the ptxas
wrapper are tested everywhere; the compile itself needs the CUDA PJRT plugin of this JAX
(``make xla-aot`` fetches it) and skips without it.
"""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from kernel_audit import sass, toolchain, xla_aot
from kernel_audit.sass import SassSpan
from kernel_audit.target import SHARED_LIMIT

from jaxlib_ext.pallas_kernels.mdn.config import KERNELS as _KERNELS

REPO = Path(__file__).resolve().parents[2]


PTX = (
    ".visible .entry mdn_prep(\n\t.param .u64 a,\n\t.param .align 4 .b8 b[4]\n)\n"
    ".reqntid 256\n.maxnreg 255\n{\n\tret;\n}\n"
    ".visible .entry fusion_1(\n\t.param .u64 a\n)\n.maxntid 128, 1, 1\n{\n\tret;\n}\n"
)
PTXAS_V = (
    "ptxas info    : Compiling entry function 'mdn_prep' for 'sm_90a'\n"
    "ptxas info    : Function properties for mdn_prep\n"
    "    19856 bytes stack frame, 75312 bytes spill stores, 91468 bytes spill loads\n"
    "ptxas info    : Used 32 registers, used 1 barriers, 19856 bytes cumulative stack size\n"
    "ptxas info    : Compiling entry function 'fusion_1' for 'sm_90a'\n"
    "ptxas info    : Function properties for fusion_1\n"
    "    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n"
    "ptxas info    : Used 18 registers\n"
)
THUNKS = (
    "000: kCommandBuffer [source | sink]\n"
    "    001: kCustomKernel [source | next=002 (3)] loop_broadcast_fusion grid: [3072, 1, 1] "
    "threads: [128, 1, 1]  shared_memory: 0 bytes\n"
    "    002: kCustomKernel [prev=001 (1) | sink] mdn_prep grid: [64, 8, 6] threads: [256, 1, 1]"
    "  shared_memory: 65536 bytes\n"
)


SASS = """\t.target\tsm_90a
//--------------------- .text.mdn_chunk_bwd     --------------------------
\t.section\t.text.mdn_chunk_bwd,"ax",@progbits
mdn_chunk_bwd:
.text.mdn_chunk_bwd:
        /*0000*/                   LDC R1, c[0x0][0x28] ;
        /*0010*/                   STL.64 [R1], R2 ;
.L_x_0:
        /*0020*/                   LDL R4, [R1] ;
        /*0030*/                   HMMA.16816.F32.BF16 R8, R12, R16, R8 ;
        /*0040*/                   STL.128 [R1+0x10], R8 ;
        /*0050*/               @P0 BRA `(.L_x_0) ;
        /*0060*/              @!P1 LDL.64 R2, [R1] ;
        /*0070*/                   EXIT ;
.L_x_1:
        /*0080*/                   BRA `(.L_x_1);
//--------------------- .text.mdn_out     --------------------------
mdn_out:
        /*0000*/                   EXIT ;
"""


def test_sass_profile_splits_loops_and_weighs_spills():
    """Per kernel: instructions and local-memory bytes (LDL/STL by width, predicated too)
    outside loops and per iteration of each backward-branch loop; the trap after EXIT (a jump
    to itself) is no loop."""
    assert sass.profile(SASS) == {
        "mdn_chunk_bwd": (SassSpan(5, 16), [SassSpan(4, 20)]),
        "mdn_out": (SassSpan(1, 0), []),
    }
    spans = (SassSpan(5, 16), [SassSpan(4, 20), SassSpan(9, 0)])
    assert sass.format_spans(spans, "instructions") == "5 + 4/iter + 9/iter"
    assert sass.format_spans(spans, "local_bytes") == "16 + 20/iter"
    assert sass.format_spans(None, "local_bytes") == "-"


@pytest.mark.parametrize(
    "instruction, nbytes",
    [
        ("LDL R4, [R1]", 4),
        ("STL.64 [R1], R2", 8),
        ("STL.128 [R1+0x10], R8", 16),
        ("@!P1 LDL.U8 R2, [R1]", 1),
        ("LDS.128 R4, [R2]", 0),  # shared memory, not a spill
        ("HMMA.16816.F32.BF16 R8, R12, R16, R8", 0),
    ],
)
def test_local_bytes_by_width(instruction, nbytes):
    assert sass.local_bytes(instruction) == nbytes


def test_parsers():
    """PTX entry directives, ptxas -v per entry (registers, spill stores)."""
    assert xla_aot._entry_directives(PTX) == {
        "mdn_prep": ".reqntid 256 .maxnreg 255",
        "fusion_1": ".maxntid 128, 1, 1",
    }
    assert xla_aot._ptxas_per_entry(PTXAS_V) == {"mdn_prep": (32, 75312), "fusion_1": (18, 0)}


def test_kernel_rows_join_thunks_and_ptxas(tmp_path):
    """Only mdn_* kernels; launch facts from the thunk sequence, resources from the wrapper's
    kept PTX + ptxas log; a 32-register kernel that spills is flagged."""
    thunks = tmp_path / "module_0001.jit_mdn_forward.thunk_sequence.txt"
    thunks.write_text(THUNKS)
    ptx = tmp_path / "ptxAbc123.ptx"
    ptx.write_text(PTX)
    (tmp_path / "ptxAbc123.ptx.log").write_text(PTXAS_V)
    (tmp_path / "ptxAbc123.ptx.args").write_text(f"{ptx} -o out.cubin -arch=sm_90a\n")
    [row] = xla_aot._kernels([thunks], [ptx])
    assert row == dict(
        name="mdn_prep",
        grid="64,8,6",
        threads=256,
        shared=65536,
        registers=32,
        spills=75312,
        sass=None,
        directives=".reqntid 256 .maxnreg 255",
        ptxas_args="-arch=sm_90a",
    )
    assert xla_aot._flag(row) == "low-register fallback"
    assert xla_aot._flag(row | dict(shared=SHARED_LIMIT + 1, registers=255)) == "OVER SHARED LIMIT"


def test_ptxas_wrapper_keeps_ptx_and_report(tmp_path, monkeypatch):
    """The ptxas XLA runs is the wrapper: it passes the call through with -v (exit status
    included) and keeps the PTX, the ptxas report and the arguments."""
    fake = tmp_path / "real_ptxas"
    fake.write_text(
        "#!/bin/sh\n"
        'if [ "$1" = "--version" ]; then echo "Cuda compilation tools, release 13.0, V13.0.88";'
        " exit 0; fi\n"
        'echo "ptxas info    : args $*" >&2\nexit 3\n'
    )
    fake.chmod(0o755)
    libdevice = tmp_path / "libdevice.10.bc"
    libdevice.write_bytes(b"BC")
    monkeypatch.setenv("XLA_AOT_PTXAS", str(fake))
    monkeypatch.setattr(toolchain, "find_libdevice", lambda: libdevice)
    for var in ("PATH", "XLA_FLAGS", "JAX_PLATFORMS"):  # restored after the test
        monkeypatch.setenv(var, os.environ.get(var, ""))
    tool = toolchain.prepare_toolchain(tmp_path / "work")
    assert tool["release"] == "13.0" and tool["ptxas"] == str(fake.resolve())
    root = tmp_path / "work" / "cuda"
    assert os.environ["PATH"].startswith(str(root / "bin"))
    assert f"--xla_gpu_cuda_data_dir={root}" in os.environ["XLA_FLAGS"]
    assert (root / "nvvm" / "libdevice" / "libdevice.10.bc").resolve() == libdevice

    src = tmp_path / "kernel.ptx"
    src.write_text(PTX)
    cmd = [str(root / "bin" / "ptxas"), str(src), "-o", str(tmp_path / "k.cubin"), "-arch=sm_90a"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    assert r.returncode == 3  # the real ptxas' status
    assert "-arch=sm_90a -v" in r.stderr  # -v added, report passed on to XLA
    [kept] = list(tool["save"].glob("*.ptx"))
    assert kept.read_text() == PTX
    assert "-v" in kept.with_name(kept.name + ".log").read_text()
    assert kept.with_name(kept.name + ".args").read_text().split()[1:] == cmd[2:]
    assert not kept.with_name(kept.name + ".cubin").exists()  # a failed compile wrote none

    # A compile that succeeds: the cubin it wrote is kept beside the PTX (for nvdisasm).
    fake.write_text('#!/bin/sh\nwhile [ "$1" != "-o" ]; do shift; done\necho CUBIN > "$2"\n')
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    assert r.returncode == 0
    cubins = list(tool["save"].glob("*.ptx.cubin"))
    assert [c.read_text() for c in cubins] == ["CUBIN\n"]


def _have_cuda_plugin():
    try:
        return importlib.util.find_spec("jax_plugins.xla_cuda13") is not None
    except ModuleNotFoundError:
        return False


@pytest.mark.slow
@pytest.mark.skipif(not _have_cuda_plugin(), reason="no CUDA PJRT plugin (make xla-aot)")
def test_xla_compiles_every_kernel_for_h200(tmp_path):
    """Small shape, bfloat16: every program compiles, every Pallas kernel is there with its
    launch facts and ptxas resources, none over the shared-memory limit; on a 2 x 2 mesh of
    H200s the sharded forward+backward needs no collective and each kernel's grid spans one
    batch row and one head (B = H = 2)."""
    out = tmp_path / "r.json"
    cmd = [sys.executable, "-m", "tools.kernel_audit.xla_aot", "--shape", "2,128,2,32,64"]
    cmd += ["--no-xla-chunk", "--json", str(out)]  # the documented command, from the repo root
    r = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout + r.stderr[-3000:]
    report = json.loads(out.read_text())
    assert all(p["ok"] for p in report["results"])
    kernels = {k["name"]: k for p in report["results"] for k in p["kernels"]}
    assert sorted(kernels) == sorted([*_KERNELS, "mdn_step"])
    for k in kernels.values():
        assert k["shared"] is not None and k["registers"] is not None, k
        if toolchain.find_nvdisasm():  # the kept cubin disassembled: it has code
            assert k["sass"] is not None and k["sass"][0][0] > 0, k
    sharded = [p for p in report["results"] if p["program"].startswith("mdn_fwd_bwd_sharded")]
    assert len(sharded) == 2  # Auto and Explicit mesh axes
    for program in sharded:
        assert program["collectives"] == {}
        grids = {k["name"]: k["grid"] for k in program["kernels"]}
        assert grids["mdn_state_fwd"] == grids["mdn_state_bwd"] == "1,1,1", grids  # B, H, V
        assert grids["mdn_prep"] == grids["mdn_chunk_bwd"] == "2,1,1", grids  # chunks, B, H
