"""The flight recorder: ``DISTCOMM_TRACE=N`` keeps each rank's last N collectives and writes them
where ``distcomm trace`` reads them.

Each entry (recorded by a pair of hooks, :func:`~distcomm.add_hook`): the operation, its ``seq``,
the group's global ranks, shape, dtype, bytes, root, the call site (the first frame outside
distcomm), when it was issued and completed (wall clock), and its error. Both stamps are read in
the hooks, after the event's clock (:mod:`~distcomm.backend._pipeline.observing`): for a blocking
call on a CUDA tensor, once the device finished the work queued before the call, and then the
call's own. The ring is written to ``DISTCOMM_TRACE_DIR`` (default ``./distcomm-trace/<job>``) as
``rank-<N>.json`` (0600, in a 0700 folder): at exit, when an operation of this rank times out, on
``DISTCOMM_TRACE_SIGNAL`` (default SIGUSR2) and on SIGTERM (both chained to the handlers already
installed), before a rank aborts the job (every rank's, as its last words:
:mod:`distcomm.backend.aborts`), and on :func:`dump_trace`. Off (no DISTCOMM_TRACE), nothing is
registered.
"""

from __future__ import annotations

import atexit
import collections
import contextlib
import json
import os
import signal
import socket
import threading
import time
from types import FrameType
from typing import TYPE_CHECKING, Any

from distcomm import _settings
from distcomm._call_sites import user_frame
from distcomm._files import private_folders
from distcomm.backend import aborts
from distcomm.backend.events import CollectiveEvent, HookHandle, add_hook
from distcomm.errors import DistTimeoutError, NotInitializedError

if TYPE_CHECKING:
    from distcomm.environment.info import LaunchInfo

__all__ = ["FlightRecorder", "dump_trace", "start_from_environment"]

_current: FlightRecorder | None = None


class FlightRecorder:
    """The last ``size`` collectives of this rank, and where to write them."""

    def __init__(self, size: int, path: str, rank: int, world_size: int) -> None:
        self.path, self.rank, self.world_size = path, rank, world_size
        self.lock = threading.Lock()
        self.entries: collections.deque[dict[str, Any]] = collections.deque(maxlen=size)
        self.open: dict[int, dict[str, Any]] = {}  # id(event) -> its entry, until after()
        self.handle: HookHandle | None = add_hook(before=self._before, after=self._after)

    def _before(self, event: CollectiveEvent) -> None:
        if tuple(event.group.global_ranks)[event.rank] != self.rank:
            return  # another thread-rank's call
        entry = {
            "op": event.op,
            "seq": event.seq,
            "group": list(event.group.global_ranks),
            "shape": None if event.shape is None else list(event.shape),
            "dtype": event.dtype,
            "bytes": event.nbytes,
            "root": event.root,
            "site": _call_site(),
            "issued": time.time(),  # after event.started: past the device's queued work
            "completed": None,
            "error": None,
        }
        with self.lock:
            self.entries.append(entry)
            self.open[id(event)] = entry

    def _after(self, event: CollectiveEvent) -> None:
        with self.lock:
            entry = self.open.pop(id(event), None)
        if entry is None:
            return
        entry["completed"] = time.time()  # after event.finished: past the device's work
        if event.error is not None:
            entry["error"] = f"{type(event.error).__name__}: {event.error}".splitlines()[0]
            if isinstance(event.error, DistTimeoutError):
                self.dump()

    def dump(self) -> str:
        """Write the ring to this rank's file (atomically); return its path."""
        with self.lock:
            entries = [dict(entry) for entry in self.entries]
        document = {
            "rank": self.rank,
            "world_size": self.world_size,
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "dumped": time.time(),
            "entries": entries,
        }
        private_folders(os.path.dirname(self.path))
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC
        with os.fdopen(os.open(self.path + ".tmp", flags, 0o600), "w", encoding="utf-8") as out:
            json.dump(document, out)
        os.replace(self.path + ".tmp", self.path)
        return self.path

    def stop(self) -> None:
        if self.handle is not None:
            self.handle.remove()
            self.handle = None


def _call_site() -> str | None:
    """``file:line in function`` of the first frame outside distcomm."""
    frame = user_frame()
    if frame is None:
        return None
    code = frame.f_code
    return f"{code.co_filename}:{frame.f_lineno} in {code.co_name}"


def start_from_environment(launch: LaunchInfo, rank: int, world_size: int) -> None:
    """Start the recorder that DISTCOMM_TRACE asks for (init; once per process).

    Raises:
        InvalidArgumentError: DISTCOMM_TRACE is not a positive number of operations, or
            DISTCOMM_TRACE_SIGNAL names no signal.
    """
    global _current
    keep = int(_settings.read("DISTCOMM_TRACE"))
    if not keep:
        return
    signum: signal.Signals = _settings.read("DISTCOMM_TRACE_SIGNAL")
    if _current is not None:
        return
    job = launch.job_id or f"{launch.method}-{launch.master_port or 'local'}"
    folder = _settings.read("DISTCOMM_TRACE_DIR") or os.path.join("distcomm-trace", job)
    path = os.path.join(os.path.abspath(folder), f"rank-{rank}.json")
    _current = FlightRecorder(keep, path, rank, world_size)
    atexit.register(_dump_quietly)
    aborts.add_last_words(_dump_quietly)
    for sig in {signum, signal.SIGTERM}:
        _chain(sig)


def _chain(sig: signal.Signals) -> None:
    """Dump on ``sig``, then do what was done before (the previous handler, or the default)."""
    if threading.current_thread() is not threading.main_thread():
        return
    previous = signal.getsignal(sig)

    def handler(signum: int, frame: FrameType | None) -> None:
        _dump_quietly()
        if callable(previous):
            previous(signum, frame)
        elif previous == signal.SIG_DFL and signum != signal.SIGUSR2:
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)

    with contextlib.suppress(ValueError, OSError):
        signal.signal(sig, handler)


def _dump_quietly() -> None:
    if _current is not None:
        with contextlib.suppress(OSError):
            _current.dump()


def dump_trace() -> str:
    """Write this rank's flight recorder now (``DISTCOMM_TRACE`` must be set); return the file.

    Raises:
        NotInitializedError: no flight recorder runs (DISTCOMM_TRACE unset, or before init).
    """
    if _current is None:
        raise NotInitializedError(
            "dump_trace: no flight recorder runs in this process. HINT: export "
            "DISTCOMM_TRACE=2000 (the last 2000 collectives per rank) before distcomm.init()."
        )
    return _current.dump()
