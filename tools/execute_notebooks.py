"""Regenerate notebooks' .ipynb from their jupytext .py and store the outputs of a run in them.

``make notebooks`` runs every notebook in full (``FAST`` unset), so that the committed .ipynb
files show a full run's outputs and plots on GitHub and Colab before anything runs, and
``make docs DOCS_EXECUTE=0`` renders them. Each notebook first goes through
``jupytext --sync`` (the .py and .ipynb agree, whichever was edited), then runs in a fresh
kernel inside a temporary folder, within a wall-clock budget; a notebook that fails or runs out
of time is named, its .ipynb left as it was, and the others still run.

    python tools/execute_notebooks.py [--timeout SECONDS] [--fast] [--out DIR] notebooks/*.py
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path


def execute(path: Path, out: Path, timeout: float, fast: bool) -> str | None:
    """Run the notebook paired with ``path`` and write it to ``out``; the error, or None."""
    import jupytext
    from jupytext.cli import jupytext as jupytext_cli
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError, CellTimeoutError

    jupytext_cli(["--sync", "--quiet", str(path)])
    nb = jupytext.read(path)
    deadline = time.monotonic() + timeout
    # The kernel inherits this environment: FAST as asked; ipykernel's inline backend, so plots
    # become outputs; no device count, each notebook sets its own.
    os.environ.pop("FAST", None)
    if fast:
        os.environ["FAST"] = "1"
    os.environ.pop("MPLBACKEND", None)
    os.environ.pop("JAX_NUM_CPU_DEVICES", None)
    with tempfile.TemporaryDirectory(prefix=f"{path.stem}-") as cwd:
        client = NotebookClient(
            nb, kernel_name="python3", resources={"metadata": {"path": cwd}},
            timeout_func=lambda cell: max(1, int(deadline - time.monotonic())),
            record_timing=False,  # no per-cell timestamps: reruns change only real outputs
        )  # fmt: skip
        try:
            client.execute()
        except CellTimeoutError:
            return f"{path}: ran past its {timeout:.0f} s budget"
        except CellExecutionError as err:
            return f"{path}: a cell raised\n{err}"
    jupytext.write(nb, out)
    return None


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("notebooks", nargs="+", type=Path, help="jupytext .py notebooks")
    parser.add_argument("--timeout", type=float, default=7200,
                        help="wall-clock seconds per notebook (default 7200)")
    parser.add_argument("--fast", action="store_true", help="run with FAST=1 (a quick check)")
    parser.add_argument("--out", type=Path,
                        help="write the .ipynb files here instead of beside each .py")
    args = parser.parse_args(argv)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
    failed = []
    for path in args.notebooks:
        out = (args.out or path.parent) / f"{path.stem}.ipynb"
        start = time.monotonic()
        print(f"{path}: running ({'FAST' if args.fast else 'full'})", flush=True)
        error = execute(path, out, args.timeout, args.fast)
        if error:
            print(f"FAILED {error}", file=sys.stderr, flush=True)
            failed.append(str(path))
        else:
            print(f"{path}: wrote {out} in {time.monotonic() - start:.0f} s", flush=True)
    if failed:
        print(f"{len(failed)} notebook(s) failed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
