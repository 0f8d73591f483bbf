"""The flight recorder: ``DISTCOMM_TRACE=N`` keeps each rank's last N collectives and writes them
where ``distcomm trace`` reads them.

Each entry (made by the communicator itself, on its plans as on its pipeline, no hook:
:mod:`~distcomm.backend._pipeline.recording`): the operation, its ``seq``, the group's global
ranks, shape, dtype, bytes, root, the call site (the first frame outside distcomm), when it was
issued and completed (wall clock), and its error. Both stamps are read after the device clock
(:mod:`~distcomm._device_clock`): for a blocking call on a CUDA tensor, once the device finished
the work queued before the call, and then the call's own. The ring is written to
``DISTCOMM_TRACE_DIR`` (default ``./distcomm-trace/<job>``: :func:`distcomm._traces.traces_folder`)
as ``rank-<N>.json`` (0600, in a 0700 folder), saying why: at exit, when an operation of this
rank times out, on ``DISTCOMM_TRACE_SIGNAL`` (default SIGUSR2) and on SIGTERM (both chained to
the handlers already installed), before a rank aborts the job (every rank's, as its last words:
:mod:`distcomm.backend.aborts`), on :func:`dump_trace`, and in between as its black box
(:class:`BlackBox`: a thread that rewrites the file when the ring changed, and answers the
signals while the main thread waits inside the engine); at init an empty file replaces an earlier
job's. A handler that comes in the middle of its own thread's write does not write, and a SIGTERM
then ends the rank after that write. A forked child keeps none of it. Off (no
DISTCOMM_TRACE), no communicator has a recorder: a test of one attribute per call.
"""

from __future__ import annotations

import atexit
import collections
import contextlib
import glob
import json
import os
import select
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
from distcomm._traces import traces_folder
from distcomm.backend import _uncaught, aborts
from distcomm.backend._pipeline import recording
from distcomm.errors import DistTimeoutError, NotInitializedError

if TYPE_CHECKING:
    from distcomm.environment.info import LaunchInfo

__all__ = ["FlightRecorder", "attach", "dump_trace", "start_from_environment"]

_current: FlightRecorder | None = None
_box: BlackBox | None = None
#: The signals distcomm's handler answers: its handler and the one before it.
_chained: dict[int, tuple[Callable[..., Any], Any]] = {}
#: The signal that makes the rank write and go on (``DISTCOMM_TRACE_SIGNAL``); and those that
#: end the rank but came in the middle of a write of the main thread (ended by after it).
_asks: int | None = None
_deferred: list[int] = []
#: The black box writes the ring when it changed, at most every ``_EVERY`` seconds, and waits
#: at least ``_SHARE`` times as long as its last write took (at most 2% of the time).
_EVERY, _SHARE = 0.25, 50
#: Kinds, call sites and shapes a recorder keeps in JSON before it starts again.
_KEPT = 4096


class FlightRecorder:
    """The last ``size`` collectives of this rank, and where to write them. The communicators
    of this rank append their entries (:meth:`add`; :mod:`distcomm.backend._pipeline.recording`)
    from the time :func:`attach` gives them this recorder."""

    def __init__(self, size: int, path: str, rank: int, world_size: int) -> None:
        self.path, self.rank, self.world_size = path, rank, world_size
        self.entries: collections.deque[list[Any]] = collections.deque(maxlen=size)
        #: Keep an entry: the ring's own append (no Python frame per call), until :meth:`stop`.
        self.add: Callable[[list[Any]], None] = self.entries.append
        #: One write at a time (the black box's thread, a signal, exit); after the last one
        #: (:meth:`close`), none.
        self._writing = threading.Lock()
        self.closed = False
        #: The JSON of each entry written, by ``id``, with the entry (which keeps the id its own)
        #: and its times and error then: a write encodes only the entries new or changed since.
        self._texts: dict[int, tuple[list[Any], Any, Any, str]] = {}
        #: The JSON of each kind, call site and shape met (few in a program; reset when many).
        self._known: dict[tuple[str, Any], str] = {}
        #: The thread writing now (a signal handler of the same thread does not write).
        self._writer: int | None = None
        #: What the ring held at the last write (:meth:`changed`).
        self._written: tuple[int, int, Any, Any] | None = None

    def retract(self, entry: list[Any]) -> None:
        if self.entries and self.entries[-1] is entry:
            self.entries.pop()

    def failed(self, entry: list[Any], error: BaseException) -> None:
        entry[recording.ERROR] = f"{type(error).__name__}: {error}".splitlines()[0]
        if isinstance(error, DistTimeoutError):
            self.dump("timeout")

    def records(self) -> list[dict[str, Any]]:
        """The entries kept, oldest first, as the dump writes them."""
        return json.loads(f"[{', '.join(map(self._text, list(self.entries)))}]")

    def _text(self, entry: list[Any]) -> str:
        """``entry``'s record in JSON (:data:`recording.FIELDS`): its kind's fields, its site
        and its shape are written once each (few in a program), the rest per entry."""
        kind, seq, shape, site, issued, completed, error = entry
        head = self._once(("kind", kind), lambda: _head(kind))
        where = self._once(("site", site), lambda: json.dumps(format_site(site)))
        size = self._once(
            ("shape", shape), lambda: json.dumps(None if shape is None else [int(n) for n in shape])
        )
        return (
            f'{{{head}, "seq": {seq}, "shape": {size}, "site": {where}, '
            f'"issued": {_number(issued)}, "completed": {_number(completed)}, '
            f'"error": {"null" if error is None else json.dumps(error)}}}'
        )

    def _once(self, key: tuple[str, Any], encode: Callable[[], str]) -> str:
        """The JSON of ``key`` (a kind, a site or a shape), encoded the first time."""
        text = self._known.get(key)
        if text is None:
            if len(self._known) >= _KEPT:
                self._known.clear()
            text = self._known[key] = encode()
        return text

    def changed(self) -> bool:
        """Whether the ring changed since the last write: an entry added, or the newest one
        finished."""
        return self._state() != self._written

    def _state(self) -> tuple[int, int, Any, Any]:
        """The ring's length, and its newest entry with its completion and error."""
        try:
            newest = self.entries[-1]
        except IndexError:  # empty (or emptied meanwhile by a retraction)
            return (0, id(None), None, None)
        return (len(self.entries), id(newest), newest[-2], newest[-1])

    def dump(self, reason: str = "request") -> str | None:
        """Write the ring to this rank's file (atomically), saying why (``reason``: ``start``,
        ``exit``, ``timeout``, the signal's name, ``abort``, ``request`` or ``black box``);
        return its path. Nothing is written after :meth:`close`; None, and nothing written,
        when a signal handler asks in the middle of this thread's own write (that write goes
        on)."""
        me = threading.get_ident()
        if self._writer == me:
            return None
        with self._writing:
            self._writer = me
            try:
                return self._write(reason)
            finally:
                self._writer = None

    def _write(self, reason: str) -> str:
        if not self.closed:
            self._written = self._state()
            kept = list(self.entries)  # one C call: appends of other threads wait for it
            texts: dict[int, tuple[list[Any], Any, Any, str]] = {}
            encoded = []
            for entry in kept:
                ended, error = entry[recording.COMPLETED], entry[recording.ERROR]  # before: a
                known = self._texts.get(id(entry))  # change while it is encoded shows next time
                if known is not None and known[1] is ended and known[2] is error:
                    text = known[3]
                else:
                    text = self._text(entry)
                texts[id(entry)] = (entry, ended, error, text)
                encoded.append(text)
            self._texts = texts
            head = {
                "rank": self.rank,
                "world_size": self.world_size,
                "host": socket.gethostname(),
                "pid": os.getpid(),
                "dumped": time.time(),
                "reason": reason,
            }
            document = f'{json.dumps(head)[:-1]}, "entries": [{", ".join(encoded)}]}}'
            private_folders(os.path.dirname(self.path))
            flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC
            temporary = f"{self.path}.tmp"  # one write at a time
            with os.fdopen(os.open(temporary, flags, 0o600), "w", encoding="utf-8") as out:
                out.write(document)
            os.replace(temporary, self.path)
        return self.path

    def close(self, reason: str) -> None:
        """The last write (``reason``: exit, or an abort's last words): none after it."""
        with contextlib.suppress(OSError):
            self.dump(reason)
        with self._writing:
            self.closed = True

    def stop(self) -> None:
        """Keep no more entries."""
        self.add = _ignore


def _head(kind: tuple[Any, ...]) -> str:
    """The fields of an entry's kind (:data:`recording.HEAD`), as JSON members."""
    op, group, dtype, nbytes, root = kind
    fields = {"op": op, "group": list(group), "dtype": dtype}
    fields |= {"bytes": None if dtype is None else nbytes, "root": root}
    return json.dumps(fields)[1:-1]


def _number(value: float | None) -> str:
    """A time in JSON."""
    return "null" if value is None else repr(value)


def _ignore(entry: list[Any]) -> None:
    """A stopped recorder's ``add``."""


def attach(comm: Any) -> None:
    """Give ``comm`` (a communicator ``init`` made) to this process's flight recorder, if one
    runs: its calls, and those of the groups made from it, are kept."""
    if _current is not None and hasattr(comm, "_record_into"):
        comm._record_into(_current)


def start_from_environment(launch: LaunchInfo, rank: int, world_size: int) -> None:
    """Start the recorder that DISTCOMM_TRACE asks for, and its black box (init; once per
    process).

    Raises:
        InvalidArgumentError: DISTCOMM_TRACE is not a positive number of operations, or
            DISTCOMM_TRACE_SIGNAL names no signal.
    """
    global _current, _box, _asks
    keep = int(_settings.read("DISTCOMM_TRACE"))
    if not keep:
        return
    signum: signal.Signals = _settings.read("DISTCOMM_TRACE_SIGNAL")
    if _current is not None:
        return
    job = launch.job_id or f"{launch.method}-{launch.master_port or 'local'}"
    path = os.path.join(traces_folder(job), f"rank-{rank}.json")
    _current = FlightRecorder(keep, path, rank, world_size)
    _current.dump("start")  # replaces an earlier job's file in the same folder at once
    if rank == 0:  # and the files of the ranks an earlier, larger job had beyond this one's
        for stale in glob.glob(os.path.join(glob.escape(os.path.dirname(path)), "rank-*.json")):
            number = os.path.basename(stale)[5:-5]
            if number.isdigit() and int(number) >= world_size:
                with contextlib.suppress(OSError):
                    os.unlink(stale)
    atexit.register(_close, "exit")
    aborts.add_last_words(lambda: _close("abort"))
    _asks = signum
    for sig in {signum, signal.SIGTERM}:
        _chain(sig)
    _box = BlackBox(_current, frozenset(_chained))
    os.register_at_fork(after_in_child=_forget)
    if not _settings.read("DISTCOMM_RUN_REPORTS"):  # distcomm run says it once for the job
        _uncaught.add_footnote(_where)


def _where() -> str | None:
    """The line under an uncaught exception's traceback: where this rank's calls are."""
    if _current is None:
        return None
    path = _current.path
    every = f"every rank's: distcomm trace {os.path.dirname(path)}"
    return f"distcomm: this rank's last calls: {path}; {every}"


class BlackBox:
    """The recorder's thread: it rewrites the rank's file when the ring changed (at most every
    0.25 s, and never more than 2% of the time: what a rank killed by SIGKILL or a C abort
    leaves), and answers the recorder's signals while the main thread is inside the engine (a
    burst of one signal: one write).

    A Python signal handler runs only in the main thread, between two instructions: never while
    the main thread waits in C. The interpreter's own C handler, though, writes each signal's
    number to the wakeup fd (:func:`signal.set_wakeup_fd`): this thread reads it, writes the
    ring, and, for a signal whose handler before distcomm's was the default one (SIGTERM),
    ends the process by it, as the main thread would. A wakeup fd set before is passed each
    number it was sent. Without the main thread (init in another thread), or once a program
    sets its own wakeup fd (asyncio's signal handlers do), signals wait for the main thread as
    before; the file is kept current all the same.
    """

    def __init__(self, recorder: FlightRecorder, signals: frozenset[int]) -> None:
        self.recorder, self.signals = recorder, signals
        self.read_end, self.write_end = os.pipe()  # not inherited by programs run
        for end in (self.read_end, self.write_end):
            os.set_blocking(end, False)
        #: The wakeup fd replaced (-1: none), and whether the signals come to this thread.
        self.forward, self.answers = -1, False
        if threading.current_thread() is threading.main_thread():
            with contextlib.suppress(ValueError, OSError):
                self.forward = signal.set_wakeup_fd(self.write_end, warn_on_full_buffer=False)
                self.answers = True
        self.thread = threading.Thread(target=self._run, name="distcomm-black-box", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        pause = _EVERY
        while not self.recorder.closed:
            try:
                ready, _, _ = select.select([self.read_end], [], [], pause)
                numbers = os.read(self.read_end, 64) if ready else b""
            except BlockingIOError:
                continue
            except (OSError, ValueError):  # closed: this process forked, or is ending
                return
            for signum in dict.fromkeys(numbers):  # a burst of one signal: one write
                self._answer(signum)
            if not ready and self.recorder.changed():
                started = time.perf_counter()
                with contextlib.suppress(OSError):
                    self.recorder.dump("black box")
                pause = max(_EVERY, _SHARE * (time.perf_counter() - started))

    def _answer(self, signum: int) -> None:
        if self.forward >= 0:
            with contextlib.suppress(OSError):
                os.write(self.forward, bytes([signum]))
        if signum not in self.signals:
            return
        _dump_quietly(signal.Signals(signum).name)
        if _ends_process(signum):
            _end_by(signum)

    def forget(self) -> None:
        """In a forked child: give the wakeup fd back, close the pipe (no thread reads it)."""
        if self.answers:
            with contextlib.suppress(ValueError, OSError):
                signal.set_wakeup_fd(self.forward)
        for end in (self.read_end, self.write_end):
            with contextlib.suppress(OSError):
                os.close(end)


def _forget() -> None:
    """A forked child (a data loader's worker) keeps none of its parent's recorder: its signals
    must not reach the parent's black box, nor its copy of the ring overwrite the parent's
    file."""
    global _current, _box
    if _box is not None:
        _box.forget()
    _current = _box = None


def _chain(sig: signal.Signals) -> None:
    """Dump on ``sig``, then do what was done before (the previous handler, or the default)."""
    if threading.current_thread() is not threading.main_thread():
        return
    previous = signal.getsignal(sig)

    def handler(signum: int, frame: FrameType | None) -> None:
        wrote = _dump_quietly(signal.Signals(signum).name)
        if callable(previous):
            previous(signum, frame)
        elif _ends_process(signum):
            if wrote or not _answered():
                signal.signal(signum, signal.SIG_DFL)
                os.kill(os.getpid(), signum)
            # else this handler interrupted a write of this thread: once it is done, the black
            # box ends the rank, or, if that write was the last, ``_close``
            _deferred.append(signum)

    with contextlib.suppress(ValueError, OSError):
        signal.signal(sig, handler)
        _chained[sig] = (handler, previous)


def _ends_process(signum: int) -> bool:
    """Whether ``signum`` ends the process once dumped: distcomm's handler is still the one
    installed, and the one before it was the default (never for ``DISTCOMM_TRACE_SIGNAL``'s:
    the rank goes on)."""
    handler, previous = _chained.get(signum, (None, None))
    return (
        handler is not None
        and signal.getsignal(signum) is handler
        and previous == signal.SIG_DFL
        and signum != _asks
    )


def _end_by(signum: int) -> None:
    """End this process by ``signum``, from a thread that is not the main one (which alone may
    call :func:`signal.signal`): the C library's default action, then the signal."""
    import ctypes

    libc = ctypes.CDLL(None)
    libc.signal.argtypes, libc.signal.restype = (ctypes.c_int, ctypes.c_void_p), ctypes.c_void_p
    libc.signal(signum, None)  # SIG_DFL
    os.kill(os.getpid(), signum)


def _answered() -> bool:
    """Whether the black box answers the signals: its pipe is still the wakeup fd (a program
    may have set its own since). The main thread's (a handler's) question."""
    if _box is None or not _box.answers:
        return False
    try:
        current = signal.set_wakeup_fd(-1)
        signal.set_wakeup_fd(current, warn_on_full_buffer=False)
    except (ValueError, OSError):
        return False
    return current == _box.write_end


def _dump_quietly(reason: str) -> bool:
    """Write the ring, if a recorder runs; False when it could not (another write of this
    thread was under way, or the file could not be written)."""
    if _current is None:
        return False
    try:
        return _current.dump(reason) is not None
    except OSError:
        return False


def _close(reason: str) -> None:
    """The last write (at exit, or an abort's last words); then a signal that arrived during it
    and ends the rank does (the black box may not get to it: the interpreter is ending)."""
    if _current is not None:
        _current.close(reason)
    if _deferred:
        _end_by(_deferred[0])


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
    return _current.dump("request")
