"""Who is initialised: the process's default communicator, or a thread-rank's own.

Inside ``distcomm.testing.run_threads`` each thread has its own :class:`Context`, so the
module-level API acts as that thread's rank; everywhere else one process-wide context holds.
"""

from __future__ import annotations

import dataclasses
import threading
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from distcomm.environment import LaunchInfo
    from distcomm.protocol import Communicator

__all__ = ["Context", "current", "set_process", "thread_context"]


@dataclasses.dataclass
class Context:
    """An initialised world as ``init()`` made it.

    Attributes:
        comm: the default communicator.
        launch: the launch it was built from (after ``init`` arguments were applied).
        trace: why this backend and method were chosen.
        requested: the arguments ``init`` was given, to compare with a later call.
        exported: environment variables ``init`` set (``finalize`` removes exactly these).
        thread_owned: True inside run_threads (finalize is a no-op there).
        recorder: the DISTCOMM_PROFILE recorder (:mod:`~distcomm._runtime.profiling`), if on.
        torch_made: what ``init`` made for torch's default process group
            (:mod:`~distcomm._runtime.torch_group`): the torch backend's communicator over a
            group beside a non-torch backend, or the group over distcomm
            (``torch_group="distcomm"``); ``finalize`` ends it (its ``finalize()``).
    """

    comm: Communicator
    launch: LaunchInfo
    trace: list[str] = dataclasses.field(default_factory=list)
    requested: dict[str, Any] = dataclasses.field(default_factory=dict)
    exported: dict[str, str] = dataclasses.field(default_factory=dict)
    thread_owned: bool = False
    recorder: Any = None
    torch_made: Any = None


class _ThreadState(threading.local):
    #: The calling thread's own context; the class attribute (None) answers for threads
    #: without one, so the lookup never raises (a missed ``getattr`` costs ~0.5 us).
    ctx: Context | None = None


_process: Context | None = None
_local = _ThreadState()
#: How many threads have their own context now; while 0, ``_process`` answers for every
#: thread and the hot path skips the thread-local lookup.
thread_ranks = 0
_count_lock = threading.Lock()


def current() -> Context | None:
    """The context that applies to the calling thread, or None before init."""
    if not thread_ranks:
        return _process
    ctx = _local.ctx
    return ctx if ctx is not None else _process


def set_process(ctx: Context | None) -> None:
    """Install (or clear) the process-wide context."""
    global _process
    _process = ctx


def thread_context(ctx: Context | None) -> None:
    """Install (or clear) the calling thread's own context."""
    global thread_ranks
    with _count_lock:
        thread_ranks += (ctx is not None) - (_local.ctx is not None)
        _local.ctx = ctx
