"""One daemon thread per process that looks after live communicators a few times per second.

An object registers with :func:`watch` and has a ``monitor_tick(now)`` method (``now`` from
``time.monotonic()``) and, optionally, a ``monitor_interval`` attribute (seconds; the thread ticks
at the smallest one asked for, at most every :data:`MAX_INTERVAL`). Backends use it to publish
their progress out of band (the torch store), to answer their peers' questions (MPI's side
channel) and to end a job whose blocking call cannot be cancelled (MPI's watchdog). The thread
holds weak references only; a failing tick is logged, never fatal. It is stopped and joined at
interpreter exit, before engines are torn down (a daemon thread caught inside an engine's C++
code during finalisation can abort the process).
"""

from __future__ import annotations

import atexit
import logging
import threading
import time
import weakref
from typing import Any

__all__ = ["MAX_INTERVAL", "interval", "stop", "unwatch", "watch"]

#: The longest time between two ticks, in seconds.
MAX_INTERVAL = 0.5
_MIN_INTERVAL = 0.02

logger = logging.getLogger("distcomm")
_lock = threading.Lock()
_watched: weakref.WeakSet[Any] = weakref.WeakSet()
_thread: threading.Thread | None = None
_stopping = threading.Event()
_at_exit = False


def watch(obj: Any) -> None:
    """Call ``obj.monitor_tick(now)`` from now on; starts the thread on first use."""
    global _thread, _at_exit
    with _lock:
        _watched.add(obj)
        if _thread is None or not _thread.is_alive():
            _stopping.clear()
            _thread = threading.Thread(target=_run, name="distcomm-monitor", daemon=True)
            _thread.start()
            if not _at_exit:
                _at_exit = True
                atexit.register(stop)


def unwatch(obj: Any) -> None:
    """Stop ticking ``obj``."""
    with _lock:
        _watched.discard(obj)


def interval() -> float:
    """Seconds between two ticks now (what a peer waits for another's next tick)."""
    with _lock:
        asked = [getattr(obj, "monitor_interval", MAX_INTERVAL) for obj in _watched]
    return max(_MIN_INTERVAL, min([MAX_INTERVAL, *asked]))


def stop() -> None:
    """Stop the thread and wait for its tick in progress to end (at exit)."""
    global _thread
    _stopping.set()
    thread, _thread = _thread, None
    if thread is not None and thread is not threading.current_thread():
        thread.join(5.0)


def _run() -> None:
    while not _stopping.wait(interval()):
        with _lock:
            objects = list(_watched)
        now = time.monotonic()
        for obj in objects:
            if _stopping.is_set():
                return
            try:
                obj.monitor_tick(now)
            except Exception:
                logger.debug("distcomm monitor: tick of %r failed", obj, exc_info=True)
