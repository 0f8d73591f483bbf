"""A rank's uncaught exception, written where ``distcomm run`` reads it.

``distcomm run`` gives its ranks ``DISTCOMM_RUN_REPORTS``, a private folder. After ``init()``,
an uncaught exception in a rank writes ``rank-N.json`` there, then the exception is printed as
usual. The report holds the time, the rank, the host, the exception's type, message and
traceback, its :func:`kind_of` (a timeout of the rank's own operation, a lost peer, a collective
mismatch, a failed rank, an interrupt, or another exception), whether that kind is a
communication error (a consequence of another rank's trouble), and, for distcomm's operation
errors, the operation, its sequence number, the ranks that had not arrived and a timeout's
limit. The launcher names as the root cause the earliest exception that is not a communication
error (the first rank to exit is often a peer that saw "connection closed"), and condenses the
others to one line each (:mod:`distcomm._processes.failure_summary`).
"""

from __future__ import annotations

import json
import os
import re
import socket
import threading
import time
from typing import Any

from distcomm import _settings
from distcomm.backend import _uncaught
from distcomm.backend.engine_messages import lost_peer
from distcomm.errors import (
    CollectiveMismatchError,
    DistTimeoutError,
    EngineError,
    OperationError,
    RankFailedError,
)

__all__ = ["COMMUNICATION", "VARIABLE", "install", "is_communication_error", "kind_of", "report"]

#: The folder ``distcomm run`` gives its ranks for their reports.
VARIABLE = "DISTCOMM_RUN_REPORTS"
#: The kinds that are a consequence of another rank's trouble.
COMMUNICATION = frozenset({"timeout", "lost peer", "rank failed"})
#: A timeout's limit in its message (DistTimeoutError has no attribute for it).
_LIMIT = re.compile(r"within (\d+(?:\.\d+)?(?:e[+-]?\d+)?) s\b")
_installed = threading.Lock()
_done = False


def kind_of(exc: BaseException) -> str:
    """What ``exc`` says happened to its rank.

    Returns:
        ``"mismatch"`` (a :class:`CollectiveMismatchError`: the ranks called different
        collectives), ``"timeout"`` (the rank's own operation timed out), ``"lost peer"`` (an
        engine error saying that a peer went away), ``"rank failed"`` (a
        :class:`RankFailedError`), ``"interrupted"`` (``KeyboardInterrupt``) or ``"other"``.
    """
    if isinstance(exc, CollectiveMismatchError):
        return "mismatch"
    if isinstance(exc, DistTimeoutError):
        return "timeout"
    if isinstance(exc, RankFailedError):
        return "rank failed"
    if isinstance(exc, KeyboardInterrupt):
        return "interrupted"
    if isinstance(exc, EngineError) or type(exc).__name__ in ("DistBackendError", "RuntimeError"):
        return "lost peer" if lost_peer(str(exc)) else "other"
    return "other"


def is_communication_error(exc: BaseException) -> bool:
    """Whether ``exc`` is a consequence of another rank's trouble: a timeout, a failed peer, or
    an engine error saying the connection went away. A collective mismatch is not: it is a
    root cause."""
    return kind_of(exc) in COMMUNICATION


def install(rank: int) -> None:
    """Write a report on an uncaught exception of this process (``rank``), if run by
    ``distcomm run`` (an observer of :mod:`distcomm.backend._uncaught`); once per process."""
    global _done
    folder = _settings.read(VARIABLE)
    if not folder:
        return
    with _installed:
        if _done:
            return
        _done = True
    _uncaught.add_observer(lambda exc, text: _write(folder, rank, exc, text))
    _uncaught.install(None)  # the hook that tells its observers (init sets the rank's prefix)


def report(rank: int, exc: BaseException, text: str | None = None) -> dict[str, Any]:
    """The report of ``exc``, raised in ``rank`` (module docstring), with ``text``, its
    traceback as shown (by default, formatted here); JSON-ready."""
    what = kind_of(exc)
    entry: dict[str, Any] = {
        "time": time.time(),
        "rank": rank,
        "host": socket.gethostname(),
        "type": type(exc).__name__,
        "message": str(exc),
        "traceback": _uncaught.format_exception(exc) if text is None else text,
        "kind": what,
        "communication": what in COMMUNICATION,
    }
    if isinstance(exc, OperationError):
        missing = exc.missing_ranks
        entry["op"] = exc.op
        entry["seq"] = exc.seq
        entry["missing_ranks"] = None if missing is None else [int(r) for r in missing]
    if what == "timeout":
        limit = _LIMIT.search(str(exc))
        entry["limit"] = float(limit.group(1)) if limit else None
    return entry


def _write(folder: str, rank: int, exc: BaseException, text: str) -> None:
    path = os.path.join(folder, f"rank-{rank}.json")
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC
    with os.fdopen(os.open(path + ".tmp", flags, 0o600), "w", encoding="utf-8") as out:
        json.dump(report(rank, exc, text), out)
    os.replace(path + ".tmp", path)
