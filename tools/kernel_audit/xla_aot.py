"""Compile the momentum delta rule programs with XLA for an H200, on a machine without a GPU.

What: JAX lowers each program with an H200 as the default device and the CUDA PJRT plugin
compiles it against a description of the H200 (``target.H200_TARGET_CONFIG``; XLA's deviceless
ahead-of-time compilation: no driver, no GPU). The programs are the Pallas forward (also with
the Mosaic GPU state kernel where it applies), forward+backward with the fused and with the
split backward, the decode step, the XLA ``chunk`` path's forward+backward, and the Pallas
forward+backward sharded over a 2 x 2 mesh of H200s (mesh axes ``Auto`` and ``Explicit``).
XLA's own Triton (the one bundled in jaxlib) turns each ``pallas_call`` into PTX, and XLA runs
ptxas on it, as it will on the GPU; the ptxas it runs is ``toolchain``'s wrapper, which keeps
each PTX with its ``-v`` report, and XLA's thunk sequence (``--xla_dump_to``) gives each
kernel's grid, threads and shared memory.

Reported per kernel: grid, threads, shared KiB, registers, spill-store bytes (and the PTX
directives); with ``nvdisasm`` (pip ``nvidia-cuda-nvdisasm``, fetched by ``make xla-aot``),
from the SASS of the cubin the wrapper keeps (``sass``): instructions and local-memory (spill)
bytes per thread outside loops and per iteration of each loop, which ptxas' static spill count
does not tell apart. Per program: compile time, XLA's temporary buffer (``memory_analysis``)
and the collectives left in the compiled module (the sharded programs should have none).
``--sweep`` compiles the Pallas programs once per (num_warps, num_stages) pair for every kernel
at once (the ``launch=`` override) and tabulates each kernel's resources per pair;
``--candidates`` compiles the forward+backward of each of ``candidates.TUNE_CANDIDATES``.

Why: ``triton_resources`` compiles the kernels' Triton IR with pip Triton, whose layouts and
pipelining are not those of jaxlib's Triton, so its shared memory and spills differ a little.
This runs the compile the GPU run will do, for the jaxlib it runs under, so a kernel that does
not compile or is over the shared-memory limit shows up before any GPU time is spent, and
launch parameters can be chosen on XLA's own numbers.

Needs the CUDA PJRT plugin of this very JAX version and a ptxas of CUDA >= 13 (``toolchain``
says where it looks). ``make xla-aot`` sets both up and runs the default report; by hand, from
the repository root::

    pip install --no-deps --target .cache/xla-aot jax-cuda13-plugin==V jax-cuda13-pjrt==V
    PYTHONPATH=.cache/xla-aot .venv/bin/python -m tools.kernel_audit.xla_aot \\
        [--shape 8,4096,6,128,256] [--dtype bfloat16] [--chunk 64] [--sweep] [--candidates] \\
        [--json F] [--keep DIR]

The POET-X block-rotation programs (``poet_programs``: the Pallas path of ``poet_linear`` at
a Llama-8B-like shape, forward and forward+backward, plain and memory-saving) follow in a report
of their own (``--no-poet`` skips them; ``--json`` writes them under ``"poet"``), and so do
the grouped-matmul programs of the mixture-of-experts layers (``moe_programs``: ``gmm_pallas``
forward and forward+backward at a Nemotron 3 Super expert shape; ``--no-moe``, ``"moe"``).

Exit status 1 when a program does not compile or a kernel is over the shared-memory limit.
Only ShapeDtypeStructs are used: nothing is allocated, and no GPU, driver or network is touched.
"""

from __future__ import annotations

import argparse
import collections
import functools
import json
import re
import shutil
import sys
import tempfile
import time
import warnings
from pathlib import Path

from . import sass
from .inputs import DEFAULT_SHAPE, abstract_inputs, parse_shape
from .target import H200_TARGET_CONFIG, SHARED_LIMIT
from .toolchain import prepare_toolchain

SWEEP = tuple((w, s) for w in (4, 8) for s in (1, 2, 3)) + ((16, 1),)
_THUNK = re.compile(
    r"\s(?P<name>[\w.$]+) grid: \[(?P<grid>[^\]]*)\] threads: \[(?P<threads>[^\]]*)\]"
    r"\s+shared_memory: (?P<shared>\d+) bytes"
)


# --------------------------------------------------------------------------------------------
# Reading back what XLA compiled: PTX entries, ptxas -v, the thunk sequence
# --------------------------------------------------------------------------------------------

_ENTRY = re.compile(r"\.entry\s+([\w$.]+)\s*\((?:[^()]|\([^()]*\))*\)\s*((?:\.\w+[^{]*?)*)\{")


def _entry_directives(ptx):
    """{entry name: its performance directives (.reqntid, .maxntid, .maxnreg, .minnctapersm)}.
    Without ``.maxnreg`` / ``.minnctapersm`` ptxas may settle on 32 registers and spill tens of
    KB per thread."""
    return {m.group(1): " ".join(m.group(2).split()) for m in _ENTRY.finditer(ptx)}


def _ptxas_per_entry(stderr):
    """{entry: (registers, spill-store bytes)} from ``ptxas -v`` output."""
    out, name, spills = {}, None, 0
    for line in stderr.splitlines():
        if m := re.search(r"Compiling entry function '([^']+)'", line):
            name, spills = m.group(1), 0
        elif (m := re.search(r"(\d+) bytes spill stores", line)) and name:
            spills = int(m.group(1))
        elif (m := re.search(r"Used (\d+) registers", line)) and name:
            out[name] = (int(m.group(1)), spills)
    return out


# --------------------------------------------------------------------------------------------
# The programs and their compile
# --------------------------------------------------------------------------------------------


def h200_devices(n=1):
    """The H200s of an n-device deviceless CUDA topology (needs the CUDA PJRT plugin)."""
    from jax.experimental import topologies

    try:
        topo = topologies.get_topology_desc(
            "h200", platform="cuda", topology=f"1x{n}x1", target_config=H200_TARGET_CONFIG
        )
    except Exception as e:  # noqa: BLE001 - any plugin failure means the same thing here
        import jax

        raise SystemExit(
            f"xla_aot: no deviceless CUDA topology ({type(e).__name__}: {e}). Install the CUDA "
            f"PJRT plugin of this JAX: pip install --no-deps --target .cache/xla-aot "
            f"jax-cuda13-plugin=={jax.__version__} jax-cuda13-pjrt=={jax.__version__} and put "
            "that folder on PYTHONPATH"
        ) from None
    return topo.devices


def _fwd_bwd(forward):
    import jax
    import jax.numpy as jnp

    loss = lambda *a: jnp.sum(forward(*a).astype(jnp.float32))
    return jax.grad(loss, argnums=tuple(range(8)))


def _pallas(shape, chunk, **kwargs):
    """The Pallas op's output ``o`` as a function of the eight sequence inputs; ``kwargs`` go
    to ``mdn_probes.pallas_op`` (backward, launch, block_v, a candidate's options)."""
    from .mdn_probes import pallas_op

    kwargs = dict(scale=shape[3] ** -0.5, chunk_size=chunk) | kwargs
    return lambda *a: pallas_op(*a, **kwargs)[0]


def _mosaic_options(shape, dtype, chunk):
    """Keyword options selecting the Mosaic GPU forward state kernel at this shape (block_v
    32, or 16 where 32 does not fit), or None where it does not apply (float32, small K)."""
    from jaxlib_ext.pallas_kernels._common import pow2

    from .mdn_probes import mosaic_state_kernel_applies

    _, t, _, kdim, vdim = shape
    for block_v in (min(32, pow2(vdim)), min(16, pow2(vdim))):
        if mosaic_state_kernel_applies(dtype, t, kdim, vdim, chunk, block_v):
            return dict(state_kernel="mosaic_gpu", block_v=block_v)
    return None


def programs(shape, dtype, chunk, launch=(), with_decode=True, with_xla=True):
    """[(name, fn, args)]: each fn is named ``mdn_*`` so that its XLA module is jit_mdn_*.
    ``launch`` reaches every sequence kernel (the decode step has fixed launch parameters)."""
    from jaxlib_ext.pallas_kernels.mdn import momentum_delta_rule
    from jaxlib_ext.pallas_kernels.mdn.decode import momentum_delta_rule_step_pallas

    seq, one = abstract_inputs(shape, dtype)
    scale = shape[3] ** -0.5
    pallas = functools.partial(_pallas, shape, chunk, launch=launch)
    out = [
        ("mdn_forward", pallas(), seq),
        ("mdn_fwd_bwd_fused", _fwd_bwd(pallas(backward="pallas")), seq),
        ("mdn_fwd_bwd_split", _fwd_bwd(pallas(backward="pallas_split")), seq),
    ]
    if mosaic := _mosaic_options(shape, dtype, chunk):  # Mosaic GPU forward state kernel
        out.append(("mdn_forward_mosaic", pallas(**mosaic), seq))
    if with_decode:
        step = functools.partial(momentum_delta_rule_step_pallas, scale=scale)
        out.append(("mdn_decode_step", step, one))
    if with_xla:
        xla = lambda *a: momentum_delta_rule(*a, scale=scale, method="xla", chunk_size=chunk)[0]
        out.append(("mdn_xla_chunk_fwd_bwd", _fwd_bwd(xla), seq))
    return out


#: POET-X layer shape (n, m, b, tokens) of the deviceless compile: Llama-8B's up projection
POET_SHAPE = (4096, 14336, 256, 2048)


def poet_programs(dtype="bfloat16", shape=POET_SHAPE):
    """[(name, fn, args)] of the POET-X Pallas path (``poet_*`` kernels), named ``poet_*``."""
    import jax
    import jax.numpy as jnp

    from jaxlib_ext.pallas_kernels.poet import num_block_params, poet_linear
    from jaxlib_ext.pallas_kernels.poet.config import PoetKernelConfig

    n, m, b, t = shape
    sds = jax.ShapeDtypeStruct
    args = (sds((t, n), jnp.dtype(dtype)), sds((n, m), jnp.dtype(dtype)),
            sds((n // b, num_block_params(b)), jnp.dtype(dtype)),
            sds((m // b, num_block_params(b)), jnp.dtype(dtype)),
            sds((n,), jnp.int32), sds((m,), jnp.int32))
    cfg = PoetKernelConfig(interpret=False)

    def layer(memory):
        return lambda x, w, ti, to, pi, po: poet_linear(
            x, w, ti, to, pi, po, block_size=b, method="pallas", memory_saving=memory, config=cfg
        )

    def fwd_bwd(memory):
        loss = lambda *a: jnp.sum(layer(memory)(*a).astype(jnp.float32))  # noqa: E731
        return jax.grad(loss, argnums=(0, 2, 3))

    return [
        ("poet_forward", layer(False), args),
        ("poet_fwd_bwd", fwd_bwd(False), args),
        ("poet_fwd_bwd_memory", fwd_bwd(True), args),
    ]


#: Grouped-matmul shape (rows, K, N, groups) of the deviceless compile: the first expert matmul of
#: a Nemotron 3 Super LatentMoE layer (arXiv 2601.18089) on 8192 tokens, top-22 of 512 experts,
#: latent width 1024, expert width 2688.
MOE_SHAPE = (8192 * 22, 1024, 2688, 512)


def moe_programs(dtype="bfloat16", shape=MOE_SHAPE):
    """[(name, fn, args)] of the grouped-matmul Pallas kernels (``moe_*``), named ``moe_*``."""
    import jax
    import jax.numpy as jnp

    from jaxlib_ext.pallas_kernels.moe import gmm_pallas
    from jaxlib_ext.pallas_kernels.moe.config import GMMKernelConfig

    m, k, n, g = shape
    sds = jax.ShapeDtypeStruct
    args = (sds((m, k), jnp.dtype(dtype)), sds((g, k, n), jnp.dtype(dtype)), sds((g,), jnp.int32))
    cfg = GMMKernelConfig(interpret=False)

    def forward(lhs, rhs, sizes):
        return gmm_pallas(lhs, rhs, sizes, config=cfg)

    def loss(lhs, rhs, sizes):
        return jnp.sum(forward(lhs, rhs, sizes).astype(jnp.float32))

    return [
        ("moe_gmm_forward", forward, args),
        ("moe_gmm_fwd_bwd", jax.grad(loss, argnums=(0, 1)), args),
    ]


def candidate_programs(shape, dtype, chunk):
    """Forward+backward of each of ``candidates.TUNE_CANDIDATES`` (what ``tuning`` times on a
    GPU): a candidate that XLA refuses would only waste GPU time."""
    from .candidates import TUNE_CANDIDATES

    seq, _ = abstract_inputs(shape, dtype)
    return [
        (f"mdn_tune_{i}", _fwd_bwd(_pallas(shape, chunk, **kwargs)), seq, label)
        for i, (label, kwargs) in enumerate(TUNE_CANDIDATES)
    ]


SHARDED_MESH = {"data": 2, "tensor": 2}  # batch over "data", heads over "tensor"


def sharded_program(shape, dtype, chunk, devices, axis_type="Auto"):
    """``(mesh, program)``: the Pallas forward+backward under ``jit`` on a data x tensor mesh
    of H200s, every input sharded over batch and heads, as in sharded training; mesh axes
    ``Auto`` (custom_partitioning) or ``Explicit`` (shard_map). The op's sharding rule
    (``pallas_kernels/_partition.py``) should leave no collective and give each kernel a grid
    over its device's batch rows and heads only."""
    import jax
    import numpy as np
    from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec

    sizes = tuple(SHARDED_MESH.values())
    types = (getattr(AxisType, axis_type),) * len(sizes)
    mesh = Mesh(
        np.array(devices[: np.prod(sizes)]).reshape(sizes), tuple(SHARDED_MESH), axis_types=types
    )
    split = NamedSharding(mesh, PartitionSpec("data", None, "tensor"))  # [B, T, H, ...]
    seq, _ = abstract_inputs(shape, dtype)
    args = [jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=split) for x in seq]
    name = "mdn_fwd_bwd_sharded" + ("_explicit" if axis_type == "Explicit" else "")
    label = f"{name} " + "x".join(map(str, sizes))
    return mesh, (name, _fwd_bwd(_pallas(shape, chunk)), args, label)


_COLLECTIVE = re.compile(
    r"\b(all-gather|all-reduce|all-to-all|collective-permute|reduce-scatter)(?:-start)?\("
)


def _collectives(hlo_text):
    """{collective op: count} in a compiled module's text."""
    return dict(collections.Counter(_COLLECTIVE.findall(hlo_text)))


def _named(fn, name):
    @functools.wraps(fn)
    def program(*a):
        return fn(*a)

    program.__name__ = program.__qualname__ = name
    return program


def _new_files(folder, before, pattern):
    return sorted(p for p in Path(folder).rglob(pattern) if p not in before)


KERNEL_PREFIXES = ("mdn_", "poet_", "moe_")


def _kernels(thunk_files, ptx_files, nvdisasm=None):
    """[{name, grid, threads, shared, registers, spills, sass, directives, ptxas_args}] of the
    ``mdn_*`` (and ``poet_*``) kernels of one program, from its thunk sequence and its PTX +
    ptxas logs; ``sass`` is ``sass.profile``'s (outside, loops) from the SASS of the cubin (None
    without ``nvdisasm``)."""
    launches = {}
    for f in thunk_files:
        for m in _THUNK.finditer(f.read_text()):
            if m.group("name").startswith(KERNEL_PREFIXES):
                launches.setdefault(m.group("name"), m)
    rows = {}
    for ptx in ptx_files:
        log, args = ptx.with_name(ptx.name + ".log"), ptx.with_name(ptx.name + ".args")
        stats = _ptxas_per_entry(log.read_text()) if log.is_file() else {}
        cubin = ptx.with_name(ptx.name + ".cubin")
        local = {}
        if nvdisasm and cubin.is_file():
            local = sass.profile(sass.disassemble(cubin, nvdisasm))
        argv = args.read_text().split() if args.is_file() else []
        flags = " ".join(a for a in argv if a.startswith("-") and a != "-o")
        for name, directives in _entry_directives(ptx.read_text()).items():
            if name.startswith(KERNEL_PREFIXES):
                regs, spills = stats.get(name, (None, None))
                rows[name] = dict(
                    registers=regs,
                    spills=spills,
                    sass=local.get(name),
                    directives=directives,
                    ptxas_args=flags,
                )
    out = []
    for name in list(launches) + [n for n in rows if n not in launches]:
        m = launches.get(name)
        out.append(
            dict(
                name=name,
                grid=m.group("grid").replace(" ", "") if m else None,
                threads=int(m.group("threads").split(",")[0]) if m else None,
                shared=int(m.group("shared")) if m else None,
            )
            | rows.get(
                name, dict(registers=None, spills=None, sass=None, directives="", ptxas_args="")
            )
        )
    return out


def compile_programs(device, progs, tool, mesh=None):
    """Lower each ``(name, fn, args[, label])`` for ``device`` (under ``mesh`` if given: the
    partitioner runs inside the compile) and compile it; [{program, label, ok, seconds,
    memory, collectives, kernels | error}]."""
    import contextlib

    import jax

    results = []
    for name, fn, args, *label in progs:
        before = set(tool["save"].rglob("*")) | set(tool["dump"].rglob("*"))
        start = time.perf_counter()
        res = dict(program=name, label=label[0] if label else name)
        try:
            in_mesh = jax.set_mesh(mesh) if mesh is not None else contextlib.nullcontext()
            with jax.default_device(device), in_mesh, warnings.catch_warnings():
                warnings.simplefilter("ignore", DeprecationWarning)  # Pallas Triton deprecation
                compiled = jax.jit(_named(fn, name)).lower(*args).compile()
            mem = compiled.memory_analysis()
            res |= dict(
                ok=True,
                collectives=_collectives(compiled.as_text()),
                memory={
                    k: getattr(mem, f"{k}_size_in_bytes", None)
                    for k in ("argument", "output", "temp")
                },
            )
        except Exception as e:  # noqa: BLE001 - reported as a row, the others still run
            res |= dict(ok=False, error=f"{type(e).__name__}: {str(e)[:2000]}")
        res["seconds"] = round(time.perf_counter() - start, 1)
        thunks = _new_files(tool["dump"], before, f"*.jit_{name}.thunk_sequence.txt")
        ptx = _new_files(tool["save"], before, "*.ptx")
        res["kernels"] = _kernels(thunks, ptx, tool.get("nvdisasm"))
        results.append(res)
    return results


# --------------------------------------------------------------------------------------------
# Reports
# --------------------------------------------------------------------------------------------


def _fmt(x, unit=1):
    return "-" if x is None else (f"{x / unit:.0f}" if unit != 1 else str(x))


def _flag(k):
    bad = []
    if k["shared"] is not None and k["shared"] > SHARED_LIMIT:
        bad.append("OVER SHARED LIMIT")
    if k["registers"] is not None and k["registers"] < 64 and k["spills"]:
        bad.append("low-register fallback")
    return ", ".join(bad)


def print_report(results):
    print(
        "| program | compiled | seconds | temp MiB | collectives |\n|---|---|---:|---:|---|"
    )
    for r in results:
        temp = (r.get("memory") or {}).get("temp")
        status = "yes" if r["ok"] else f"NO: {r['error'].splitlines()[0][:120]}"
        coll = ", ".join(f"{op} x{n}" for op, n in r.get("collectives", {}).items()) or "-"
        print(f"| {r['label']} | {status} | {r['seconds']} | {_fmt(temp, 2**20)} | {coll} |")
    print(
        "\n| program | kernel | grid | threads | shared KiB | registers | spill-store B "
        "| SASS instructions | local B/thread | note |"
        "\n|---|---|---|---:|---:|---:|---:|---|---|---|"
    )
    for r in results:
        for k in r["kernels"]:
            print(
                f"| {r['label']} | {k['name']} | {k['grid'] or '-'} | {_fmt(k['threads'])} | "
                f"{_fmt(k['shared'], 1024)} | {_fmt(k['registers'])} | {_fmt(k['spills'])} | "
                f"{sass.format_spans(k.get('sass'), 'instructions')} | "
                f"{sass.format_spans(k.get('sass'), 'local_bytes')} | {_flag(k)} |"
            )
    sys.stdout.flush()


def print_sweep(sweep):
    """sweep: {(warps, stages): results} -> one row per kernel, one column per pair."""
    cells = {}
    for pair, results in sweep.items():
        for r in results:
            for k in r["kernels"]:
                cells.setdefault(k["name"], {})[pair] = k
            if not r["ok"]:
                cells.setdefault(f"({r['program']} failed)", {})[pair] = None
    head = " | ".join(f"{w} w, {s} st" for w, s in sweep)
    print(
        f"\nshared KiB / registers / spill-store B per (num_warps, num_stages):\n\n"
        f"| kernel | {head} |\n|---|" + "---|" * len(sweep)
    )
    for name, per in cells.items():
        row = []
        for pair in sweep:
            k = per.get(pair)
            row.append(
                "-"
                if not k
                else f"{_fmt(k['shared'], 1024)} / {_fmt(k['registers'])} / {_fmt(k['spills'])}"
            )
        print(f"| {name} | " + " | ".join(row) + " |")
    failures = [(p, r) for p, rs in sweep.items() for r in rs if not r["ok"]]
    if failures:
        print("\n'-' shared: the program failed, so XLA wrote no thunk sequence:")
    for (warps, stages), r in failures:
        print(f"  {warps} w, {stages} st, {r['program']}: {r['error'].splitlines()[0][:160]}")
    sys.stdout.flush()


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", type=parse_shape, default=DEFAULT_SHAPE, help="B,T,H,K,V")
    parser.add_argument("--dtype", choices=("bfloat16", "float32"), default="bfloat16")
    parser.add_argument("--chunk", type=int, default=64)
    parser.add_argument(
        "--sweep",
        action="store_true",
        help="also every kernel at 4/8 warps x 1/2/3 stages and 16 x 1",
    )
    parser.add_argument(
        "--candidates", action="store_true", help="also the tuning candidates (fwd+bwd)"
    )
    parser.add_argument("--no-xla-chunk", action="store_true", help="skip the XLA chunk path")
    parser.add_argument("--no-poet", action="store_true", help="skip the POET-X programs")
    parser.add_argument("--no-moe", action="store_true", help="skip the grouped-matmul programs")
    parser.add_argument("--json", default=None, help="also write all results here")
    parser.add_argument("--keep", default=None, help="keep the PTX, ptxas logs and dumps here")
    args = parser.parse_args(argv)

    work = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="xla_aot_"))
    tool = prepare_toolchain(work)
    import jax
    import jaxlib

    devices = h200_devices(4)
    device = devices[0]
    print(
        f"jax {jax.__version__}, jaxlib {jaxlib.__version__}; deviceless target: "
        f"{device.device_kind}; ptxas {tool['release']} ({tool['ptxas']})\n"
        f"shape B,T,H,K,V = {','.join(map(str, args.shape))}, {args.dtype}, chunk "
        f"{args.chunk}\n",
        flush=True,
    )
    progs = programs(args.shape, args.dtype, args.chunk, with_xla=not args.no_xla_chunk)
    results = compile_programs(device, progs, tool)
    for axis_type in ("Auto", "Explicit"):
        mesh, sharded = sharded_program(args.shape, args.dtype, args.chunk, devices, axis_type)
        results += compile_programs(device, [sharded], tool, mesh=mesh)
    print_report(results)
    everything = dict(
        jax=jax.__version__,
        ptxas=tool["release"],
        shape=args.shape,
        dtype=args.dtype,
        chunk=args.chunk,
        results=results,
    )
    if args.candidates:
        print("\ntuning candidates (forward+backward):\n")
        tuned = compile_programs(
            device, candidate_programs(args.shape, args.dtype, args.chunk), tool
        )
        print_report(tuned)
        everything["candidates"] = tuned
        results = results + tuned
    n, m, b, t = POET_SHAPE
    rows, k, cols, g = MOE_SHAPE
    other_ops = (  # (JSON key, skipped, title, programs)
        ("poet", args.no_poet, f"POET-X block rotation (Pallas path of poet_linear), n={n} "
         f"m={m} b={b} tokens={t}", poet_programs),
        ("moe", args.no_moe, f"Grouped matmul (Pallas path of moe.gmm), rows={rows} K={k} "
         f"N={cols} groups={g}", moe_programs),
    )
    for key, skipped, title, make_programs in other_ops:
        if skipped:
            continue
        print(f"\n{title}, {args.dtype}:\n")
        report = compile_programs(device, make_programs(args.dtype), tool)
        print_report(report)
        everything[key] = report
        results = results + report
    failed = [r for r in results if not r["ok"]]
    over = [k for r in results for k in r["kernels"] if _flag(k).startswith("OVER")]
    if args.sweep:
        sweep = {}
        for warps, stages in SWEEP:
            from jaxlib_ext.pallas_kernels.mdn.config import KERNELS

            launch = tuple((name, warps, stages) for name in KERNELS)
            sweep[(warps, stages)] = compile_programs(
                device, programs(args.shape, args.dtype, args.chunk, launch, False, False), tool
            )
            print(f"  swept {warps} warps, {stages} stages", flush=True)
        print_sweep(sweep)
        everything["sweep"] = {f"{w}w{s}s": r for (w, s), r in sweep.items()}
    if args.json:
        Path(args.json).write_text(json.dumps(everything, indent=1) + "\n")
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    if failed or over:
        print(
            f"\nFAILED: {len(failed)} program(s) did not compile; {len(over)} kernel(s) over "
            f"{SHARED_LIMIT} B of shared memory"
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
