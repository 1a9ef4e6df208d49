"""The exit status every command shares: 0 done, 2 bad input, 3 a loss became non-finite."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

BAD_INPUT = (ValueError, TypeError, FileNotFoundError)


def run_command(run: Callable[[argparse.Namespace], object], args: argparse.Namespace, *,
                message: Callable[[str], str] = str) -> int:
    """``run(args)``, its errors printed as ``error: ...`` (through ``message``, which may map a
    library's argument names to flags) and turned into the exit status."""
    try:
        run(args)
    except BAD_INPUT as e:
        print(f"error: {message(str(e))}", file=sys.stderr)
        return 2
    except FloatingPointError as e:  # a NaN stop names the step and the last good checkpoint
        print(f"error: {message(str(e))}", file=sys.stderr)
        return 3
    return 0
