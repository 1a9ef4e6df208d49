"""Where a kernel's instructions and register spills run: once, or once per loop iteration,
read from its SASS (``nvdisasm -c -ndf`` of the cubin).

ptxas' "spill stores" counts spill instructions once each, wherever they are; what they cost
depends on how often they run, and so does an instruction count. ``profile`` splits each
kernel's code into the span outside loops and one span per loop, a loop being the code from a
label back to a branch that jumps up to it, and gives each span its instruction count and the
bytes one thread moves through local memory (``LDL``/``STL``, by access width, predicated or
not) in one pass. Multiply a loop's figures by its trip count, which the caller knows (the V
loop of the backward kernels runs V / block_v times, the in-kernel forward substitution C - 1).
"""

import re
import subprocess
from typing import NamedTuple

_FUNCTION = re.compile(r"^\s*//-+ \.text\.(\S+)\s")
_LABEL = re.compile(r"^(\.L_x_\d+):")
_INSTRUCTION = re.compile(r"^\s*/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;")
_BRANCH = re.compile(r"\bBRA\b.*?(\.L_x_\d+)")
_LOCAL_WIDTH = {"": 4, ".U8": 1, ".S8": 1, ".U16": 2, ".S16": 2, ".64": 8, ".128": 16}


class SassSpan(NamedTuple):
    """A span of SASS instructions: its length and the bytes one thread moves through local
    memory (register spills) in one pass."""

    instructions: int
    local_bytes: int


def local_bytes(instruction):
    """Bytes one thread moves through local memory (LDL, STL: register spills) in one SASS
    instruction, or 0."""
    ops = instruction.split()
    op = ops[1] if ops[0].startswith("@") and len(ops) > 1 else ops[0]
    for prefix in ("LDL", "STL"):
        if op.startswith(prefix):
            return _LOCAL_WIDTH.get(op[len(prefix) :], 4)
    return 0


def profile(sass):
    """``{kernel: (outside, [loop, ...])}``, each a ``SassSpan``, from ``nvdisasm`` output:
    what runs once and what runs once per iteration of each loop."""
    funcs, name, pending = {}, None, []
    for line in sass.splitlines():
        if m := _FUNCTION.match(line):
            name, pending = m.group(1), []
            funcs[name] = ({}, [])
        elif name is None:
            continue
        elif m := _LABEL.match(line):
            pending.append(m.group(1))
        elif m := _INSTRUCTION.match(line):
            labels, code = funcs[name]
            addr = int(m.group(1), 16)
            labels.update(dict.fromkeys(pending, addr))
            pending = []
            code.append((addr, m.group(2)))
    return {fname: split_by_loops(*parsed) for fname, parsed in funcs.items()}


def split_by_loops(labels, code):
    """``(outside, [loop, ...])`` ``SassSpan``s of one kernel's ``[(address, instruction)]``,
    given its ``{label: address}``."""
    loops = []
    for addr, text in code:
        m = _BRANCH.search(text)
        if m and labels.get(m.group(1), addr) < addr:  # a backward jump closes a loop
            loops.append((labels[m.group(1)], addr))

    def span(inside):
        body = [t for addr, t in code if inside(addr)]
        return SassSpan(len(body), sum(map(local_bytes, body)))

    outside = span(lambda addr: not any(a <= addr <= b for a, b in loops))
    return outside, [span(lambda addr, a=a, b=b: a <= addr <= b) for a, b in loops]


def format_spans(spans, field):
    """``outside + a/iter + ...``: ``field`` of the code outside loops, then per iteration of
    each loop (loops with no local-memory traffic are left out of the local bytes); ``-`` when
    unknown (``spans`` None: no nvdisasm)."""
    if spans is None:
        return "-"
    outside, loops = spans
    per = [getattr(x, field) for x in loops]
    per = [x for x in per if x or field == "instructions"]
    return " + ".join([str(getattr(outside, field))] + [f"{x}/iter" for x in per])


def disassemble(cubin, nvdisasm):
    """``nvdisasm -c -ndf`` of a cubin, or "" when it fails."""
    try:
        res = subprocess.run(
            [nvdisasm, "-c", "-ndf", str(cubin)], capture_output=True, text=True, timeout=120
        )
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return res.stdout if res.returncode == 0 else ""
