"""A trainer case run in its own process, killed with SIGKILL at a chosen step.

``python trainer_worker.py CASE OUT STEPS --kill-at K`` runs ``trainer_cases.CASE.run(OUT,
steps=STEPS)`` and kills the process when the engine asks for step ``K``'s batch: step ``K - 1``
is done and its checkpoint (when due) is still being written by the asynchronous save.
"""

from __future__ import annotations

import argparse
import importlib
import os
import pathlib
import signal
import sys


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("case")
    parser.add_argument("out", type=pathlib.Path)
    parser.add_argument("steps", type=int)
    parser.add_argument("--kill-at", type=int, required=True)
    args = parser.parse_args()

    from jaxlib_ext.core import loop

    run_loop = loop.run_loop

    def dying_run_loop(step_fn, state, batch_fn, config, **kwargs):
        def batch_or_die(step):
            if step == args.kill_at:
                os.kill(os.getpid(), signal.SIGKILL)
            return batch_fn(step)

        return run_loop(step_fn, state, batch_or_die, config, **kwargs)

    loop.run_loop = dying_run_loop
    sys.path.insert(0, str(pathlib.Path(__file__).parent))
    importlib.import_module(f"trainer_cases.{args.case}").run(args.out, steps=args.steps)
    sys.exit("the run was not killed")


if __name__ == "__main__":
    main()
