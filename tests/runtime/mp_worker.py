"""A training process for the multi-process tests (not collected by pytest).

Runs the CLI's ``train`` command with the given flags, then gathers the final parameters
from every process and lets process 0 write them, with the step the run started from, to
``--dump`` (an ``.npz``: ``arr_0, arr_1, ...`` and ``start_step``).

Failure injection: every process SIGKILLs itself at the same point of the run, the way a
preempted host dies. The points are events of the run, never moments in time:

* ``--kill-at-step N``: while step ``N`` runs, inside the compiled step (a host callback
  chained after the optimizer). A negative ``N`` never fires but keeps the optimizer
  state's structure, for the run that resumes. With ``--commit-first`` each process first
  waits until its checkpoint manager has committed every save it started, so the newest
  committed checkpoint at the kill is known.
* ``--kill-in-save N``: inside the save of step ``N``, once this process has written its
  arrays and before the checkpoint is committed (renamed into place), so the step folder
  exists only as Orbax's temporary one.
"""

import argparse
import os
import signal
import sys


def _die():
    os.kill(os.getpid(), signal.SIGKILL)


def _record_checkpointers() -> list:
    """Every :class:`Checkpointer` that saves, in the order of their first save."""
    from jaxlib_ext.core.checkpoint import Checkpointer

    seen: list = []
    save = Checkpointer.save

    def recording_save(self, *a, **k):
        if self not in seen:
            seen.append(self)
        return save(self, *a, **k)

    Checkpointer.save = recording_save
    return seen


def _kill_at_step(kill_at: int, commit_first: bool) -> None:
    from jaxlib_ext import optim

    checkpointers = _record_checkpointers()
    build = optim.build_optimizer

    def killing_optimizer(*a, **k):
        import jax
        import optax

        def maybe_die(count):
            if int(count) == kill_at:
                if commit_first:
                    for c in checkpointers:
                        c.wait()
                _die()

        def update(updates, count, params=None):
            jax.debug.callback(maybe_die, count)
            return updates, count + 1

        counter = optax.GradientTransformation(lambda params: jax.numpy.int32(1), update)
        return optax.chain(build(*a, **k), counter)

    optim.build_optimizer = killing_optimizer


class _DieWhenWritten:
    """A commit future that waits for this process's writes, then kills the process.

    Orbax waits on every commit future of a save before the processes meet and process 0
    renames the temporary folder into place; dying here leaves an uncommitted save.
    """

    def __init__(self, futures):
        self.futures = list(futures)

    def result(self, timeout=None):
        for f in self.futures:
            f.result(timeout=timeout)
        _die()


def _kill_in_save(kill_step: int) -> None:
    import orbax.checkpoint as ocp

    from jaxlib_ext.core.checkpoint import Checkpointer

    armed = {"step": None}
    save = Checkpointer.save

    def arming_save(self, step, *a, **k):
        armed["step"] = step
        return save(self, step, *a, **k)

    handler = ocp.CompositeCheckpointHandler
    async_save = handler.async_save

    async def dying_async_save(self, directory, *a, **k):
        futures = await async_save(self, directory, *a, **k) or []
        if armed["step"] == kill_step:
            futures = [*futures, _DieWhenWritten(futures)]
        return futures

    Checkpointer.save = arming_save
    handler.async_save = dying_async_save


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--dump", required=True)
    parser.add_argument("--kill-at-step", type=int, default=None)
    parser.add_argument("--commit-first", action="store_true")
    parser.add_argument("--kill-in-save", type=int, default=None)
    own, rest = parser.parse_known_args()

    from jaxlib_ext.cli import train as cli

    args = cli.build_parser().parse_args(rest)
    if own.kill_at_step is not None:
        _kill_at_step(own.kill_at_step, own.commit_first)
    if own.kill_in_save is not None:
        _kill_in_save(own.kill_in_save)

    result = cli.run_train(args)

    import jax
    import numpy as np
    from jax.experimental import multihost_utils

    leaves = jax.tree.leaves(result.state.params)
    full = multihost_utils.process_allgather(leaves, tiled=True)
    if jax.process_index() == 0:
        np.savez(own.dump, *[np.asarray(x) for x in full], start_step=result.start_step)
    return 0


if __name__ == "__main__":
    sys.exit(main())
