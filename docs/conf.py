"""Sphinx configuration: the API reference is generated from each family's ``__all__``."""

from __future__ import annotations

import importlib
import inspect
import os
import shutil
import sys
import types
import typing
from pathlib import Path

DOCS_DIR = Path(__file__).parent
# Local extensions: every module of docs/_ext is loaded as one.
sys.path.insert(0, str(DOCS_DIR / "_ext"))

project = "jaxlib_ext"
author = "jaxlib_ext developers"
extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.intersphinx",
    "sphinx.ext.napoleon",
    "sphinx.ext.viewcode",
    "myst_nb",  # Markdown (it loads myst_parser) and the .ipynb notebooks
    "sphinx_copybutton",
    *sorted(p.stem for p in (DOCS_DIR / "_ext").glob("*.py")),
]
exclude_patterns = ["_build", "_inventories", "**.ipynb_checkpoints"]
html_theme = "furo"
html_title = "jaxlib_ext"
napoleon_google_docstring = True
napoleon_numpy_docstring = False
autodoc_typehints = "signature"
autodoc_member_order = "bysource"
autodoc_default_options = {"show-inheritance": False}

# Every unresolved reference is a warning (an error under -W): a link to a jaxlib_ext name that
# does not exist fails the build. Names that exist but have no page of their own (third-party
# types without an inventory, undocumented helpers) are rendered as text by _ext/xref.py.
nitpicky = True
# myst warns on a Markdown link to a missing document; with heading anchors, to a missing
# heading too.
myst_heading_anchors = 3

# The build never touches the network, so the other projects' objects.inv cannot be fetched.
# Their module-level entries are shipped in _inventories/, generated from each project's docs
# sources and checked against the installed packages by _inventories/generate.py, and point at
# each site's "latest" pages.
intersphinx_mapping = {
    name: (url, str(DOCS_DIR / "_inventories" / f"{name}.inv"))
    for name, url in {
        "jax": "https://docs.jax.dev/en/latest/",
        "flax": "https://flax.readthedocs.io/en/latest/",
        "optax": "https://optax.readthedocs.io/en/latest/",
        "numpyro": "https://num.pyro.ai/en/latest/",
    }.items()
}

# Notebooks. JAXLIB_EXT_DOCS_EXECUTE=0 renders the outputs stored in the .ipynb files;
# otherwise myst-nb runs every notebook, in FAST mode unless FAST is set (FAST=0: full runs).
EXECUTE = os.environ.get("JAXLIB_EXT_DOCS_EXECUTE", "1") != "0"
if EXECUTE:
    os.environ.setdefault("FAST", "1")  # the kernels inherit the environment
    os.environ.pop("MPLBACKEND", None)  # ipykernel's inline backend: plots become outputs
nb_execution_mode = "force" if EXECUTE else "off"
nb_execution_timeout = 900  # seconds per cell
nb_execution_raise_on_error = True
nb_execution_show_tb = True
nb_execution_in_temp = True  # files a notebook writes land in a temporary folder
nb_merge_streams = True
NOTEBOOKS_SRC = DOCS_DIR.parent / "notebooks"
NOTEBOOKS_DIR = DOCS_DIR / "notebooks"

# (title, package) of every family page, in the layer order of the README.
FAMILIES = (
    ("Runtime", "jaxlib_ext.core"),
    ("Pallas kernels", "jaxlib_ext.pallas_kernels"),
    ("Optimizers", "jaxlib_ext.optim"),
    ("Models", "jaxlib_ext.models"),
    ("Samplers", "jaxlib_ext.samplers"),
)
API_DIR = DOCS_DIR / "api"


def _directive(obj) -> str:
    return "autoclass" if inspect.isclass(obj) else "autofunction"


def _entries(module_name: str, seen: set[int]) -> tuple[list[str], list[str]]:
    """The reST of every public name of ``module_name``, and the names without a docstring.

    An object re-exported by several modules is documented once, under the first name met.
    """
    module = importlib.import_module(module_name)
    names = getattr(module, "__all__", None)
    if names is None:
        raise RuntimeError(f"{module_name} has no __all__")
    lines, missing, submodules = [], [], []
    for name in names:
        obj = getattr(module, name)
        if isinstance(obj, types.ModuleType):
            submodules.append(obj.__name__)
            continue
        if typing.get_origin(obj) is not None or not (inspect.isclass(obj) or callable(obj)):
            # constants and type aliases: their type's docstring is not theirs, so show the value
            # :module: rather than a dotted name, which Sphinx would prefix with the module
            lines += [f".. py:data:: {name}", f"   :module: {module_name}",
                      f"   :value: {obj!r}", ""]
            continue
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        if not (obj.__doc__ or "").strip():
            missing.append(f"{module_name}.{name}")
        lines += [f".. {_directive(obj)}:: {module_name}.{name}", ""]
    for sub in submodules:
        title = sub
        lines += [title, "-" * len(title), "", f".. automodule:: {sub}", "   :no-members:", ""]
        sub_lines, sub_missing = _entries(sub, seen)
        lines += sub_lines
        missing += sub_missing
    return lines, missing


def _write_if_changed(path: Path, text: str) -> None:
    # an unchanged page keeps its mtime, so an incremental build does not re-read it
    if not path.exists() or path.read_text() != text:
        path.write_text(text)


def write_api_pages(app=None) -> list[str]:
    """Write ``api/<family>.rst`` for every family; return the public names without docs."""
    API_DIR.mkdir(exist_ok=True)
    missing_all, toc = [], []
    for title, package in FAMILIES:
        stem = package.split(".")[-1]
        lines, missing = _entries(package, set())
        missing_all += missing
        head = f"{title}: ``{package}``"
        page = [head, "=" * len(head), "", f".. automodule:: {package}", "   :no-members:", ""]
        _write_if_changed(API_DIR / f"{stem}.rst", "\n".join(page + lines) + "\n")
        toc.append(f"   {stem}")
    index = ["API reference", "=============", "", ".. toctree::", "   :maxdepth: 1", "", *toc]
    _write_if_changed(API_DIR / "index.rst", "\n".join(index) + "\n")
    if app is not None and missing_all:
        from sphinx.util import logging
        logging.getLogger(__name__).warning(
            "public names without a docstring: %s", ", ".join(missing_all))
    return missing_all


def copy_notebooks(app=None) -> list[Path]:
    """Copy ``notebooks/*.ipynb`` into ``docs/notebooks/`` (gitignored), where Sphinx reads them.

    Copies rather than symbolic links: they work on every checkout (Windows, archives) and
    myst-nb reads them like any source. A file is rewritten only when it changed, so an
    incremental build re-reads only the notebooks that did.
    """
    copied = []
    for src in sorted(NOTEBOOKS_SRC.glob("*.ipynb")):
        dst = NOTEBOOKS_DIR / src.name
        if not dst.exists() or dst.read_bytes() != src.read_bytes():
            shutil.copyfile(src, dst)
        copied.append(dst)
    for stale in set(NOTEBOOKS_DIR.glob("*.ipynb")) - set(copied):
        stale.unlink()
    return copied


def setup(app):
    app.connect("builder-inited", write_api_pages)
    app.connect("builder-inited", copy_notebooks)
