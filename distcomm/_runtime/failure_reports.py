"""A rank's uncaught exception, written where ``distcomm run`` reads it.

``distcomm run`` gives its ranks ``DISTCOMM_RUN_REPORTS``, a private folder. After ``init()``,
an uncaught exception in a rank writes ``rank-N.json`` there (the time, the rank, the host, the
exception's type, message and traceback, and whether it is a communication error: a peer that
went away, a timeout), then the exception is printed as usual. The launcher names as the root
cause the earliest exception that is not a communication error (the first rank to exit is often
a peer that saw "connection closed"), and condenses the others to one line each.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import sys
import threading
import time
import traceback
from types import TracebackType

from distcomm.backend._pipeline.failures import lost_peer
from distcomm.errors import DistTimeoutError, EngineError, RankFailedError

__all__ = ["VARIABLE", "install", "is_communication_error"]

#: The folder ``distcomm run`` gives its ranks for their reports.
VARIABLE = "DISTCOMM_RUN_REPORTS"
_installed = threading.Lock()
_done = False


def is_communication_error(exc: BaseException) -> bool:
    """Whether ``exc`` is a consequence of another rank's trouble: a timeout, a failed peer, or
    an engine error saying the connection went away."""
    if isinstance(exc, (DistTimeoutError, RankFailedError)):
        return True
    if isinstance(exc, EngineError) or type(exc).__name__ in ("DistBackendError", "RuntimeError"):
        return lost_peer(str(exc))
    return False


def install(rank: int) -> None:
    """Write a report on an uncaught exception of this process (``rank``), if run by
    ``distcomm run``; once per process."""
    global _done
    folder = os.environ.get(VARIABLE)
    if not folder:
        return
    with _installed:
        if _done:
            return
        _done = True
        previous = sys.excepthook

    def hook(kind: type[BaseException], exc: BaseException, tb: TracebackType | None) -> None:
        with contextlib.suppress(Exception):  # a report must never hide the exception itself
            _write(folder, rank, exc, tb)
        previous(kind, exc, tb)

    sys.excepthook = hook


def _write(folder: str, rank: int, exc: BaseException, tb: TracebackType | None) -> None:
    report = {
        "time": time.time(),
        "rank": rank,
        "host": socket.gethostname(),
        "type": type(exc).__name__,
        "message": str(exc),
        "traceback": "".join(traceback.format_exception(type(exc), exc, tb)),
        "communication": is_communication_error(exc),
    }
    path = os.path.join(folder, f"rank-{rank}.json")
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC
    with os.fdopen(os.open(path + ".tmp", flags, 0o600), "w", encoding="utf-8") as out:
        json.dump(report, out)
    os.replace(path + ".tmp", path)
