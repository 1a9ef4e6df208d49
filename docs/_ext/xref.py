"""Python cross-references that neither the Python domain nor intersphinx resolved.

With ``nitpicky = True`` every unresolved reference is a warning, so a reference to a
``jaxlib_ext`` name that does not exist fails the build. This handler runs after intersphinx
and looks the target up as Python would, from the module and class the reference sits in:

* an object documented in this reference under another name (a re-export, or a private
  module path in a signature) links to that entry;
* an object that one of the intersphinx inventories documents under a public name
  (``jax._src.mesh.Mesh`` is ``jax.sharding.Mesh``) links there;
* any other object that exists (an undocumented helper, a type from the standard library or
  from a package without an inventory) stays plain text;
* a name that does not exist is left to Sphinx, which warns.
"""

from __future__ import annotations

import importlib
import inspect
import types

from sphinx import addnodes
from sphinx.ext import intersphinx
from sphinx.util.nodes import make_refnode

_MISSING = object()


def _import(name: str):
    """The object a dotted name refers to, or ``_MISSING``."""
    parts = name.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except Exception:  # noqa: BLE001 - an unimportable prefix: try a shorter one
            continue
        try:
            for attr in parts[i:]:
                obj = getattr(obj, attr)
        except AttributeError:
            return _MISSING
        return obj
    return _MISSING


def _defining_modules(node) -> list[str]:
    """The modules that define the objects whose descriptions hold ``node``, innermost first.

    A docstring's names are those of the module that defines the object, which is not the one
    it is documented under when a package re-exports it.
    """
    modules = []
    parent = node.parent
    while parent is not None:
        if isinstance(parent, addnodes.desc) and parent.children:
            sig = parent.children[0]
            if isinstance(sig, addnodes.desc_signature) and sig.get("module"):
                # attribute lookup, as autodoc does: a package may export a function under
                # the name of one of its submodules
                obj = _import(sig["module"])
                for attr in filter(None, sig.get("fullname", "").split(".")):
                    obj = getattr(obj, attr, None)
                module = getattr(obj, "__module__", None)
                if isinstance(module, str):
                    modules.append(module)
        parent = parent.parent
    return modules


def _candidates(target: str, node) -> list[str]:
    """Where to look for ``target``: its class, its modules and their parents, then bare."""
    target = target.lstrip(".~")
    module, cls = node.get("py:module"), node.get("py:class")
    scopes = [f"{module}.{cls}"] if module and cls else []
    for mod in [*_defining_modules(node), module]:
        if mod:
            parts = mod.split(".")
            scopes += [".".join(parts[:i]) for i in range(len(parts), 0, -1)]
    return [f"{scope}.{target}" for scope in dict.fromkeys(scopes)] + [target]


def _has_identity(obj) -> bool:
    # Equal constants can be distinct objects and interned strings shared ones: only modules,
    # classes and callables are matched by identity.
    return isinstance(obj, types.ModuleType) or inspect.isclass(obj) or callable(obj)


def _documented(app) -> dict[int, str]:
    """id -> name of every object this build documents.

    Built on the first unresolved reference, when every document has been read, and kept on
    the application (object ids mean nothing in the next process, so not on the pickled env).
    """
    cache = getattr(app, "_xref_documented", None)
    if cache is None:
        cache = {}
        for name in app.env.domains.python_domain.objects:
            obj = _import(name)
            if obj is not _MISSING and _has_identity(obj):
                cache.setdefault(id(obj), name)
        app._xref_documented = cache
    return cache


def _public_alias(env, obj, target: str) -> str | None:
    """The name under which an intersphinx inventory documents ``obj``, if any."""
    short = {getattr(obj, "__name__", None), target.rsplit(".", 1)[-1]} - {None}
    inventory = intersphinx.InventoryAdapter(env).main_inventory
    for objtype, entries in inventory.items():
        if not objtype.startswith("py:"):
            continue
        for name in entries:
            if name.rsplit(".", 1)[-1] in short and _import(name) is obj:
                return name
    return None


def resolve(app, env, node, contnode):
    """The ``missing-reference`` handler (see the module docstring)."""
    if node.get("refdomain") != "py":
        return None
    target = node["reftarget"]
    for name in _candidates(target, node):
        obj = _import(name)
        if obj is not _MISSING:
            break
    else:
        return None  # no such object: Sphinx warns
    if not _has_identity(obj):
        return contnode
    domain = env.domains.python_domain
    documented = _documented(app).get(id(obj))
    matches = domain.find_obj(env, None, None, documented, None, 0) if documented else []
    if matches:
        _, entry = matches[0]
        return make_refnode(app.builder, node["refdoc"], entry.docname, entry.node_id,
                            contnode, documented)
    alias = _public_alias(env, obj, target)
    if alias is not None:
        public = node.deepcopy()
        public["reftarget"], public["reftype"] = alias, "obj"
        found = intersphinx.missing_reference(app, env, public, contnode)
        if found is not None:
            return found
    return contnode


def setup(app):
    # After intersphinx (priority 500), before the Python domain's builtin types (900).
    app.connect("missing-reference", resolve, priority=600)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
