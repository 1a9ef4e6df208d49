"""Distillation domains available offline: text that ships with CPython, or the user's files.

* ``"docs"``: English documentation: the language-reference topics behind ``help()``
  (``pydoc_data.topics``) and the docstrings of the standard library's top-level modules;
* ``"python"``: Python source code: the standard library's top-level ``.py`` files;
* a path: a text file, or a folder searched recursively for ``.txt``, ``.md``, ``.rst`` and
  ``.py`` files.

Every domain is read in a fixed (sorted) order, so its text, and the held-out tail that
:func:`domain_corpus` keeps for evaluation, are the same on every run of one Python version.
"""

from __future__ import annotations

import ast
import pathlib
import sysconfig

from jaxlib_ext.core.data import Corpus

__all__ = ["DOMAINS", "check_domain", "domain_text", "domain_corpus", "domain_name"]

DOMAINS = ("docs", "python")
_TEXT_SUFFIXES = (".txt", ".md", ".rst", ".py")


def _stdlib_files() -> list[pathlib.Path]:
    root = pathlib.Path(sysconfig.get_paths()["stdlib"])
    return sorted(p for p in root.glob("*.py") if not p.name.startswith("_"))


def _docs_text(max_chars: int) -> str:
    from pydoc_data import topics

    parts = [topics.topics[name] for name in sorted(topics.topics)]
    size = sum(map(len, parts))
    for path in _stdlib_files():
        if size >= max_chars:
            break
        try:
            doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8")))
        except (SyntaxError, UnicodeDecodeError, ValueError):
            continue
        if doc:
            parts.append(doc)
            size += len(doc)
    return "\n\n".join(parts)


def _python_text(max_chars: int) -> str:
    parts, size = [], 0
    for path in _stdlib_files():
        if size >= max_chars:
            break
        text = path.read_text(encoding="utf-8", errors="replace")
        parts.append(f"# {path.name}\n{text}")
        size += len(text)
    return "\n\n".join(parts)


def _folder_text(path: pathlib.Path, max_chars: int) -> str:
    if path.is_file():
        return path.read_text(encoding="utf-8", errors="replace")
    files = sorted(p for p in path.rglob("*") if p.is_file() and p.suffix in _TEXT_SUFFIXES)
    if not files:
        raise ValueError(f"domain: folder {str(path)!r} holds no {'/'.join(_TEXT_SUFFIXES)} files")
    parts, size = [], 0
    for f in files:
        if size >= max_chars:
            break
        parts.append(f.read_text(encoding="utf-8", errors="replace"))
        size += len(parts[-1])
    return "\n\n".join(parts)


def check_domain(domain: str) -> None:
    """Checks that ``domain`` is one of :data:`DOMAINS` or an existing path.

    Args:
      domain: the domain's name or path.

    Raises:
      TypeError: if ``domain`` is not a str.
      ValueError: if it is neither a known domain nor an existing path.
    """
    if not isinstance(domain, str):
        raise TypeError(f"domain must be a str, got {type(domain).__name__}")
    if domain not in DOMAINS and not pathlib.Path(domain).expanduser().exists():
        raise ValueError(
            f"domain: unknown domain {domain!r}; choose one of {DOMAINS} or the path of a text "
            "file or of a folder of text files"
        )


def domain_name(domain: str) -> str:
    """A short name for ``domain``, usable as a folder name.

    Args:
      domain: one of :data:`DOMAINS` or a path.

    Returns:
      The domain itself, or the last component of the path (``"text"`` when empty).
    """
    if domain in DOMAINS:
        return domain
    return pathlib.Path(domain).name or "text"


def domain_text(domain: str, *, max_chars: int = 2_000_000) -> str:
    """The first ``max_chars`` characters of a domain's text (module docstring).

    Args:
      domain: ``"docs"``, ``"python"`` or a path.
      max_chars: the most characters to read, positive.

    Returns:
      The text, a str.

    Raises:
      TypeError: if ``domain`` is not a str.
      ValueError: if ``domain`` is unknown, a folder holds no text files, or ``max_chars`` is
        not positive.
    """
    check_domain(domain)
    if max_chars < 1:
        raise ValueError(f"max_chars must be positive, got {max_chars}")
    if domain == "docs":
        return _docs_text(max_chars)[:max_chars]
    if domain == "python":
        return _python_text(max_chars)[:max_chars]
    return _folder_text(pathlib.Path(domain).expanduser(), max_chars)[:max_chars]


def held_out_text(domain: str, *, max_chars: int = 2_000_000, eval_fraction: float = 0.1) -> str:
    """The last ``eval_fraction`` of :func:`domain_text`'s characters.

    This is the text of the tokens that :func:`domain_corpus` holds out (split by characters
    rather than tokens, so the two boundaries agree to within a token), for tasks that need
    text (the cloze task).

    Args:
      domain: ``"docs"``, ``"python"`` or a path.
      max_chars: the most characters of the whole text, positive.
      eval_fraction: the held-out fraction, in ``(0, 1)``.

    Returns:
      The held-out text, a str.

    Raises:
      ValueError: if ``eval_fraction`` is not in ``(0, 1)``, or as :func:`domain_text`.
    """
    if not 0.0 < eval_fraction < 1.0:
        raise ValueError(f"eval_fraction must be in (0, 1), got {eval_fraction}")
    text = domain_text(domain, max_chars=max_chars)
    return text[int(len(text) * (1.0 - eval_fraction)):]


def domain_corpus(domain: str, tokenizer, *, max_chars: int = 2_000_000,
                  eval_fraction: float = 0.1) -> Corpus:
    """A domain's text tokenised, its last tokens held out.

    Args:
      domain: ``"docs"``, ``"python"`` or a path.
      tokenizer: anything with ``encode`` and ``vocab_size``.
      max_chars: the most characters to read, positive.
      eval_fraction: the fraction of tokens held out as ``Corpus.eval``, in ``(0, 1)``.

    Returns:
      The :class:`~jaxlib_ext.core.data.Corpus` (``train``, ``eval``, ``vocab_size``, name
      ``"domain:<domain>"``).

    Raises:
      ValueError: if ``eval_fraction`` is not in ``(0, 1)``, or as :func:`domain_text`.
    """
    if not 0.0 < eval_fraction < 1.0:
        raise ValueError(f"eval_fraction must be in (0, 1), got {eval_fraction}")
    tokens = tokenizer.encode(domain_text(domain, max_chars=max_chars))
    split = int(len(tokens) * (1.0 - eval_fraction))
    return Corpus(tokens[:split], tokens[split:], tokenizer.vocab_size, f"domain:{domain}")
