"""Orbax checkpoints of a training state: async, atomic, resumable.

Each checkpoint is a step folder holding the state pytree (``StandardSave``, sharded
arrays written by the processes that own them) and a small JSON record of the run's
configuration. Orbax writes into a temporary folder and renames it when complete, so a
process killed mid-save leaves no half checkpoint behind; :meth:`Checkpointer.latest_step`
only ever sees committed ones.

A writer removes the temporary folders that a killed run left behind (the removal runs in
the background and finishes before its first save). A reader (``read_only=True``) leaves
them alone: two cleanups of one folder at once would race on the same paths, so a folder
has at most one writer at a time and any number of readers.

Zero-size leaves (placeholders that some optimizer states carry for leaves they skip) hold
no data and Orbax refuses them: they are left out of the saved tree and rebuilt from the
restore target.
"""

from __future__ import annotations

import math
import pathlib

import jax
import jax.numpy as jnp
import orbax.checkpoint as ocp

__all__ = ["Checkpointer", "abstract_like"]


def abstract_like(tree, shardings):
    """``ShapeDtypeStruct``s of ``tree`` carrying ``shardings`` (the restore target).

    Args:
      tree: a pytree of arrays (or anything with ``shape`` and ``dtype``).
      shardings: a pytree of shardings of ``tree``'s structure.

    Returns:
      The pytree of ``jax.ShapeDtypeStruct``.
    """
    return jax.tree.map(
        lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), tree, shardings
    )


def _is_empty(x) -> bool:
    return hasattr(x, "shape") and math.prod(x.shape) == 0


def _without_empty(tree):
    """``tree`` with its zero-size leaves replaced by ``None`` (an empty subtree)."""
    return jax.tree.map(lambda x: None if _is_empty(x) else x, tree)


def _with_empty(restored, abstract):
    """``restored`` (from :func:`_without_empty` of ``abstract``) with its zero-size
    leaves rebuilt from ``abstract``."""
    leaves, treedef = jax.tree.flatten(abstract)
    got = iter(jax.tree.leaves(restored))  # the ``None`` subtrees have no leaves
    out = [
        jnp.zeros(a.shape, a.dtype, device=getattr(a, "sharding", None))
        if _is_empty(a) else next(got)
        for a in leaves
    ]
    return jax.tree.unflatten(treedef, out)


class Checkpointer:
    """A thin wrapper over ``ocp.CheckpointManager`` for ``(state, meta)`` pairs.

    Args:
      directory: where step folders go (created on first save).
      max_to_keep: the newest checkpoints kept; older ones are deleted.
      async_save: write in a background thread while training continues.
      read_only: only look (``latest_step``, ``restore``, ``restore_meta``): the folder is
        neither created nor cleaned, and :meth:`save` is refused.

    A ``Checkpointer`` is a context manager; leaving it waits for pending saves and closes it.
    """

    def __init__(self, directory: str | pathlib.Path, *, max_to_keep: int = 3, async_save=True,
                 read_only: bool = False):
        self.directory = pathlib.Path(directory).absolute()
        self.read_only = read_only
        options = ocp.CheckpointManagerOptions(
            max_to_keep=max_to_keep,
            enable_async_checkpointing=async_save and not read_only,
            cleanup_tmp_directories=not read_only,
            create=not read_only,
        )
        self._manager = ocp.CheckpointManager(self.directory, options=options)

    def latest_step(self) -> int | None:
        """The newest committed step, or ``None`` when there is none."""
        return self._manager.latest_step()

    def all_steps(self) -> list[int]:
        """The committed steps."""
        return list(self._manager.all_steps())

    def save(self, step: int, state, meta: dict | None = None, *, force: bool = True) -> bool:
        """Saves ``state`` and its JSON record as checkpoint ``step``.

        Args:
          step: the checkpoint's step.
          state: a pytree of arrays (zero-size leaves are left out).
          meta: a JSON-serialisable dict; ``None`` means ``{}``.
          force: save whatever the manager's save interval says.

        Returns:
          Whether a save was started (with ``async_save`` it finishes in the background).

        Raises:
          PermissionError: if the checkpointer is read-only.
        """
        if self.read_only:
            raise PermissionError(f"save: {self.directory} was opened with read_only=True")
        args = ocp.args.Composite(
            state=ocp.args.StandardSave(_without_empty(state)),
            meta=ocp.args.JsonSave(meta or {}),
        )
        return self._manager.save(step, args=args, force=force)

    def restore(self, step: int | None, abstract_state):
        """Restores ``(state, meta)`` at a step.

        Args:
          step: the step to restore; ``None`` means the latest.
          abstract_state: the restore target, a pytree of ``jax.ShapeDtypeStruct`` (with
            shardings; :func:`abstract_like`) of the saved state's structure.

        Returns:
          ``(state, meta)``: the state in ``abstract_state``'s structure and shardings, and
          the JSON record.

        Raises:
          FileNotFoundError: if there is no checkpoint.
        """
        step = self.latest_step() if step is None else step
        if step is None:
            raise FileNotFoundError(f"no checkpoint in {self.directory}")
        out = self._manager.restore(
            step,
            args=ocp.args.Composite(
                state=ocp.args.StandardRestore(_without_empty(abstract_state)),
                meta=ocp.args.JsonRestore(),
            ),
        )
        return _with_empty(out.state, abstract_state), dict(out.meta or {})

    def restore_meta(self, step: int | None = None) -> dict:
        """The JSON record saved with a step, without the state.

        Args:
          step: the step; ``None`` means the latest.

        Returns:
          The record, a dict.

        Raises:
          FileNotFoundError: if there is no checkpoint.
        """
        step = self.latest_step() if step is None else step
        if step is None:
            raise FileNotFoundError(f"no checkpoint in {self.directory}")
        out = self._manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))
        return dict(out.meta or {})

    def wait(self) -> None:
        """Blocks until pending background saves are committed."""
        self._manager.wait_until_finished()

    def close(self) -> None:
        """Waits for pending saves, then closes the manager."""
        self._manager.wait_until_finished()
        self._manager.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
