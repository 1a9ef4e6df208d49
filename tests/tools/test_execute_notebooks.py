"""tools/execute_notebooks.py (`make notebooks`): outputs stored, a failure names its notebook."""

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_stores_outputs_and_names_the_failing_notebook(tmp_path):
    import jupytext

    (tmp_path / "good.py").write_text(
        '# %%\nimport os\nprint("FAST =", os.environ.get("FAST"))\n')
    (tmp_path / "bad.py").write_text('# %%\nraise ValueError("boom")\n')
    out = tmp_path / "out" / "nested"  # made by the tool
    r = subprocess.run(
        [sys.executable, "tools/execute_notebooks.py", "--fast", "--timeout", "120",
         "--out", str(out), str(tmp_path / "good.py"), str(tmp_path / "bad.py")],
        cwd=REPO, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert r.returncode == 1, r.stdout + r.stderr
    assert f"FAILED {tmp_path / 'bad.py'}" in r.stderr and "boom" in r.stderr
    assert not (out / "bad.ipynb").exists()
    cell = jupytext.read(out / "good.ipynb").cells[0]
    assert cell.outputs[0]["text"] == "FAST = 1\n"
