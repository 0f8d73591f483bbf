"""One daemon thread per process that looks after live communicators a few times per second.

An object registers with :func:`watch` and has a ``monitor_tick(now)`` method (``now`` from
``time.monotonic()``) and, optionally, a ``monitor_interval`` attribute (seconds; the thread ticks
at the smallest one asked for, at most every :data:`MAX_INTERVAL`). Backends use it to publish
their progress out of band (the torch store), to answer their peers' questions (MPI's side
channel) and to end a job whose blocking call cannot be cancelled (MPI's watchdog). The thread
holds weak references only; a failing tick is logged, never fatal.

Other short-lived threads that call into an engine (a read of torch's store with a deadline,
the mismatch check's lookout) start with :func:`helper`. The monitor's thread and the helpers
still running are stopped and joined at interpreter exit, before engines are torn down: on
Python 3.11, a daemon thread that comes back from an engine's C++ code while the interpreter
finalises is ended by ``pthread_exit`` inside a C++ destructor, which aborts the process
("terminate called without an active exception"). Helpers look at :func:`stopping` between
their calls.
"""

from __future__ import annotations

import atexit
import logging
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

__all__ = ["MAX_INTERVAL", "helper", "interval", "stop", "stopping", "unwatch", "watch"]

#: The longest time between two ticks, in seconds.
MAX_INTERVAL = 0.5
_MIN_INTERVAL = 0.02
#: Seconds the exit waits, at most, for the monitor's thread and the helpers to end.
_JOIN_LIMIT = 5.0

logger = logging.getLogger("distcomm")
_lock = threading.Lock()
_watched: weakref.WeakSet[Any] = weakref.WeakSet()
_thread: threading.Thread | None = None
_helpers: weakref.WeakSet[threading.Thread] = weakref.WeakSet()
_stopping = threading.Event()
_at_exit = False


def watch(obj: Any) -> None:
    """Call ``obj.monitor_tick(now)`` from now on; starts the thread on first use."""
    global _thread
    with _lock:
        _watched.add(obj)
        if _thread is None or not _thread.is_alive():
            _stopping.clear()
            _thread = threading.Thread(target=_run, name="distcomm-monitor", daemon=True)
            _thread.start()
            _stop_at_exit()


def helper(target: Callable[[], None], name: str) -> threading.Thread:
    """Run ``target`` in a daemon thread of its own (started here) that the exit joins like
    the monitor's (module docstring); ``target`` returns soon once :func:`stopping` is true."""
    thread = threading.Thread(target=target, name=name, daemon=True)
    with _lock:
        _helpers.add(thread)
        _stop_at_exit()
    thread.start()
    return thread


def stopping() -> bool:
    """Whether the process is exiting: a helper's loop ends at its next step."""
    return _stopping.is_set()


def _stop_at_exit() -> None:
    global _at_exit
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
    """Stop the thread and the helpers, and wait (a few seconds at most) for the tick and the
    helpers' calls in progress to end (at exit)."""
    global _thread
    _stopping.set()
    with _lock:
        thread, _thread = _thread, None
        threads = [*([thread] if thread is not None else []), *_helpers]
    deadline = time.monotonic() + _JOIN_LIMIT
    for t in threads:
        if t is not threading.current_thread() and t.ident is not None:
            t.join(max(0.0, deadline - time.monotonic()))


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
