"""The commands: ``python -m jaxlib_ext <command> ...`` and the ``jaxlib-ext`` script.

One module per command, each with ``build_parser()`` and ``main(argv) -> int``; :data:`COMMANDS`
is the one registry. This package is the composition root: it may import every layer of the
library, and no library module imports it (an import-linter contract in ``pyproject.toml``).
A command's module is imported only when that command runs, so ``--help`` stays cheap and a
family that fails to import breaks only its own command.
"""

from __future__ import annotations

import argparse
import importlib
import sys

__all__ = ["COMMANDS", "build_parser", "main"]

#: command -> (module, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "train": ("jaxlib_ext.cli.train", "train a language model on a text corpus"),
    "grow": ("jaxlib_ext.cli.grow", "grow a trained LM checkpoint (depth, experts) for a new run"),
    "distill": ("jaxlib_ext.cli.distill", "distil a GGUF teacher LM into an xLSTM student"),
    "milp": ("jaxlib_ext.cli.milp", "solve a MILP (MPS/LP file) by learned Langevin sampling"),
    "milp-train": ("jaxlib_ext.cli.milp_train",
                   "train the learned MILP proposal on generated instances of one family"),
    "ldm": ("jaxlib_ext.cli.ldm", "train the MNIST latent diffusion model"),
    "energy": ("jaxlib_ext.cli.energy", "train a normalized energy prior on digits"),
}


def build_parser() -> argparse.ArgumentParser:
    """The top-level parser: lists the commands; each command parses its own arguments."""
    parser = argparse.ArgumentParser(
        prog="python -m jaxlib_ext",
        description="ICML 2026 methods as pure, composable JAX functions: the commands.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (_, help_text) in COMMANDS.items():
        sub.add_parser(name, help=help_text, add_help=False)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Runs ``argv[0]``'s command with the rest of ``argv``; returns its exit status."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] not in COMMANDS:
        build_parser().parse_args(argv)  # prints the usage (or --help) and exits
        return 2
    return importlib.import_module(COMMANDS[argv[0]][0]).main(argv[1:])
