"""The layer contracts of ``pyproject.toml`` catch a violation.

``make lint`` checks that the contracts hold on the package as installed; here one wrong-way
import (a family importing the commands) is planted in an installed copy, and import-linter
must report the layer contract broken.
"""

import pathlib
import shutil
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
LINT_IMPORTS = pathlib.Path(sys.executable).with_name("lint-imports")


@pytest.mark.skipif(not LINT_IMPORTS.exists(), reason="import-linter (the lint extra) missing")
def test_a_family_importing_the_commands_breaks_the_layer_contract(tmp_path):
    tree = tmp_path / "site"
    shutil.copytree(ROOT / "jaxlib_ext", tree / "jaxlib_ext",
                    ignore=shutil.ignore_patterns("__pycache__", "data_files"))
    for folder in ("models", "optim", "samplers", "pallas_kernels"):  # pyproject's package-dir
        shutil.copytree(ROOT / folder, tree / "jaxlib_ext" / folder,
                        ignore=shutil.ignore_patterns("__pycache__", "data"))

    def lint() -> subprocess.CompletedProcess:
        return subprocess.run([str(LINT_IMPORTS), str(ROOT / "pyproject.toml"), "--no-cache"],
                              cwd=tree, capture_output=True, text=True, timeout=300)

    kept = lint()
    assert kept.returncode == 0, kept.stdout[-3000:]
    module = tree / "jaxlib_ext" / "models" / "mqar.py"
    module.write_text(module.read_text() + "\nfrom jaxlib_ext.cli import train  # noqa\n")
    broken = lint()
    assert broken.returncode != 0
    assert "jaxlib_ext.models.mqar -> jaxlib_ext.cli.train" in broken.stdout, broken.stdout[-3000:]
