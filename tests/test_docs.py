"""The documentation site: it builds without a warning, documents every public name, and renders
in a browser.

One build per module, with notebook execution off (the pages show the outputs stored in the
.ipynb files), as ``make docs DOCS_EXECUTE=0`` runs it. The browser checks use headless Chromium
and skip without it, unless ``JAXLIB_EXT_REQUIRE_CHROMIUM=1`` (CI), where they fail.
"""

import ast
import importlib
import inspect
import os
import shutil
import subprocess
import sys
import types
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"


def _families() -> list[str]:
    """The packages of conf.py's FAMILIES, read without importing conf.py (it sets env vars)."""
    tree = ast.parse((DOCS / "conf.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", None) == "FAMILIES":
            return [package for _, package in ast.literal_eval(node.value)]
    raise AssertionError("docs/conf.py defines no FAMILIES")


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """The built site's folder; fails with Sphinx's output on any warning."""
    out = tmp_path_factory.mktemp("site")
    env = {**os.environ, "JAXLIB_EXT_DOCS_EXECUTE": "0", "JAX_PLATFORMS": "cpu"}
    cmd = [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", "html",
           "-d", str(out / "doctrees"), str(DOCS), str(out / "html")]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    build = f"{' '.join(cmd)}\n--- stdout\n{r.stdout}\n--- stderr\n{r.stderr}"
    assert r.returncode == 0 and not r.stderr.strip(), f"the docs build warned:\n{build}"
    return out / "html"


@pytest.fixture(scope="module")
def inventory(site) -> dict[str, tuple[str, str]]:
    """name -> (object type, page#anchor) of every object of the built objects.inv."""
    from sphinx.util.inventory import InventoryFile

    inv = InventoryFile.loads((site / "objects.inv").read_bytes(), uri="")
    return {name: (objtype, item.uri) for objtype, items in inv.data.items()
            for name, item in items.items()}


def _public_names():
    """(module, name, object) of every family's ``__all__``, into the submodules it names."""
    todo, seen = list(_families()), set()
    while todo:
        module = importlib.import_module(todo.pop(0))
        if module.__name__ in seen:
            continue
        seen.add(module.__name__)
        for name in module.__all__:
            obj = getattr(module, name)
            if isinstance(obj, types.ModuleType):
                todo.append(obj.__name__)
            yield module.__name__, name, obj


def _lookup(name: str):
    """The object of a dotted name (a module, or attributes of one), or None."""
    parts = name.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for attr in parts[i:]:
            obj = getattr(obj, attr, None)
        return obj
    return None


def _identity(obj) -> bool:
    return isinstance(obj, types.ModuleType) or inspect.isclass(obj) or callable(obj)


def test_site_builds_without_warnings(site):
    assert (site / "index.html").is_file()
    for notebook in sorted((ROOT / "notebooks").glob("*.ipynb")):
        assert (site / "notebooks" / f"{notebook.stem}.html").is_file(), notebook.name


def test_every_public_name_is_in_the_reference(inventory):
    """Under its own name, or, for a re-export, under the name it is documented at."""
    documented = {}
    for name, (objtype, _) in inventory.items():
        if name.startswith("jaxlib_ext.") and objtype.startswith("py:"):
            obj = _lookup(name)
            if obj is not None and _identity(obj):
                documented[id(obj)] = name
    missing = []
    for module, name, obj in _public_names():
        full = obj.__name__ if isinstance(obj, types.ModuleType) else f"{module}.{name}"
        if full not in inventory and not (_identity(obj) and id(obj) in documented):
            missing.append(f"{module}.{name}")
    assert not missing, f"public names missing from the built reference: {missing}"


def _dom(url: str, profile: Path) -> str:
    """The DOM of ``url`` after its scripts ran, from headless Chromium."""
    if not Path(CHROMIUM).exists():
        reason = f"headless Chromium not found at {CHROMIUM} (Debian: apt-get install chromium)"
        if os.environ.get("JAXLIB_EXT_REQUIRE_CHROMIUM") == "1":
            pytest.fail(f"JAXLIB_EXT_REQUIRE_CHROMIUM=1 but {reason}")
        pytest.skip(reason)
    cmd = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
           "--no-first-run", "--disable-background-networking", "--disable-component-update",
           "--disable-sync", f"--user-data-dir={profile}", "--virtual-time-budget=5000",
           "--dump-dom", url]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "<body" in r.stdout, f"chromium failed on {url}:\n{r.stderr}"
    return r.stdout


def test_pages_render_in_a_browser(site, inventory, tmp_path):
    index = _dom((site / "index.html").as_uri(), tmp_path)
    assert "jaxlib_ext" in index and 'href="api/index.html"' in index

    # the optimizers page: every object documented there is on it
    page = _dom((site / "api" / "optim.html").as_uri(), tmp_path)
    on_page = {n: uri.partition("#")[2] for n, (_, uri) in inventory.items()
               if uri.startswith("api/optim.html#")}
    assert on_page, "objects.inv places nothing on api/optim.html"
    absent = [n for n, anchor in on_page.items() if f'id="{anchor}"' not in page]
    assert not absent, f"api/optim.html does not render: {absent}"

    # the search page finds a public function by its short name (its JavaScript has to run)
    name = next(n for n in on_page if inventory[n][0] == "py:function")
    short = name.rsplit(".", 1)[-1]
    found = _dom(f"{(site / 'search.html').as_uri()}?q={short}", tmp_path)
    assert f'href="api/optim.html#{on_page[name]}"' in found, (
        f"searching {short!r} does not list {name}")
