"""Where a rank is: the Python stack of the thread that uses a communicator.

When an operation times out, the rank that waited asks the ranks that had not arrived where
they are, out of band (the store on gloo and nccl, MPI's side channel, the fabric for
thread-ranks), and shows their answers in its :class:`~distcomm.errors.DistTimeoutError`. A
backend answers such a question with :func:`answer` (from its monitor thread: it runs whatever
the rank's own thread is doing, asleep, computing or blocked in another collective) and
implements ``_peer_stacks`` to ask; :func:`describe` writes the stacks, identical ones once.
An answer is the stack (:func:`where`) and what the rank called on its communicators since the
ranks last agreed (their histories, :mod:`distcomm.backend._pipeline.mismatch_check`), which
the rank that asked compares with its own to find a collective mismatch; :func:`split` takes
an answer apart.

A stack shows the frames of the program, innermost last: a call into distcomm shows as its
outermost distcomm frame (``all_reduce``), not as the engine's wait loop inside it.
"""

from __future__ import annotations

import json
import sys
import threading
import traceback
from collections.abc import Iterator, Mapping
from types import FrameType
from typing import Any

from distcomm.backend._pipeline import history_dumps

__all__ = ["MAX_FRAMES", "MAX_HISTORIES", "MAX_TEXT", "answer", "describe", "split", "where"]

#: The innermost frames a stack shows.
MAX_FRAMES = 12
#: The longest stack text, in characters (what a side channel's fixed buffer holds).
MAX_TEXT = 8000
#: The longest text of the histories an answer carries, in characters.
MAX_HISTORIES = 16000
#: Between the stack and the histories in an answer (never in a stack's text).
_SEPARATOR = "\x1e"
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


def answer(comm: Any = None) -> str:
    """What a rank answers a peer that asks "where are you?" about ``comm``: the stack of
    :func:`where`, and what this process called on its communicators since the ranks last
    agreed (``comm``'s first), which the asking rank compares with its own. A backend sends
    it as it is; :func:`split` takes it apart."""
    text = where(comm)
    calls = _histories(comm)
    return f"{text}{_SEPARATOR}{calls}" if calls else text


def split(answer: str) -> tuple[str, list[dict[str, Any]]]:
    """An answer (:func:`answer`) taken apart: the stack's text, and the histories it carries
    (:meth:`~distcomm.backend._pipeline.mismatch_check.MismatchCheck.dump`; none if it
    carries none or they do not parse)."""
    text, _, calls = answer.partition(_SEPARATOR)
    try:
        dumps = json.loads(calls)["histories"] if calls else []
    except (ValueError, KeyError, TypeError):
        dumps = []
    return text, [d for d in dumps if isinstance(d, dict)]


def _histories(comm: Any) -> str:
    """What this process called on its communicators, ``comm``'s first (its current call only
    when it keeps no history), as JSON of at most :data:`MAX_HISTORIES` characters (the newest
    calls of each kept); "" if there is nothing to say."""
    mine = getattr(comm, "_mismatch_check", None)
    first: list[Any] = [mine] if mine is not None else []
    if mine is None and isinstance(getattr(comm, "seq", None), int):
        first = [history_dumps.minimal_dump(comm)]
    dumps: list[str] = []
    room = MAX_HISTORIES
    for h in first + [h for h in history_dumps.live_checks() if h is not mine]:
        keep = history_dumps.RING + 1
        site = None if isinstance(h, dict) else _current_site(h.owner())
        while True:
            data = h if isinstance(h, dict) else h.dump(keep=keep, site=site)
            text = json.dumps(data, separators=(",", ":"))
            if len(text) < room or keep <= 1 or isinstance(h, dict):
                break
            keep //= 2
        if len(text) >= room:
            break
        dumps.append(text)
        room -= len(text) + 1
    return '{"histories":[' + ",".join(dumps) + "]}" if dumps else ""


def _current_site(comm: Any) -> str | None:
    """``file:line`` of the program's call that ``comm``'s thread is making now, if it is in
    one of ``comm``'s collectives (blocked in the engine, or voting before one), else None."""
    h = getattr(comm, "_mismatch_check", None)
    seq = getattr(comm, "seq", 0)
    if comm is None or not seq or seq not in (getattr(comm, "blocked_seq", 0), h and h.voting):
        return None
    frame = sys._current_frames().get(getattr(comm, "_thread", -1) or -1)
    while frame is not None and not _library(frame):  # the engine's or threading's frames
        frame = frame.f_back
    while frame is not None and _library(frame):  # distcomm's, out to the program's call
        frame = frame.f_back
    return None if frame is None else f"{frame.f_code.co_filename}:{frame.f_lineno}"


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
            groups.setdefault(split(stacks[rank])[0], []).append(rank)
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
