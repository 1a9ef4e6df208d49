"""The CUDA toolchain XLA calls when it compiles for an H200 without one: a ptxas of CUDA >= 13
behind a wrapper that keeps what it compiles, libdevice, and (optionally) nvdisasm.

``prepare_toolchain(work)`` builds a CUDA root under ``work`` whose ``bin/ptxas`` is the
wrapper, puts it first on PATH and names it to XLA (``--xla_gpu_cuda_data_dir``), and asks XLA
to dump its thunk sequences (each kernel's grid, threads and shared memory). The wrapper passes
each call through to the real ptxas with ``-v`` added and keeps, side by side, the PTX, the
arguments, the ``-v`` report and, when the compile succeeds, the cubin (for nvdisasm). It must
run before JAX initialises the CUDA plugin, which reads XLA_FLAGS once.

Search order. ptxas: $XLA_AOT_PTXAS, pip ``nvidia-cuda-nvcc`` (what ``jax[cuda13]`` installs, so
what the GPU run uses), $CUDA_HOME, PATH, /usr/local/cuda, then pip Triton's
``ptxas-blackwell``; the first of CUDA >= 13 (jaxlib's CUDA 13 build emits PTX ISA 9.x).
libdevice likewise (Triton ships a copy). nvdisasm: $XLA_AOT_NVDISASM, pip
``nvidia-cuda-nvdisasm``, $CUDA_HOME, PATH, /usr/local/cuda.
"""

import importlib.util
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

_WRAPPER = """#!/bin/sh
src=""
out=""
prev=""
for a in "$@"; do
  case "$a" in
    -*) ;;
    *) if [ "$prev" = "-o" ]; then out="$a"; elif [ -f "$a" ]; then src="$a"; fi ;;
  esac
  prev="$a"
done
[ -z "$src" ] && exec "{real}" "$@"  # --version and other probes
keep=$(mktemp -p "{save}" --suffix=.ptx ptxXXXXXX)
cp "$src" "$keep"
echo "$*" > "$keep.args"
"{real}" "$@" -v 2> "$keep.log"
rc=$?
[ $rc -eq 0 ] && [ -n "$out" ] && [ -f "$out" ] && cp "$out" "$keep.cubin"
cat "$keep.log" >&2
exit $rc
"""


def _site_dirs():
    return [Path(p) for p in sys.path if p and Path(p).is_dir()]


def _triton_nvidia_dir():
    spec = importlib.util.find_spec("triton")
    if spec is None or not spec.origin:
        return None
    return Path(spec.origin).parent / "backends" / "nvidia"


def cuda_release(ptxas):
    """(major, minor) of a ptxas binary, or None when it does not run."""
    try:
        out = subprocess.run([ptxas, "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    m = re.search(r"release (\d+)\.(\d+)", out.stdout)
    return (int(m.group(1)), int(m.group(2))) if m else None


def find_ptxas():
    """(path, (major, minor)) of the first ptxas of CUDA >= 13, preferring the one the GPU run
    uses (pip nvidia-cuda-nvcc) over pip Triton's."""
    cands = [os.environ.get("XLA_AOT_PTXAS")]
    cands += [d / "nvidia" / "cu13" / "bin" / "ptxas" for d in _site_dirs()]
    if os.environ.get("CUDA_HOME"):
        cands.append(Path(os.environ["CUDA_HOME"]) / "bin" / "ptxas")
    cands.append(shutil.which("ptxas"))
    cands.append("/usr/local/cuda/bin/ptxas")
    if (tri := _triton_nvidia_dir()) is not None:
        cands += [tri / "bin" / "ptxas-blackwell", tri / "bin" / "ptxas"]
    for c in cands:
        if c and Path(c).is_file() and os.access(c, os.X_OK):
            if (release := cuda_release(str(c))) and release >= (13, 0):
                return str(Path(c).resolve()), release
    raise SystemExit(
        "xla_aot: no ptxas of CUDA >= 13 found; `pip install nvidia-cuda-nvcc` (or set "
        "XLA_AOT_PTXAS), or install the kernel-check extra (pip Triton ships one)"
    )


def find_libdevice():
    """Path of a libdevice.10.bc (pip nvidia-nvvm, a CUDA toolkit, pip Triton's copy)."""
    cands = [d / "nvidia" / "cu13" / "nvvm" / "libdevice" / "libdevice.10.bc" for d in _site_dirs()]
    for root in (os.environ.get("CUDA_HOME"), "/usr/local/cuda"):
        if root:
            cands.append(Path(root) / "nvvm" / "libdevice" / "libdevice.10.bc")
    if (tri := _triton_nvidia_dir()) is not None:
        cands.append(tri / "lib" / "libdevice.10.bc")
    found = next((c for c in cands if c.is_file()), None)
    if found is None:
        raise SystemExit("xla_aot: no libdevice.10.bc (pip nvidia-nvvm, a CUDA toolkit, Triton)")
    return found


def find_nvdisasm():
    """An nvdisasm (pip ``nvidia-cuda-nvdisasm``, which ``make xla-aot`` puts beside the
    plugin, or a CUDA toolkit's), or None: without it the SASS columns stay empty."""
    cands = [os.environ.get("XLA_AOT_NVDISASM")]
    cands += [d / "nvidia" / "cu13" / "bin" / "nvdisasm" for d in _site_dirs()]
    if os.environ.get("CUDA_HOME"):
        cands.append(Path(os.environ["CUDA_HOME"]) / "bin" / "nvdisasm")
    cands += [shutil.which("nvdisasm"), "/usr/local/cuda/bin/nvdisasm"]
    for c in cands:
        if c and Path(c).is_file():
            if not os.access(c, os.X_OK):  # pip --target does not always keep the mode bits
                try:
                    Path(c).chmod(0o755)
                except OSError:
                    continue
            return str(c)
    return None


def prepare_toolchain(work):
    """The CUDA root, wrapper and dump folder under ``work``, set up in this process's
    environment (PATH, XLA_FLAGS, JAX_PLATFORMS=cpu unless set: no local GPU or driver is
    touched). Returns ``{ptxas, release, save (kept PTX), dump (XLA dumps), nvdisasm}``."""
    work = Path(work)
    real, release = find_ptxas()
    root, save, dump = work / "cuda", work / "ptx", work / "dump"
    for d in (root / "bin", root / "nvvm" / "libdevice", save, dump):
        d.mkdir(parents=True, exist_ok=True)
    wrapper = root / "bin" / "ptxas"
    wrapper.write_text(_WRAPPER.format(save=save, real=real))
    wrapper.chmod(0o755)
    links = {root / "nvvm" / "libdevice" / "libdevice.10.bc": find_libdevice()}
    if (nvlink := Path(real).with_name("nvlink")).is_file():
        links[root / "bin" / "nvlink"] = nvlink
    for link, target in links.items():  # a kept folder may hold them from an earlier run
        link.unlink(missing_ok=True)
        link.symlink_to(target)
    os.environ["PATH"] = f"{root / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}"
    os.environ["XLA_FLAGS"] = " ".join(
        [os.environ.get("XLA_FLAGS", ""), f"--xla_gpu_cuda_data_dir={root}"]
        + [f"--xla_dump_to={dump}", "--xla_dump_hlo_module_re=jit_(mdn|poet|moe)_.*"]
    ).strip()
    os.environ.setdefault("JAX_PLATFORMS", "cpu")  # never touch a local GPU or driver
    return dict(
        ptxas=real,
        release=f"{release[0]}.{release[1]}",
        save=save,
        dump=dump,
        nvdisasm=find_nvdisasm(),
    )
