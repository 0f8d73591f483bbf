"""How a rank process that a test started ended badly, told the same way by ``spawn`` and a warm
world: it died without a report (its exit code or signal), or it had not finished in time (its
Python stacks, dumped by faulthandler on SIGUSR1, without the processes' plumbing).
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading
import time
from collections.abc import Iterable, Mapping
from typing import TextIO

from distcomm._processes.failure_summary import ended, killed_by
from distcomm.errors import RankFailedError

__all__ = ["ask_for_stacks", "died", "listen_for_stack_requests", "read_text", "where_they_are"]

#: Seconds the ranks that timed out have to write their stacks.
STACK_WAIT = 2.0
#: The signal on which a rank dumps its stacks.
STACK_SIGNAL = signal.SIGUSR1


def died(rank: int, world_size: int, code: int | None, where: str = "") -> RankFailedError:
    """The RankFailedError for a rank that ended (exit ``code``: negative for a signal, None
    when unknown) before reporting a result; ``where`` (e.g. ``" in tests/x.py::test_y"``) is
    added after the rank."""
    if code is not None and killed_by(code) is not None:
        why = f"was {ended(code)}"
    elif code is not None:
        why = f"exited with code {code}"
    else:
        why = "ended (its connection closed)"
    text = f"rank {rank} {why} without reporting a result or a traceback"
    return RankFailedError(
        rank,
        text,
        f"rank {rank} of {world_size} failed{where}: {text}. HINT: os._exit, a crash in native "
        "code or the OOM killer end a process without a Python traceback; its output, if any, "
        "is above.",
    )


def listen_for_stack_requests(path: str) -> TextIO:
    """In a rank: dump every thread's stack to ``path`` on SIGUSR1 (from the process that
    started it). Returns the open file, which must stay open while the rank runs."""
    import faulthandler

    # Appending: after the starter empties the file, the next dump starts at its beginning
    stack_file = open(path, "a", encoding="utf-8")  # noqa: SIM115 (kept open by the caller)
    faulthandler.register(STACK_SIGNAL, file=stack_file, all_threads=True)
    return stack_file


def ask_for_stacks(pids: Mapping[int, int | None], paths: Mapping[int, str]) -> dict[int, str]:
    """Ask each rank (by its key in ``pids``) for its stacks, and read what it wrote to its path
    (``paths``, emptied first) within :data:`STACK_WAIT` seconds; a rank that wrote nothing
    gets an empty text."""
    for key, pid in pids.items():
        _empty(paths[key])
        if pid is not None:
            try:
                os.kill(pid, STACK_SIGNAL)
            except OSError:
                continue  # it is gone
    deadline = time.monotonic() + STACK_WAIT
    texts = {key: "" for key in pids}
    while time.monotonic() < deadline:  # until every dump is there and has stopped growing
        time.sleep(0.1)
        previous, texts = texts, {key: read_text(paths[key]) for key in pids}
        if all(texts.values()) and texts == previous:
            break
    return texts


def where_they_are(texts: Iterable[tuple[int, str]], plumbing: Iterable[str] = ()) -> str:
    """The stacks of each rank, ``(rank, faulthandler's dump)``, indented under ``rank N:``,
    without the frames of the processes' plumbing (multiprocessing, threading, the files
    ``plumbing`` names, runpy's for a rank started with ``python -m``)."""
    files = {threading.__file__, "<string>", "<frozen runpy>", *plumbing}
    return "".join(
        f"  rank {rank}:\n{_indent(_trim(text, files) or '(no stack: fn had not started)')}"
        for rank, text in texts
    )


def _trim(dump: str, files: set[str]) -> str:
    """Keep, of each thread in a faulthandler dump, the frames outside the plumbing; threads
    left with no frame (a parent watcher) are dropped."""
    threads = []
    for block in dump.strip().split("\n\n"):
        if not block.strip():
            continue
        header, *frames = block.strip().splitlines()
        kept = [f"  {frame.strip()}" for frame in frames if not _plumbing(frame, files)]
        if kept:
            threads.append("\n".join([header, *kept]))
    return "\n".join(threads)


def _plumbing(frame: str, files: set[str]) -> bool:
    path = frame.strip().partition('File "')[2].partition('"')[0]
    return path in files or os.path.dirname(path) == os.path.dirname(multiprocessing.__file__)


def _indent(text: str) -> str:
    return "".join(f"    {line}\n" for line in text.rstrip().splitlines())


def read_text(path: str) -> str:
    """The text of the file at ``path`` (undecodable bytes replaced), or "" if it cannot be
    read (gone, or not ours)."""
    try:
        with open(path, encoding="utf-8", errors="replace") as file:
            return file.read()
    except OSError:
        return ""


def _empty(path: str) -> None:
    """Empty a rank's stack file (a warm rank keeps one for all its runs)."""
    try:
        with open(path, "r+", encoding="utf-8") as file:
            file.truncate(0)
    except OSError:
        pass
