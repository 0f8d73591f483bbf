"""A rank's uncaught exception as its user reads it, under any launcher.

``init`` installs one ``sys.excepthook`` (and so does a backend that ends the job when a rank
dies: :func:`distcomm.backend.abort_on_uncaught_exception`). On an uncaught exception it

- tells the observers first (:func:`add_observer`: the report ``distcomm run`` reads);
- says the footnotes under the traceback (:func:`add_footnote`: where the flight recorder's
  files are);
- shows a distcomm error's traceback down to the user's call: the frames inside distcomm and its
  backends after the program's last frame are left out, and so are the exceptions it was raised
  from (its message quotes them); with ``DISTCOMM_LOG_LEVEL=debug`` everything is shown;
- in a world of several ranks, starts every line with ``[rank N] `` and writes the whole report
  in one ``write``, so that the reports of ranks failing together under ``mpirun`` never
  interleave line by line (``distcomm run`` takes the prefix off and puts its own);
- then ends the job where the backend asked for it (:func:`end_job_with`).

A hook the program installed before ``init`` is called as before (with the whole traceback);
torch's own, which only prefixes ``[rankN]: ``, is replaced by this one.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
import traceback
from collections.abc import Callable
from types import TracebackType

__all__ = [
    "add_footnote",
    "add_observer",
    "before_writing",
    "end_job_with",
    "format_exception",
    "install",
    "prefix",
    "write",
]

#: Called with the exception and its text before it is shown (a failing one is skipped).
Observer = Callable[[BaseException, str], object]

_lock = threading.Lock()
_installed = False
_rank: int | None = None
_previous: Callable[..., object] | None = None
_observers: list[Observer] = []
_ending: Callable[[BaseException], str] | None = None
_before_writing: list[Callable[[], object]] = []
#: Lines said after the traceback (the flight recorder's: where this rank's last calls are).
_footnotes: list[Callable[[], str | None]] = []
#: The hook torch.distributed installs at init_process_group: it only prefixes the lines.
_TORCH_HOOK = "_distributed_excepthook"


def install(rank: int | None) -> None:
    """Handle this process's uncaught exceptions (module docstring); ``rank``: this process's
    rank in a world of several (its lines are prefixed), None in a world of one. Installing
    again sets the rank, and puts the hook back on top of torch's (which only prefixes lines);
    a hook of the program's installed since is left where it is."""
    global _installed, _rank, _previous
    with _lock:
        if rank is not None:
            _rank = rank
        current = sys.excepthook
        if current is _hook:
            return
        if not _installed:
            _installed, _previous = True, current
            sys.excepthook = _hook
        elif _is_torch_hook(current):
            sys.excepthook = _hook


def add_observer(observer: Observer) -> None:
    """Call ``observer(exc, text)`` with each uncaught exception and its text, before it is
    shown (``distcomm run``'s failure report)."""
    _observers.append(observer)


def end_job_with(ending: Callable[[BaseException], str]) -> None:
    """After showing an uncaught exception, end the job: ``ending(exc)`` returns the line that
    says so (written with the report, in one piece), then the job is aborted
    (:func:`distcomm.backend.aborts.abort_job`)."""
    global _ending
    _ending = ending


def before_writing(callback: Callable[[], object]) -> None:
    """Call ``callback()`` before :func:`write` writes (pytest's plugin: stop capturing, so that
    the last words of a rank that ends the job are not lost in a capture file)."""
    _before_writing.append(callback)


def add_footnote(line: Callable[[], str | None]) -> None:
    """Say ``line()`` (None: nothing) under each uncaught exception's traceback, in the same
    write (the flight recorder: where this rank's last calls are)."""
    _footnotes.append(line)


def prefix() -> str:
    """``"[rank N] "`` in a world of several ranks once installed, else ``""``."""
    return "" if _rank is None else f"[rank {_rank}] "


def write(text: str) -> None:
    """Write ``text`` to the process's stderr, every line prefixed (:func:`prefix`; a line that
    already is keeps its one), in one write where the system allows (what ``sys.stderr`` holds
    is flushed first)."""
    for callback in list(_before_writing):
        with contextlib.suppress(Exception):
            callback()
    lead = prefix()
    lines = text.splitlines()
    shown = (line if not line or line.startswith(lead) else lead + line for line in lines)
    data = "".join(f"{line}\n" for line in shown).encode(errors="replace")
    stream = sys.__stderr__ if sys.__stderr__ is not None else sys.stderr
    try:
        stream.flush()
        fd = stream.fileno()
    except (AttributeError, OSError, ValueError):  # no file behind it: write through it
        stream.write(data.decode())
        stream.flush()
        return
    view = memoryview(data)
    while view:
        try:
            view = view[os.write(fd, view) :]
        except InterruptedError:
            continue
        except OSError:
            return


def format_exception(exc: BaseException) -> str:
    """``exc`` with its traceback, as shown (module docstring): a distcomm error ends at the
    user's call, without the exceptions it was raised from, unless ``DISTCOMM_LOG_LEVEL`` is
    debug."""
    shown = traceback.TracebackException(type(exc), exc, exc.__traceback__)
    if _is_distcomm_error(exc) and not logging.getLogger("distcomm").isEnabledFor(logging.DEBUG):
        kept = _user_part(exc.__traceback__)
        shown.stack = traceback.StackSummary.from_list(shown.stack[:kept])
        shown.__cause__ = shown.__context__ = None
    return "".join(shown.format())


def _hook(cls: type[BaseException], exc: BaseException, tb: TracebackType | None) -> None:
    if exc.__traceback__ is None:
        exc.__traceback__ = tb
    text = format_exception(exc)
    for observer in list(_observers):
        with contextlib.suppress(Exception):  # an observer must never hide the exception
            observer(exc, text)
    previous = _previous
    ending = _ending
    notes = "".join(f"{line}\n" for line in _notes())
    if previous is None or previous is sys.__excepthook__ or _is_torch_hook(previous):
        last = ""
        if ending is not None and not isinstance(exc, (KeyboardInterrupt, SystemExit)):
            last = ending(exc)
        write(text + notes + (last + "\n" if last else ""))
    else:
        previous(cls, exc, tb)
        last = ending(exc) if ending is not None else ""
        if notes or last:
            write(notes + last)
    if ending is not None:
        from distcomm.backend.aborts import abort_job

        abort_job("")


def _notes() -> list[str]:
    """The footnotes' lines (a failing one is left out)."""
    lines = []
    for footnote in list(_footnotes):
        with contextlib.suppress(Exception):  # a footnote must never hide the exception
            line = footnote()
            if line:
                lines.append(line)
    return lines


def _is_torch_hook(hook: Callable[..., object]) -> bool:
    return getattr(hook, "__name__", "") == _TORCH_HOOK


def _is_distcomm_error(exc: BaseException) -> bool:
    from distcomm.errors import DistcommError

    return isinstance(exc, DistcommError)


def _user_part(tb: TracebackType | None) -> int:
    """How many frames of ``tb`` to show: up to the program's last frame (all of them when the
    exception did not come out of distcomm)."""
    frames = []
    while tb is not None:
        frames.append(tb.tb_frame)
        tb = tb.tb_next
    last = max((i for i, f in enumerate(frames) if not _internal(f.f_globals)), default=None)
    return len(frames) if last is None else last + 1


def _internal(namespace: dict[str, object]) -> bool:
    """Whether a frame with globals ``namespace`` runs distcomm's code or a backend's."""
    top = str(namespace.get("__name__", "")).partition(".")[0]
    return top == "distcomm" or top.startswith("distcomm_")
