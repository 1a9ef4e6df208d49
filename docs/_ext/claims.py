"""The ``claims`` directive: a method's rows of the claims table of BENCHMARKS.md.

BENCHMARKS.md opens with one table, one row per claim of each implemented paper, whose first
cell names the method and the paper (``Normalized energy prior (2605.15487)``). A method page
shows its rows with

.. code-block:: markdown

   ```{claims} Normalized energy prior
   ```

which renders the table's header and every row whose first cell starts with the argument,
read from BENCHMARKS.md when the page is built, so that the numbers have one source. Several
prefixes may be given, separated by ``;``. The page is rebuilt when BENCHMARKS.md changes.

The build fails, with an error naming the page and the line (and ``sphinx-build`` exits with
status 1 even without ``-W``), when no row matches, when the table is not found, or when a row
has more or fewer cells than the header (an unescaped ``|`` inside a cell splits it, on GitHub
too).
"""

from __future__ import annotations

import re
from pathlib import Path

from docutils import nodes
from docutils.statemachine import StringList
from sphinx.util import logging
from sphinx.util.docutils import SphinxDirective

logger = logging.getLogger(__name__)

#: the heading the claims table follows, and where the file is (relative to the docs folder)
HEADING = "## Paper claims"
DEFAULT_FILE = "../BENCHMARKS.md"

_CELL_SPLIT = re.compile(r"(?<!\\)\|")


def split_row(line: str) -> list[str]:
    """The cells of one Markdown table row (``\\|`` is a literal pipe inside a cell)."""
    text = line.strip()
    if text.startswith("|"):
        text = text[1:]
    if text.endswith("|") and not text.endswith("\\|"):
        text = text[:-1]
    return [cell.strip() for cell in _CELL_SPLIT.split(text)]


def read_table(path: Path) -> tuple[list[str], list[tuple[int, str]]]:
    """``(header_and_separator_lines, [(line_number, row_line), ...])`` of the claims table.

    Raises:
      ValueError: the file has no claims heading, no table under it, or a row whose number of
        cells differs from the header's.
    """
    lines = path.read_text(encoding="utf-8").splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith(HEADING)), None)
    if start is None:
        raise ValueError(f"{path} has no heading starting with {HEADING!r}")
    first = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("|")), None)
    if first is None or first + 1 >= len(lines) or not lines[first + 1].startswith("|"):
        raise ValueError(f"{path}: no table under the heading {lines[start]!r}")
    head, separator = lines[first], lines[first + 1]
    width = len(split_row(head))
    rows = []
    for number in range(first + 2, len(lines)):
        line = lines[number]
        if not line.startswith("|"):
            break
        cells = split_row(line)
        if len(cells) != width:
            raise ValueError(
                f"{path}:{number + 1}: the claims row {cells[0][:50]!r} has {len(cells)} cells, "
                f"the header {width} (escape a '|' inside a cell as '\\|')")
        rows.append((number + 1, line))
    if not rows:
        raise ValueError(f"{path}: the claims table has no rows")
    return [head, separator], rows


class ClaimsDirective(SphinxDirective):
    """``{claims} PREFIX[; PREFIX...]``: the claims rows whose first cell starts with a prefix."""

    required_arguments = 1
    final_argument_whitespace = True
    has_content = False

    def _fail(self, message: str) -> list[nodes.Node]:
        """Log ``message`` as an error at the directive and mark the build as failed."""
        logger.error("claims: %s", message, location=(self.env.docname, self.lineno),
                     type="claims")
        failed = getattr(self.env, "claims_failures", {})
        failed.setdefault(self.env.docname, []).append(message)
        self.env.claims_failures = failed
        return []

    def run(self) -> list[nodes.Node]:
        prefixes = [p.strip() for p in self.arguments[0].split(";") if p.strip()]
        path = (Path(self.env.srcdir) / self.config.claims_file).resolve()
        if not path.is_file():
            return self._fail(f"{path} does not exist")
        self.env.note_dependency(str(path))
        try:
            header, rows = read_table(path)
        except ValueError as error:
            return self._fail(str(error))
        chosen = [line for _, line in rows
                  if any(split_row(line)[0].startswith(p) for p in prefixes)]
        if not chosen:
            firsts = sorted({split_row(line)[0] for _, line in rows})
            return self._fail(
                f"no row of the claims table in {path.name} has a first cell starting with "
                f"{' or '.join(map(repr, prefixes))}; the first cells are: " + "; ".join(firsts))
        if not hasattr(self.state, "_renderer"):
            return self._fail("the directive needs a MyST (Markdown) page")
        container = nodes.container(classes=["claims"])
        self.state.nested_parse(StringList([*header, *chosen], source=str(path)),
                                self.content_offset, container)
        return [container]


def _purge(app, env, docname):
    getattr(env, "claims_failures", {}).pop(docname, None)


def _merge(app, env, docnames, other):
    failed = getattr(env, "claims_failures", {})
    failed.update(getattr(other, "claims_failures", {}))
    env.claims_failures = failed


def _finish(app, exception):
    if exception is None and getattr(app.env, "claims_failures", None):
        app.statuscode = 1


def setup(app):
    app.add_config_value("claims_file", DEFAULT_FILE, "env", types=[str])
    app.add_directive("claims", ClaimsDirective)
    app.connect("env-purge-doc", _purge)
    app.connect("env-merge-info", _merge)
    app.connect("build-finished", _finish)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
