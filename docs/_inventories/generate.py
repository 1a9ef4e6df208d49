"""Write the intersphinx inventories of JAX, Flax, Optax and NumPyro from their docs sources.

The docs build runs offline, so it cannot download each site's ``objects.inv``. This script
rebuilds the module-level part of those inventories from the reST sources each site is built
from: every ``autosummary`` entry with a ``:toctree:`` (one page per object), every
``autoclass``/``autofunction``/``autodata`` (an anchor on its page) and every ``automodule``,
under the ``currentmodule`` in force, mapped to the site's URL the way Sphinx maps a document
name. An entry is kept only if the name imports from the installed package, and the object type
comes from the object itself. Methods and attributes are left out. The files are written with
Sphinx's own inventory writer.

Run it from the repository root with a checkout of each project (any recent commit)::

    .venv/bin/python docs/_inventories/generate.py --jax ../jax --flax ../flax \\
        --optax ../optax --numpyro ../numpyro
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import inspect
import io
import re
import types
import warnings
from pathlib import Path
from types import SimpleNamespace

from sphinx.util.inventory import InventoryFile

HERE = Path(__file__).parent

#: name -> (base URL of the site, docs source root inside the checkout, API pages under it)
SITES = {
    "jax": ("https://docs.jax.dev/en/latest/", "docs", ["jax*.rst"]),
    "optax": ("https://optax.readthedocs.io/en/latest/", "docs", ["api/*.rst"]),
    "flax": ("https://flax.readthedocs.io/en/latest/", "docs_nnx", ["api_reference/**/*.rst"]),
    "numpyro": ("https://num.pyro.ai/en/latest/", "docs/source", ["*.rst"]),
}

DIRECTIVE = re.compile(r"^(\s*)\.\. (?:py:)?([\w-]+)::\s*(.*?)\s*$")
OPTION = re.compile(r"^\s*:([\w-]+):\s*(.*?)\s*$")


def _import(name: str):
    """The object a dotted name refers to, or None."""
    parts = name.split(".")
    for i in range(len(parts), 0, -1):
        try:
            with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
                warnings.simplefilter("ignore")
                obj = importlib.import_module(".".join(parts[:i]))
                for attr in parts[i:]:
                    obj = getattr(obj, attr)
        except AttributeError:
            return None
        except Exception:  # noqa: BLE001 - any import failure means "not in this install"
            continue
        return obj
    return None


def _objtype(obj) -> str:
    if isinstance(obj, types.ModuleType):
        return "module"
    if inspect.isclass(obj):
        return "exception" if issubclass(obj, BaseException) else "class"
    return "function" if callable(obj) else "data"


def _module_members(module: str, members: str) -> list[str]:
    """The names ``.. automodule:: module`` with ``:members: members`` documents."""
    if members.strip():
        return [m.strip() for m in members.split(",") if m.strip()]
    mod = _import(module)
    if not isinstance(mod, types.ModuleType):
        return []
    names = getattr(mod, "__all__", None)
    if names is None:
        names = [n for n, v in vars(mod).items()
                 if not n.startswith("_") and getattr(v, "__module__", None) == module]
    return list(names)


def _block(lines: list[str], start: int, indent: int) -> tuple[dict[str, str], list[str], int]:
    """The options and content lines of the directive whose header is ``lines[start - 1]``."""
    options, content, i = {}, [], start
    while i < len(lines):
        line = lines[i]
        if line.strip() and len(line) - len(line.lstrip()) <= indent:
            break
        match = OPTION.match(line)
        if match and not content:
            options[match[1]] = match[2]
        elif line.strip() and not line.strip().startswith(".."):
            content.append(line.strip())
        i += 1
    return options, content, i


def parse_page(text: str, docname: str) -> list[tuple[str, str, str]]:
    """(full name, document name, anchor) of every module-level object a page documents."""
    lines, found, current, i = text.splitlines(), [], None, 0
    while i < len(lines):
        match = DIRECTIVE.match(lines[i])
        i += 1
        if not match:
            continue
        indent, kind, arg = len(match[1]), match[2], match[3]
        options, content, end = _block(lines, i, indent)
        if kind in ("currentmodule", "module", "automodule"):
            current = None if arg == "None" else arg
            if kind != "currentmodule" and current:
                found.append((current, docname, f"module-{current}"))
            if kind == "automodule" and "members" in options and current:
                found += [(f"{current}.{m}", docname, f"{current}.{m}")
                          for m in _module_members(current, options["members"])]
        elif kind == "autosummary" and "toctree" in options:
            folder = options["toctree"].strip().rstrip("/")
            base = f"{docname.rsplit('/', 1)[0]}/" if "/" in docname else ""
            for entry in content:
                name = entry.split()[0].lstrip("~")
                candidates = [f"{current}.{name}", name] if current else [name]
                full = next((c for c in candidates if _import(c) is not None), candidates[0])
                found.append((full, f"{base}{folder}/{full}", full))
        elif kind == "flax_module":  # Flax's own directive: an autoclass of module.class
            full = f"{options.get('module')}.{options.get('class')}"
            found.append((full, docname, full))
        elif kind in ("autoclass", "autofunction", "autodata", "autoexception",
                      "class", "function", "data", "exception"):
            name = arg.split("(")[0].strip()
            candidates = [name] if "." in name else []
            if current:
                candidates.insert(0 if "." not in name else 1, f"{current}.{name}")
            full = next((c for c in candidates if _import(c) is not None), None)
            if full:
                found.append((full, docname, full))
        i = end if kind == "autosummary" else i
    return found


def inventory(site: str, checkout: Path) -> dict[str, tuple[str, str, str]]:
    """name -> (object type, document name, anchor) for every importable documented object."""
    _, root, patterns = SITES[site]
    src = checkout / root
    entries: dict[str, tuple[str, str, str]] = {}
    for pattern in patterns:
        for page in sorted(src.glob(pattern)):
            docname = page.relative_to(src).with_suffix("").as_posix()
            for full, doc, anchor in parse_page(page.read_text(), docname):
                obj = _import(full)
                if obj is None or full in entries:
                    continue
                entries[full] = (_objtype(obj), doc, anchor)
    return entries


def write(site: str, entries: dict[str, tuple[str, str, str]], version: str) -> Path:
    """Write ``<site>.inv`` with Sphinx's inventory writer."""
    objects = [(name, name, typ, doc, anchor, 1) for name, (typ, doc, anchor) in entries.items()]
    domain = SimpleNamespace(name="py", get_objects=lambda: objects)
    env = SimpleNamespace(
        config=SimpleNamespace(project=site, version=version),
        domains=SimpleNamespace(sorted=lambda: [domain]),
    )
    builder = SimpleNamespace(get_target_uri=lambda docname: f"{docname}.html")
    path = HERE / f"{site}.inv"
    InventoryFile.dump(path, env, builder)
    return path


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    for site in SITES:
        parser.add_argument(f"--{site}", type=Path, required=True, help=f"a {site} checkout")
    args = parser.parse_args(argv)
    for site in SITES:
        entries = inventory(site, getattr(args, site))
        path = write(site, entries, "latest")
        installed = importlib.import_module(site).__version__
        print(f"{path}: {len(entries)} objects, checked against {site} {installed}")


if __name__ == "__main__":
    main()
