"""Every Python example in README.md runs as written (8 simulated CPU devices).

The examples run one after another in one worker interpreter, each with fresh globals and its
own empty working directory, so that they pay for importing JAX and the library once; a worker
that dies (a crash in native code) is replaced for the next example.
"""

import json
import os
import pathlib
import re
import select
import subprocess
import sys

import pytest

README = pathlib.Path(__file__).resolve().parents[1] / "README.md"
TIMEOUT = 600  # seconds an example may take
EXAMPLES = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)

# reads one JSON request per line, {"code", "cwd"}, and answers {"ok", "error"} on one line
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
        exec(compile(request["code"], "<README example>", "exec"), {"__name__": "__main__"})
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

    def run(self, code: str, cwd: pathlib.Path) -> dict:
        self.proc.stdin.write(json.dumps({"code": code, "cwd": str(cwd)}) + "\n")
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


@pytest.mark.parametrize("code", EXAMPLES, ids=[f"example{i}" for i in range(len(EXAMPLES))])
def test_readme_example_runs(code, worker, tmp_path):
    if worker[0].proc.poll() is not None:
        worker[0] = _Worker()
    reply = worker[0].run(code, tmp_path)
    assert reply["ok"], reply["error"]
