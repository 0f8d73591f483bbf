"""The flight recorder: ``DISTCOMM_TRACE=N`` keeps each rank's last N collectives and writes them
where ``distcomm trace`` reads them.

Each entry (made by the communicator itself, on its plans as on its pipeline, no hook:
:mod:`~distcomm.backend._pipeline.recording`): the operation, its ``seq``, the group's global
ranks, shape, dtype, bytes, root, the call site (the first frame outside distcomm), when it was
issued and completed (wall clock), and its error. Both stamps are read after the device clock
(:mod:`~distcomm._device_clock`): for a blocking call on a CUDA tensor, once the device finished
the work queued before the call, and then the call's own. The ring is written to
``DISTCOMM_TRACE_DIR`` (default ``./distcomm-trace/<job>``) as ``rank-<N>.json`` (0600, in a
0700 folder): at exit, when an operation of this rank times out, on ``DISTCOMM_TRACE_SIGNAL``
(default SIGUSR2) and on SIGTERM (both chained to the handlers already installed), before a rank
aborts the job (every rank's, as its last words: :mod:`distcomm.backend.aborts`), and on
:func:`dump_trace`. Off (no DISTCOMM_TRACE), no communicator has a recorder: a test of one
attribute per call.
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
from collections.abc import Callable
from types import FrameType
from typing import TYPE_CHECKING, Any

from distcomm import _settings
from distcomm._call_sites import format_site
from distcomm._files import private_folders
from distcomm.backend import aborts
from distcomm.backend._pipeline import recording
from distcomm.errors import DistTimeoutError, NotInitializedError

if TYPE_CHECKING:
    from distcomm.environment.info import LaunchInfo

__all__ = ["FlightRecorder", "attach", "dump_trace", "start_from_environment"]

_current: FlightRecorder | None = None


class FlightRecorder:
    """The last ``size`` collectives of this rank, and where to write them. The communicators
    of this rank append their entries (:meth:`add`; :mod:`distcomm.backend._pipeline.recording`)
    from the time :func:`attach` gives them this recorder."""

    def __init__(self, size: int, path: str, rank: int, world_size: int) -> None:
        self.path, self.rank, self.world_size = path, rank, world_size
        self.entries: collections.deque[list[Any]] = collections.deque(maxlen=size)
        #: Keep an entry: the ring's own append (no Python frame per call), until :meth:`stop`.
        self.add: Callable[[list[Any]], None] = self.entries.append

    def retract(self, entry: list[Any]) -> None:
        if self.entries and self.entries[-1] is entry:
            self.entries.pop()

    def failed(self, entry: list[Any], error: BaseException) -> None:
        entry[recording.ERROR] = f"{type(error).__name__}: {error}".splitlines()[0]
        if isinstance(error, DistTimeoutError):
            self.dump()

    def records(self) -> list[dict[str, Any]]:
        """The entries kept, oldest first, as the dump writes them."""
        kept = list(self.entries)  # one C call: appends of other threads wait for it
        records = []
        for entry in kept:
            fields = dict(zip(recording.HEAD, entry[recording.KIND], strict=True))
            fields.update(zip(recording.OWN, entry[1:], strict=True))
            record = {name: fields[name] for name in recording.FIELDS}
            record["group"] = list(record["group"])
            shape = record["shape"]
            record["shape"] = None if shape is None else [int(n) for n in shape]
            record["site"] = format_site(record["site"])
            if record["dtype"] is None:  # a barrier, an object collective: no tensor
                record["bytes"] = None
            records.append(record)
        return records

    def dump(self) -> str:
        """Write the ring to this rank's file (atomically); return its path."""
        document = {
            "rank": self.rank,
            "world_size": self.world_size,
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "dumped": time.time(),
            "entries": self.records(),
        }
        private_folders(os.path.dirname(self.path))
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC
        with os.fdopen(os.open(self.path + ".tmp", flags, 0o600), "w", encoding="utf-8") as out:
            json.dump(document, out)
        os.replace(self.path + ".tmp", self.path)
        return self.path

    def stop(self) -> None:
        """Keep no more entries."""
        self.add = _ignore


def _ignore(entry: list[Any]) -> None:
    """A stopped recorder's ``add``."""


def attach(comm: Any) -> None:
    """Give ``comm`` (a communicator ``init`` made) to this process's flight recorder, if one
    runs: its calls, and those of the groups made from it, are kept."""
    if _current is not None and hasattr(comm, "_record_into"):
        comm._record_into(_current)


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
