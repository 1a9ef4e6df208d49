"""Shared memory, registers and spills of the momentum delta rule Pallas Triton kernels on H200,
from pip Triton, without a GPU.

What: every ``pl.pallas_call`` of ``momentum_delta_rule_pallas`` (forward: mdn_prep,
mdn_state_fwd, mdn_out; backward: mdn_state_bwd, mdn_chunk_bwd, with mdn_prep again; the split
backward's mdn_chunk_bwd_v and mdn_prep_bwd) and of the decode step
``momentum_delta_rule_step_pallas`` (mdn_step) is lowered to Triton IR for an abstract NVIDIA
H200 (sm_90) on a machine without a GPU, then compiled for sm_90 with the pip ``triton``
package, with each kernel's own ``num_warps`` / ``num_stages``. For each kernel the table gives
the dynamic shared memory Triton allocates (``metadata.shared``) and, from ``ptxas -v`` on the
PTX for sm_90a, the registers per thread and the spill-store bytes.

Why: XLA refuses to launch a Triton kernel whose shared memory exceeds what the device grants a
block (``target.SHARED_LIMIT``), so a kernel that is fine in interpret mode on CPU can fail on
the first GPU run. Registers are capped at 255 per thread; past that ptxas spills to local
memory, which is slow. This check catches both before a GPU is available.

Caveat: XLA compiles the kernels with the Triton bundled in jaxlib, not the pip ``triton`` used
here, so its pipelining/layout choices, and hence the numbers, differ a little (a few KiB of
shared memory, some hundred bytes of spills). ``xla_aot`` runs XLA's own compile for an H200
without a GPU when the CUDA PJRT plugin is at hand; this needs only pip ``triton``.

Two stages, because jax and triton may live in different environments. From the repository
root::

    # with the jax environment: lower and write NN_<kernel>.ttir + kernels.json
    .venv/bin/python -m tools.kernel_audit.triton_resources dump --out /tmp/mdn_ttir \\
        [--shape 8,4096,6,128,256] [--dtype bfloat16] [--block-v N] [--chunk 64]
    # with any python that has triton (does not import jax):
    /tmp/tri/bin/python -m tools.kernel_audit.triton_resources compile --dir /tmp/mdn_ttir \\
        [--sweep] [--json results.json]
    # both at once; the compile stage runs under $TRITON_PYTHON (default: this interpreter):
    .venv/bin/python -m tools.kernel_audit.triton_resources all [--sweep]

A triton environment: ``python3.12 -m venv /tmp/tri && /tmp/tri/bin/pip install triton`` (the
``kernel-check`` extra puts triton in the project's own venv). ``compile`` and ``all`` exit
with status 1 when a kernel is over the shared-memory limit or does not compile. The default
shape is the benchmark shape, B=8, T=4096, H=6, K=128, V=256 in bfloat16 (only
ShapeDtypeStructs: nothing is allocated).
"""

from __future__ import annotations

import argparse
import importlib.util
import itertools
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from .inputs import DEFAULT_SHAPE, abstract_inputs, parse_shape
from .target import MAX_REGISTERS, SHARED_LIMIT

SWEEP_WARPS = (4, 8)
SWEEP_STAGES = (1, 2, 3)
TRITON_TARGET = "__gpu$xla.gpu.triton"
TRITON_VENV_HINT = "python3.12 -m venv /tmp/tri && /tmp/tri/bin/pip install triton"


# --------------------------------------------------------------------------------------------
# Stage 1 (jax environment): lower for an abstract H200 and capture each kernel's Triton IR
# --------------------------------------------------------------------------------------------


def _capture_kernels(fn, args):
    """Lower ``jax.jit(fn)`` for CUDA and return, in lowering order, one dict per Pallas Triton
    kernel: name, Triton IR text, num_warps, num_stages, grid.

    The Pallas Triton lowering rule calls ``lowering.lower_jaxpr_to_triton_module`` and then
    ``mlir.custom_call(call_target_name="__gpu$xla.gpu.triton", backend_config=...)``; both are
    wrapped as the registration module sees them and restored afterwards."""
    import jax
    from jax._src.lib.mlir import ir
    from jax._src.pallas.triton import pallas_call_registration as reg

    found, pending = [], []
    lower_orig, call_orig = reg.lowering.lower_jaxpr_to_triton_module, reg.mlir.custom_call

    def lower_spy(*a, **kw):
        res = lower_orig(*a, **kw)
        pending.append(res.module.operation.get_asm())
        return res

    def call_spy(*a, **kw):
        if kw.get("call_target_name") == TRITON_TARGET and pending:
            cfg = kw["backend_config"]
            num = lambda key: int(ir.IntegerAttr(cfg[key]).value)
            found.append(
                dict(
                    name=ir.StringAttr(cfg["name"]).value,
                    ir=pending.pop(),
                    num_warps=num("num_warps"),
                    num_stages=num("num_stages"),
                    grid=[num(f"grid_{d}") for d in "xyz" if f"grid_{d}" in cfg],
                )
            )
        return call_orig(*a, **kw)

    reg.lowering.lower_jaxpr_to_triton_module = lower_spy
    reg.mlir.custom_call = call_spy
    try:
        jax.jit(fn).trace(*args).lower(lowering_platforms=("cuda",))
    finally:
        reg.lowering.lower_jaxpr_to_triton_module = lower_orig
        reg.mlir.custom_call = call_orig
    return found


def dump(out, shape=DEFAULT_SHAPE, dtype="bfloat16", block_v=None, chunk=64):
    """Write ``NN_<kernel>.ttir`` per distinct kernel and ``kernels.json`` into ``out``; return
    the kernels.json dict. Kernels are lowered from the forward, forward+backward (``jax.grad``
    drops mdn_out there, hence the separate forward), forward+backward with
    ``backward="pallas_split"`` and the decode step."""
    import functools
    import warnings

    import jax
    import jax.numpy as jnp

    from jaxlib_ext.pallas_kernels.mdn.decode import momentum_delta_rule_step_pallas

    from .mdn_probes import pallas_op

    try:
        from jax.sharding import AbstractDevice, AbstractMesh, AxisType, use_abstract_mesh
    except ImportError as e:
        raise RuntimeError(
            f"this JAX ({jax.__version__}) cannot lower for an abstract GPU device: {e}"
        ) from e
    if len(shape) != 5 or min(shape) < 1:
        raise ValueError(f"shape: expected five positive ints B,T,H,K,V, got {shape}")
    if dtype not in ("bfloat16", "float32"):
        raise ValueError(f"dtype: expected 'bfloat16' or 'float32', got {dtype!r}")
    b, t, h, kdim, vdim = (int(x) for x in shape)
    scale = kdim**-0.5
    seq, one = abstract_inputs((b, t, h, kdim, vdim), dtype)

    def forward(*a, backward="pallas"):
        return pallas_op(
            *a, scale=scale, chunk_size=chunk, block_v=block_v, backward=backward
        )[0]

    def loss(*a, backward="pallas"):
        return jnp.sum(forward(*a, backward=backward).astype(jnp.float32))

    step = functools.partial(momentum_delta_rule_step_pallas, scale=scale, block_v=block_v)
    passes = (
        ("forward", forward, seq),
        ("backward", jax.grad(loss, argnums=tuple(range(8))), seq),
        (
            "backward (split)",
            jax.grad(functools.partial(loss, backward="pallas_split"), argnums=tuple(range(8))),
            seq,
        ),
        ("decode", step, one),
    )
    dev = AbstractDevice(device_kind="NVIDIA H200", num_cores=132, platform="gpu")
    mesh = AbstractMesh((1,), ("x",), (AxisType.Explicit,), abstract_device=dev)
    jax.clear_caches()  # a cached lowering would not pass through the wrapped functions
    kernels, seen = [], {}
    with use_abstract_mesh(mesh), warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # "Pallas Triton is deprecated"
        for where, fn, args in passes:
            for kern in _capture_kernels(fn, args):
                key = (kern["ir"], kern["num_warps"], kern["num_stages"])
                if key not in seen:
                    seen[key] = kern | dict(passes=[], calls=0)
                    kernels.append(seen[key])
                seen[key]["calls"] += 1
                if where not in seen[key]["passes"]:
                    seen[key]["passes"].append(where)

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("*.ttir"):
        old.unlink()
    entries = []
    for i, kern in enumerate(kernels):
        fname = f"{i:02d}_{re.sub(r'[^A-Za-z0-9_]', '_', kern['name'])}.ttir"
        (out / fname).write_text(kern["ir"])
        entries.append({k: v for k, v in kern.items() if k != "ir"} | {"file": fname})
    meta = dict(
        shape=dict(B=b, T=t, H=h, K=kdim, V=vdim),
        dtype=dtype,
        chunk=chunk,
        block_v=block_v,
        device="NVIDIA H200 (abstract, sm_90)",
        jax_version=jax.__version__,
        kernels=entries,
    )
    (out / "kernels.json").write_text(json.dumps(meta, indent=2) + "\n")
    return meta


# --------------------------------------------------------------------------------------------
# Stage 2 (triton environment, no jax): compile for sm_90, read shared memory, ptxas -v
# --------------------------------------------------------------------------------------------


def _ptxas_candidates(triton_dir):
    """ptxas binaries to try, preferred first: $TRITON_PTXAS_PATH, the triton wheel's newest
    (Blackwell build, i.e. newest CUDA, which reads newer PTX ``.version``), its plain one,
    PATH. Only existing executables, each once."""
    bindir = Path(triton_dir) / "backends" / "nvidia" / "bin"
    paths = [os.environ.get("TRITON_PTXAS_PATH"), bindir / "ptxas-blackwell", bindir / "ptxas"]
    paths.append(shutil.which("ptxas"))  # the first PATH entry that has one
    out = []
    for p in paths:
        if p and Path(p).is_file() and os.access(p, os.X_OK) and str(p) not in out:
            out.append(str(p))
    return out


def _ptxas_stats(ptx, ptxas_list, workdir):
    """(registers, spill-store bytes) of the PTX for sm_90a; the first ptxas that accepts the
    PTX's ``.version`` is used."""
    src = Path(workdir) / "kernel.ptx"
    src.write_text(ptx)
    errors = []
    for exe in ptxas_list:
        cmd = [exe, "-v", "--gpu-name", "sm_90a", str(src), "-o", str(src.with_suffix(".cubin"))]
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode:
            errors.append(f"{Path(exe).name}: {r.stderr.strip().splitlines()[-1:]}")
            continue
        regs = [int(x) for x in re.findall(r"Used (\d+) registers", r.stderr)]
        spills = [int(x) for x in re.findall(r"(\d+) bytes spill stores", r.stderr)]
        if not regs:
            raise RuntimeError(f"no register count in ptxas output: {r.stderr[-500:]}")
        return max(regs), sum(spills)
    version = re.search(r"^\.version\s+(\S+)", ptx, re.M)
    raise RuntimeError(
        f"no ptxas accepted this PTX (.version {version.group(1) if version else '?'}): "
        + "; ".join(errors)
    )


def _measure(triton, path, warps, stages, ptxas_list, workdir):
    from triton.backends.compiler import GPUTarget

    target = GPUTarget("cuda", 90, 32)
    kern = triton.compile(
        str(path), target=target, options={"num_warps": warps, "num_stages": stages}
    )
    regs, spills = _ptxas_stats(kern.asm["ptx"], ptxas_list, workdir)
    return dict(shared=int(kern.metadata.shared), registers=regs, spill_bytes=spills)


def _status(m):
    if "error" in m:
        return "FAILED: " + m["error"]
    if m["shared"] > SHARED_LIMIT:
        return "OVER shared limit"
    if m["spill_bytes"] or m["registers"] > MAX_REGISTERS:
        return "spills"
    return "ok"


def _row(name, warps, stages, m, mark=""):
    if "error" in m:
        return f"| {name}{mark} | {warps} | {stages} | - | - | - | {_status(m)} |"
    return (
        f"| {name}{mark} | {warps} | {stages} | {m['shared'] / 1024:.1f} | {m['registers']} "
        f"| {m['spill_bytes']} | {_status(m)} |"
    )


def compile_dir(directory, sweep=False, json_out=None):
    """Compile every kernel listed in ``directory/kernels.json``, print the markdown table(s)
    and return the exit status (1 if a kernel is over the shared-memory limit or fails).
    With ``json_out``, also write the measurements (kernels.json entries plus shared,
    registers, spill_bytes, status; ``sweep`` rows under "sweep") to that file."""
    os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    try:
        import triton
    except ImportError:
        sys.exit(
            f"compile: this python ({sys.executable}) has no triton; get one: {TRITON_VENV_HINT}"
        )
    directory = Path(directory)
    meta = json.loads((directory / "kernels.json").read_text())
    ptxas_list = _ptxas_candidates(Path(triton.__file__).parent)
    if not ptxas_list:
        sys.exit("compile: no ptxas found (set TRITON_PTXAS_PATH)")
    shape = ", ".join(f"{k}={v}" for k, v in meta["shape"].items())
    print(
        f"Pallas Triton kernels of the momentum delta rule, {shape} {meta['dtype']}, "
        f"chunk {meta['chunk']}, block_v {meta['block_v'] or 'default'}; lowered with jax "
        f"{meta['jax_version']}, compiled for sm_90a with triton {triton.__version__}; "
        f"limits: {SHARED_LIMIT} B ({SHARED_LIMIT // 1024} KiB) shared per block, "
        f"{MAX_REGISTERS} registers per thread.\n"
    )
    header = "| kernel | warps | stages | shared KiB | registers | spill-store bytes | status |"
    rule = "|---|---:|---:|---:|---:|---:|---|"
    bad = False
    with tempfile.TemporaryDirectory() as work:

        def measure(path, w, s):
            try:
                return _measure(triton, path, w, s, ptxas_list, work)
            except Exception as e:  # report and go on: one bad kernel must not hide the rest
                return dict(error=f"{type(e).__name__}: {str(e).splitlines()[0][:160]}")

        results, swept = [], []
        print(header, rule, sep="\n")
        for k in meta["kernels"]:
            m = measure(directory / k["file"], k["num_warps"], k["num_stages"])
            bad |= "error" in m or m["shared"] > SHARED_LIMIT
            results.append(k | m | dict(status=_status(m)))
            print(_row(k["name"], k["num_warps"], k["num_stages"], m), flush=True)
        if sweep:
            print("\nSweep (* = the configuration the kernel uses):\n")
            print(header, rule, sep="\n")
            for k in meta["kernels"]:
                for w, s in itertools.product(SWEEP_WARPS, SWEEP_STAGES):
                    m = measure(directory / k["file"], w, s)
                    mark = " *" if (w, s) == (k["num_warps"], k["num_stages"]) else ""
                    swept.append(dict(name=k["name"], num_warps=w, num_stages=s) | m)
                    print(_row(k["name"], w, s, m, mark), flush=True)
    if json_out:
        report = dict(meta, triton_version=triton.__version__, shared_limit=SHARED_LIMIT)
        report |= dict(kernels=results) | (dict(sweep=swept) if sweep else {})
        Path(json_out).write_text(json.dumps(report, indent=1) + "\n")
    return 1 if bad else 0


# --------------------------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------------------------


def _triton_python():
    """$TRITON_PYTHON, else this interpreter if it has triton; None if neither."""
    env = os.environ.get("TRITON_PYTHON")
    if env:
        return env
    return sys.executable if importlib.util.find_spec("triton") is not None else None


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)

    def lowering_args(p):
        p.add_argument("--shape", type=parse_shape, default=DEFAULT_SHAPE, help="B,T,H,K,V")
        p.add_argument("--dtype", choices=("bfloat16", "float32"), default="bfloat16")
        p.add_argument("--block-v", type=int, default=None, help="default: the kernel's own")
        p.add_argument("--chunk", type=int, default=64)

    p_dump = sub.add_parser("dump", help="lower (jax env); write .ttir files + kernels.json")
    p_dump.add_argument("--out", required=True)
    lowering_args(p_dump)
    p_comp = sub.add_parser("compile", help="compile .ttir for sm_90a (triton env, no jax)")
    p_comp.add_argument("--dir", required=True)
    p_comp.add_argument("--sweep", action="store_true", help="also warps 4,8 x stages 1,2,3")
    p_comp.add_argument("--json", default=None, help="also write the measurements here")
    p_all = sub.add_parser("all", help="dump here, then compile under $TRITON_PYTHON")
    p_all.add_argument("--out", default=None, help="default: a new temporary directory")
    p_all.add_argument("--sweep", action="store_true")
    lowering_args(p_all)
    args = parser.parse_args(argv)

    if args.cmd == "compile":
        return compile_dir(args.dir, sweep=args.sweep, json_out=args.json)
    if args.cmd == "all":
        python = _triton_python()
        if python is None:
            sys.exit(
                "all: no python with triton: set TRITON_PYTHON to one, e.g. after "
                f"`{TRITON_VENV_HINT}` use TRITON_PYTHON=/tmp/tri/bin/python"
            )
        args.out = args.out or tempfile.mkdtemp(prefix="mdn_ttir_")
    meta = dump(args.out, args.shape, args.dtype, args.block_v, args.chunk)
    names = ", ".join(k["name"] for k in meta["kernels"])
    print(f"wrote {len(meta['kernels'])} kernels ({names}) to {args.out}", flush=True)
    if args.cmd == "dump":
        return 0
    return run_compile_stage(python, args.out, args.sweep)


def run_compile_stage(python, directory, sweep=False, json_out=None):
    """Run ``compile`` on ``directory`` under the interpreter ``python`` (which needs neither
    jax nor this package installed: the package's folder goes on its PYTHONPATH); return its
    exit status."""
    package = Path(__file__).resolve().parent
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(package.parent), env.get("PYTHONPATH")]))
    cmd = [python, "-m", f"{package.name}.triton_resources", "compile", "--dir", str(directory)]
    cmd += (["--sweep"] if sweep else []) + (["--json", str(json_out)] if json_out else [])
    return subprocess.run(cmd, env=env).returncode


if __name__ == "__main__":
    sys.exit(main())
