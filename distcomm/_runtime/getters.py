"""The getters: rank, world size, local and node positions, backend, and whether this is main.

After ``init`` they answer from the running communicator; before, from the detected launch, so
``is_main_process()`` is right on every rank from the first line of a script.
"""

from __future__ import annotations

from typing import Any

from distcomm._runtime import state
from distcomm._runtime.collectives import resolve_group
from distcomm._runtime.detection import detect_environment
from distcomm.environment.info import LaunchInfo
from distcomm.errors import NotInitializedError
from distcomm.protocol import Communicator

__all__ = [
    "get_backend",
    "get_communicator",
    "get_local_rank",
    "get_local_world_size",
    "get_node_rank",
    "get_rank",
    "get_world_size",
    "is_distributed",
    "is_initialized",
    "is_local_main_process",
    "is_main_process",
    "restart_count",
]


def is_initialized() -> bool:
    """Whether ``init`` has run in this process (inside ``run_threads``: in this thread-rank;
    threads it did not start look uninitialised)."""
    return state.current() is not None


def get_communicator() -> Communicator:
    """The default communicator.

    Raises:
        NotInitializedError: before ``init()``.
    """
    ctx = state.current()
    if ctx is None:
        raise NotInitializedError("distcomm is not initialised. HINT: call distcomm.init() first.")
    return ctx.comm


def _launch() -> LaunchInfo:
    ctx = state.current()
    return ctx.launch if ctx is not None else detect_environment()


def get_rank(group: Any = None) -> int:
    """This process's global rank: the default communicator's (before init: the detected
    launch's); with ``group``, its rank in that communicator (``group.rank``), as torch's
    ``get_rank(group)``."""
    if group is not None:
        return resolve_group(group).rank
    ctx = state.current()
    return ctx.comm.rank if ctx is not None else detect_environment().rank


def get_world_size(group: Any = None) -> int:
    """The number of ranks: the default communicator's size (before init: the detected
    launch's world size); with ``group``, that communicator's (``group.world_size``)."""
    if group is not None:
        return resolve_group(group).world_size
    ctx = state.current()
    return ctx.comm.world_size if ctx is not None else detect_environment().world_size


def get_local_rank() -> int:
    """This process's rank on its node: the launch's (before init: the detected one's)."""
    return _launch().local_rank


def get_local_world_size() -> int:
    """The number of ranks on this node: the launch's (before init: the detected one's)."""
    return _launch().local_world_size


def get_node_rank() -> int:
    """The index of this node in the job: the launch's (before init: the detected one's)."""
    return _launch().node_rank


def restart_count() -> int:
    """How many times the launcher restarted the job before this attempt: torchrun's
    TORCHELASTIC_RESTART_COUNT (``distcomm run --max-restarts`` sets it too), Slurm's
    SLURM_RESTART_COUNT for a requeued job; 0 elsewhere (before init: the detected value). A
    program resumes from its checkpoint when it is above 0 (docs/elastic.md)."""
    return _launch().restart_count


def get_backend() -> str | None:
    """The running backend's name, e.g. ``"fakelink"``, or None before init."""
    ctx = state.current()
    return ctx.comm.backend if ctx is not None else None


def is_distributed() -> bool:
    """Whether distcomm is initialised with more than one rank (False before init)."""
    ctx = state.current()
    return ctx is not None and ctx.comm.world_size > 1


def is_main_process() -> bool:
    """Whether this is global rank 0 (before init: by detection, so it is True on rank 0 only
    from the first line of a script)."""
    return get_rank() == 0


def is_local_main_process() -> bool:
    """Whether this is local rank 0 on its node (before init: by detection)."""
    return get_local_rank() == 0
