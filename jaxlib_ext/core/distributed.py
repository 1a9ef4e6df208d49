"""Multi-process start: ``jax.distributed.initialize`` from flags or the environment.

On CPU the collectives go through gloo (JAX's default CPU implementation),
so several processes on one machine (or several machines) form one global mesh.
"""

from __future__ import annotations

import dataclasses
import os

import jax

__all__ = ["ProcessConfig", "resolve", "initialize"]

ENV_COORDINATOR = "JAX_COORDINATOR_ADDRESS"
ENV_NUM_PROCESSES = "JAX_NUM_PROCESSES"
ENV_PROCESS_ID = "JAX_PROCESS_ID"


@dataclasses.dataclass(frozen=True)
class ProcessConfig:
    """The process group of a run.

    Attributes:
      coordinator: the coordinator's ``host:port``, or ``None`` for one process.
      num_processes: the number of processes, ``>= 1``.
      process_id: this process's index in ``[0, num_processes)``.
    """

    coordinator: str | None
    num_processes: int
    process_id: int

    @property
    def is_multiprocess(self) -> bool:
        """Whether the run has more than one process."""
        return self.num_processes > 1


def resolve(
    coordinator: str | None = None,
    num_processes: int | None = None,
    process_id: int | None = None,
    env: dict | None = None,
) -> ProcessConfig:
    """The process group from flags, or else from the environment.

    Flags win over ``JAX_COORDINATOR_ADDRESS``/``JAX_NUM_PROCESSES``/``JAX_PROCESS_ID``.

    Args:
      coordinator: the coordinator's ``host:port``, or ``None``.
      num_processes: the number of processes, or ``None`` (the environment's, else 1).
      process_id: this process's index, or ``None`` (the environment's, else 0).
      env: the environment mapping; ``None`` means ``os.environ``.

    Returns:
      The :class:`ProcessConfig`.

    Raises:
      ValueError: if ``num_processes < 1``, ``process_id`` is out of range, or several
        processes come without a coordinator.
    """
    env = os.environ if env is None else env
    coordinator = coordinator or env.get(ENV_COORDINATOR) or None
    if num_processes is None:
        num_processes = int(env.get(ENV_NUM_PROCESSES, "1"))
    if process_id is None:
        process_id = int(env.get(ENV_PROCESS_ID, "0"))
    if num_processes < 1:
        raise ValueError(f"num_processes must be >= 1, got {num_processes}")
    if not 0 <= process_id < num_processes:
        raise ValueError(
            f"process_id must be in [0, {num_processes}), got {process_id}"
        )
    if num_processes > 1 and not coordinator:
        raise ValueError(
            "coordinator (or JAX_COORDINATOR_ADDRESS) is required when num_processes > 1, "
            "e.g. coordinator '10.0.0.1:1234' on every host"
        )
    return ProcessConfig(coordinator, num_processes, process_id)


def initialize(
    coordinator: str | None = None,
    num_processes: int | None = None,
    process_id: int | None = None,
) -> ProcessConfig:
    """Joins the process group; a no-op for a single process. Call before any JAX work.

    Args:
      coordinator: the coordinator's ``host:port``, or ``None`` (the environment's).
      num_processes: the number of processes, or ``None`` (the environment's, else 1).
      process_id: this process's index, or ``None`` (the environment's, else 0).

    Returns:
      The :class:`ProcessConfig` joined.

    Raises:
      ValueError: as :func:`resolve`.
    """
    cfg = resolve(coordinator, num_processes, process_id)
    if cfg.is_multiprocess:
        jax.distributed.initialize(
            coordinator_address=cfg.coordinator,
            num_processes=cfg.num_processes,
            process_id=cfg.process_id,
        )
    return cfg
