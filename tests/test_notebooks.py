"""Every notebook: its .ipynb is in sync with the jupytext .py, and it runs under FAST=1."""

import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.py"))
#: Notebooks whose FAST run is left to `make test-all` (marked `slow`): even shrunk, each spends
#: 20-50 s of a CI core, mostly compiling. The default run keeps one notebook of each family:
#: models_mdn (models), optimizers (optim), samplers_milp (samplers).
SLOW_NOTEBOOKS = {"distillation", "inverse_problems", "latent_inverse_problems", "latent_moe",
                  "multihost_training", "poet_x", "samplers_mallows", "samplers_smc"}

pytestmark = pytest.mark.notebook


def _fast_mode_params():
    unknown = SLOW_NOTEBOOKS - {p.stem for p in NOTEBOOKS}
    assert not unknown, f"SLOW_NOTEBOOKS names no notebook: {sorted(unknown)}"
    return [pytest.param(p, id=p.stem,
                         marks=pytest.mark.slow if p.stem in SLOW_NOTEBOOKS else ())
            for p in NOTEBOOKS]


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


@pytest.mark.parametrize("path", _fast_mode_params())
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
