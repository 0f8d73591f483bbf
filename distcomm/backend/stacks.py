"""Where a rank is: the Python stack of the thread that uses a communicator.

When an operation times out, the rank that waited asks the ranks that had not arrived where
they are, out of band (the store on gloo and nccl, MPI's side channel, the fabric for
thread-ranks), and shows their answers in its :class:`~distcomm.errors.DistTimeoutError`. A
backend answers such a question with :func:`where` (from its monitor thread: it runs whatever
the rank's own thread is doing, asleep, computing or blocked in another collective) and
implements ``_peer_stacks`` to ask; :func:`describe` writes the answers, identical stacks once.

A stack shows the frames of the program, innermost last: a call into distcomm shows as its
outermost distcomm frame (``all_reduce``), not as the engine's wait loop inside it.
"""

from __future__ import annotations

import sys
import threading
import traceback
from collections.abc import Iterator, Mapping
from types import FrameType
from typing import Any

__all__ = ["MAX_FRAMES", "MAX_TEXT", "describe", "where"]

#: The innermost frames a stack shows.
MAX_FRAMES = 12
#: The longest stack text, in characters (what a side channel's fixed buffer holds).
MAX_TEXT = 8000
#: Packages whose frames are distcomm's plumbing: a call into them shows as its first frame.
_LIBRARY = ("distcomm", "distcomm_")


def where(comm: Any = None, *, thread: int | None = None) -> str:
    """The stack of the thread that uses ``comm`` (the one that created it: a communicator is
    used by one thread per rank), of thread ``thread`` (an ident) if given, or of the main
    thread; the text of :func:`traceback.format_list`, at most :data:`MAX_TEXT` characters."""
    if thread is None:
        main = threading.main_thread().ident
        thread = main if comm is None else getattr(comm, "_thread", main)
    if thread == threading.get_ident():
        frame: FrameType | None = sys._getframe(1)  # this thread: from the caller on
    else:
        frame = sys._current_frames().get(thread or -1)
    if frame is None:
        return "  (no Python frame: the thread has ended)\n"
    return _format(frame)


def describe(
    stacks: Mapping[int, str],
    asked: list[int],
    heading: str = "Where the ranks that had not arrived are",
) -> str:
    """The block that shows ``stacks`` (rank -> :func:`where`'s text) of the ranks ``asked``
    under ``heading``, ranks with identical stacks together, and the ranks that did not
    answer; "" if none was asked."""
    if not asked:
        return ""
    groups: dict[str, list[int]] = {}
    for rank in asked:
        if rank in stacks:
            groups.setdefault(stacks[rank], []).append(rank)
    lines = [f"{heading} (Python stacks, innermost call last):"]
    for text, ranks in groups.items():
        who = f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {_ranks(ranks)}"
        lines.append(f"  {who}:")
        lines.extend(f"  {line}" for line in text.rstrip().splitlines())
    silent = [rank for rank in asked if rank not in stacks]
    if silent:
        lines.append(
            f"  {'rank' if len(silent) == 1 else 'ranks'} {_ranks(silent)}: no answer (the "
            "process is gone, or native code holds its Python interpreter)"
        )
    return "\n".join(lines)


def _ranks(ranks: list[int]) -> str:
    return ", ".join(map(str, ranks))


def _format(frame: FrameType) -> str:
    frames = list(_program_frames(frame))
    hidden = max(0, len(frames) - MAX_FRAMES)
    summary = traceback.StackSummary.extract(iter(frames[hidden:]), capture_locals=False)
    text = "".join(summary.format())
    if hidden:
        text = f"  ... {hidden} outer frame(s) not shown\n{text}"
    if len(text) > MAX_TEXT:
        text = "  ...\n" + text[-(MAX_TEXT - 6) :]
    return text


def _program_frames(frame: FrameType) -> Iterator[tuple[FrameType, int]]:
    """The frames of ``frame``'s stack, outermost first: without threading's bootstrap and
    distcomm's runners around the program (``run_threads``), and with the innermost run of
    distcomm frames cut to its first (the call into distcomm)."""
    stack = [(f, lineno) for f, lineno in traceback.walk_stack(frame)][::-1]
    stack = [(f, n) for f, n in stack if f.f_globals.get("__name__") != "threading"] or stack
    ours = [_library(f) for f, _ in stack]
    start, end = (ours.index(False) if False in ours else 0), len(stack)
    while end > start + 1 and ours[end - 1] and ours[end - 2]:
        end -= 1
    return iter(stack[start:end])


def _library(frame: FrameType) -> bool:
    name = str(frame.f_globals.get("__name__", ""))
    return name.split(".", 1)[0] == _LIBRARY[0] or name.startswith(_LIBRARY[1])
