"""Every notebook: its .ipynb is in sync with the jupytext .py, and it runs under FAST=1."""

import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.py"))

pytestmark = pytest.mark.notebook


def _code_cells(nb):
    return [c.source.strip() for c in nb.cells if c.cell_type == "code"]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_paired_ipynb_is_in_sync(path):
    import jupytext

    ipynb = path.with_suffix(".ipynb")
    assert ipynb.exists(), f"run: jupytext --to ipynb {path.relative_to(ROOT)}"
    assert _code_cells(jupytext.read(path)) == _code_cells(jupytext.read(ipynb)), (
        f"{ipynb.name} is stale; run: jupytext --sync {path.relative_to(ROOT)}"
    )


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_runs_fast_mode(path, tmp_path, monkeypatch):
    import jupytext
    from nbclient import NotebookClient

    monkeypatch.setenv("FAST", "1")
    monkeypatch.setenv("MPLBACKEND", "Agg")
    monkeypatch.delenv("JAX_NUM_CPU_DEVICES", raising=False)  # each notebook sets its own
    nb = jupytext.read(path)
    client = NotebookClient(
        nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    )
    client.execute()
