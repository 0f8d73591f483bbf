"""The signals ``distcomm run`` catches (SIGINT, SIGTERM): from before it makes anything of its
own (the run's folder of failure reports) until it has removed it, a signal is recorded for
the job to act on (forward it to the ranks, stop them, end with 128 + N), never left to end the
launcher or to raise KeyboardInterrupt between two steps of its cleanup."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Callable, Iterator
from types import FrameType
from typing import Any

__all__ = ["FORWARDED", "caught_signals"]

#: Signals the launcher forwards to every rank.
FORWARDED = (signal.SIGINT, signal.SIGTERM)
#: What ``signal.signal`` takes and returns.
_Handler = Callable[[int, FrameType | None], Any] | int | None


#: The list of the outermost :func:`caught_signals` block running, if any.
_catching: list[int] | None = None


@contextlib.contextmanager
def caught_signals() -> Iterator[list[int]]:
    """The :data:`FORWARDED` signals this process gets while the block runs, in order of
    arrival; the previous handlers are back afterwards. Only the main thread can catch
    signals: from another, nothing is recorded (the list stays empty). A block inside another
    gets the outer one's list: ``distcomm run`` catches from its first step (a Ctrl-C while it
    reads its arguments or loads the plugins), and the job acts on what came before it."""
    global _catching
    if threading.current_thread() is not threading.main_thread():
        yield []
        return
    if _catching is not None:
        yield _catching
        return
    signals: list[int] = []
    previous: dict[signal.Signals, _Handler] = {}
    _catching = signals
    try:
        for sig in FORWARDED:
            previous[sig] = signal.signal(sig, lambda signum, _: signals.append(signum))
        yield signals
    finally:
        for caught, handler in previous.items():
            signal.signal(caught, handler)
        _catching = None
