"""A training process for the multi-process tests (not collected by pytest).

Runs the CLI's ``train`` command with the given flags, then gathers the final parameters
from every process and lets process 0 write them to ``--dump`` (an ``.npz``).
Failure injection: ``--kill-at-step N`` makes every process SIGKILL itself while step N
runs, between checkpoints, the way a preempted host dies (a negative N never fires but
keeps the optimizer state's structure, for the run that resumes).
"""

import argparse
import os
import signal
import sys


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--dump", required=True)
    parser.add_argument("--kill-at-step", type=int, default=None)
    own, rest = parser.parse_known_args()

    from jaxlib_ext import cli

    args = cli.build_parser().parse_args(["train", *rest])
    if own.kill_at_step is not None:
        kill_at = own.kill_at_step
        build = cli.build_optimizer

        def killing_optimizer(*a, **k):
            import jax
            import optax

            def die(count):
                if int(count) == kill_at:
                    os.kill(os.getpid(), signal.SIGKILL)

            def update(updates, state, params=None):
                jax.debug.callback(die, state)
                return updates, state + 1

            inject = optax.GradientTransformation(lambda params: jax.numpy.int32(1), update)
            return optax.chain(build(*a, **k), inject)

        cli.build_optimizer = killing_optimizer

    result = cli.run_train(args)

    import jax
    import numpy as np
    from jax.experimental import multihost_utils

    leaves = jax.tree.leaves(result.state.params)
    full = multihost_utils.process_allgather(leaves, tiled=True)
    if jax.process_index() == 0:
        np.savez(own.dump, *[np.asarray(x) for x in full])
    return 0


if __name__ == "__main__":
    sys.exit(main())
