"""Every Python example of README.md and of the method pages (docs/methods/*.md) runs as
written (8 simulated CPU devices).

The examples run one after another in one worker interpreter, each with fresh globals and its
own empty working directory, so that they pay for importing JAX and the library once; a worker
that dies (a crash in native code) is replaced for the next example. An example that appears in
several files (a method page repeating the README's example of its family) runs once. Blocks
fenced as ``python`` run; code that is not meant to run here (GPU-only, several hosts, the
command line) goes in another fence (``bash``, or MyST's ``{code-block} python``).
"""

import json
import os
import pathlib
import re
import select
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
METHOD_PAGES = sorted((ROOT / "docs" / "methods").glob("*.md"))
TIMEOUT = 600  # seconds an example may take


def _examples() -> dict[str, str]:
    """``{id: code}`` of every ``python`` block, the README first, each code once."""
    examples, seen = {}, set()
    for path in [README, *METHOD_PAGES]:
        name = path.relative_to(ROOT).as_posix()
        for i, code in enumerate(re.findall(r"```python\n(.*?)```", path.read_text(), re.S)):
            if code not in seen:
                seen.add(code)
                examples[f"{name}-{i}"] = code
    return examples


EXAMPLES = _examples()

# reads one JSON request per line, {"name", "code", "cwd"}, and answers {"ok", "error"} on one line
_WORKER = r"""
import json, os, sys, traceback
# answers go to a private copy of stdout; whatever an example prints, from Python or from native
# code, goes to stderr
answer = os.fdopen(os.dup(1), "w")
os.dup2(2, 1)
sys.stdout = sys.stderr
for line in sys.stdin:
    request = json.loads(line)
    os.chdir(request["cwd"])
    try:
        exec(compile(request["code"], request["name"], "exec"), {"__name__": "__main__"})
        reply = {"ok": True, "error": ""}
    except BaseException:
        reply = {"ok": False, "error": traceback.format_exc()[-3000:]}
    try:
        import matplotlib.pyplot as plt
        plt.close("all")
    except ImportError:
        pass
    answer.write(json.dumps(reply) + "\n")
    answer.flush()
"""


class _Worker:
    def __init__(self):
        env = {**os.environ, "JAX_NUM_CPU_DEVICES": "8", "JAX_PLATFORMS": "cpu",
               "MPLBACKEND": "Agg"}
        self.proc = subprocess.Popen([sys.executable, "-u", "-c", _WORKER], env=env, text=True,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL)

    def run(self, name: str, code: str, cwd: pathlib.Path) -> dict:
        request = {"name": f"<example {name}>", "code": code, "cwd": str(cwd)}
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()
        if not select.select([self.proc.stdout], [], [], TIMEOUT)[0]:
            self.proc.kill()
            return {"ok": False, "error": f"no answer within {TIMEOUT} s"}
        line = self.proc.stdout.readline()
        if not line:
            return {"ok": False, "error": f"the worker died (exit code {self.proc.wait()})"}
        return json.loads(line)

    def close(self):
        if self.proc.poll() is None:
            self.proc.stdin.close()
            self.proc.wait(timeout=60)


@pytest.fixture(scope="module")
def worker():
    box = [_Worker()]
    yield box
    box[0].close()


def test_the_examples_are_found():
    names = set(EXAMPLES)
    assert any(n.startswith("README.md-") for n in names), "README.md has no python example"
    assert METHOD_PAGES, "docs/methods/ has no page"
    assert any(n.startswith("docs/methods/") for n in names), "no method page has an example"


@pytest.mark.parametrize("name", list(EXAMPLES))
def test_example_runs(name, worker, tmp_path):
    if worker[0].proc.poll() is not None:
        worker[0] = _Worker()
    reply = worker[0].run(name, EXAMPLES[name], tmp_path)
    assert reply["ok"], reply["error"]
