"""The body of each rank of a warm world (:class:`distcomm.testing.WarmWorld`).

A rank process starts once (started by multiprocessing's ``spawn`` method, or by a launcher as
``python -m distcomm._processes.warm_rank FOLDER``), connects to the world's controller through
the Unix socket named in ``FOLDER`` (authenticated with the key stored beside it, readable by
this user only), says which rank it is, and then runs one call after another, as ``spawn`` runs one.
For each call it takes the controller's environment, working directory, ``sys.path`` and main
module of that moment (multiprocessing's preparation of a spawned process) and a fresh
rendezvous (port and run id); it calls ``distcomm.init(backend)``, ``fn(*args)`` and
``distcomm.finalize()``, and reports back (the result, or the traceback). What the call prints
goes to a file of the folder, which the controller shows. The process ends when the controller
says so, when its connection closes, or when the controller's process is gone; on SIGTERM it
says its last words (:func:`distcomm.backend.aborts.last_words`) first.
"""

from __future__ import annotations

import contextlib
import multiprocessing.spawn
import os
import pickle
import shutil
import signal
import sys
import threading
import time
from collections.abc import Iterator
from multiprocessing.connection import Client, Connection
from types import FrameType
from typing import Any

from distcomm._processes.rank_ends import listen_for_stack_requests
from distcomm._processes.workers import detach_stdin
from distcomm._runtime.detection import detect_environment
from distcomm._runtime.lifecycle import finalize, init
from distcomm.backend._uncaught import format_exception
from distcomm.backend.aborts import last_words

__all__ = ["output_path", "serve", "serve_spawned", "stacks_path"]

#: Seconds between a rank's checks that the controller's process is still there.
_CONTROLLER_CHECK = 1.0


def stacks_path(folder: str, rank: int) -> str:
    """Where rank ``rank`` writes its stacks when asked (SIGUSR1)."""
    return os.path.join(folder, f"stacks-{rank}.txt")


def output_path(folder: str, rank: int) -> str:
    """Where rank ``rank`` writes what a call prints (emptied at the start of each call)."""
    return os.path.join(folder, f"output-{rank}.txt")


def serve_spawned(folder: str, variables: dict[str, str], log: str) -> None:
    """The body of a rank started by multiprocessing: the launcher variables of its rank, no
    stdin, its output outside calls to ``log``; then :func:`serve`."""
    detach_stdin()
    _redirect(log)
    os.environ.update(variables)
    serve(folder)


def serve(folder: str) -> None:
    """Connect to the controller in ``folder`` and run its calls until it says to stop."""
    with open(os.path.join(folder, "key"), "rb") as file:
        key = file.read()
    with open(os.path.join(folder, "address"), encoding="utf-8") as file:
        address = "\0" + file.read()
    conn = Client(address, family="AF_UNIX", authkey=key)
    launch = detect_environment()
    signal.signal(signal.SIGTERM, _terminated)
    with listen_for_stack_requests(stacks_path(folder, launch.rank)):
        conn.send(("hello", launch.rank, launch.world_size, os.getpid()))
        controller: int = conn.recv()
        threading.Thread(target=_watch_controller, args=(controller, folder), daemon=True).start()
        _serve_calls(conn, folder, launch.rank)
    conn.close()


def _serve_calls(conn: Connection, folder: str, rank: int) -> None:
    base_environ, base_cwd = dict(os.environ), os.getcwd()
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):  # the controller is gone without a word
            shutil.rmtree(folder, ignore_errors=True)
            return
        if message[0] == "close":
            return
        _, payload, environ, preparation, port, backend, op_timeout = message
        base_path, base_argv = list(sys.path), list(sys.argv)
        try:
            _enter(environ, preparation)
            with _output_to(output_path(folder, rank)):
                report = _call(payload, backend, op_timeout, port)
        finally:
            os.environ.clear()
            os.environ.update(base_environ)
            os.chdir(base_cwd)
            sys.path[:], sys.argv[:] = base_path, base_argv
        conn.send((*report, _mapped_in_dev_shm()))


def _enter(environ: dict[str, str | None], preparation: dict[str, Any]) -> None:
    """Take the controller's environment changes, and what multiprocessing gives a process it
    spawns (``sys.path``, the working directory, the main module, importable as
    ``__mp_main__``)."""
    for name, value in environ.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
    multiprocessing.spawn.prepare(preparation)


def _call(
    payload: bytes, backend: str | None, op_timeout: float | None, port: int
) -> tuple[bool, Any]:
    """Init, run fn, finalize: ``(True, result)``, or ``(False, traceback)``."""
    try:
        fn, args = pickle.loads(payload)
        if backend is not None:
            init(backend=backend, timeout=op_timeout, master_port=port)
        result = fn(*args)
        if backend is not None:
            finalize()
    except BaseException as exc:
        if backend is not None:
            with contextlib.suppress(Exception):
                finalize()
        if exc.__traceback__ is not None:  # from fn (or init) on: not this frame
            exc.__traceback__ = exc.__traceback__.tb_next
        return False, format_exception(exc)
    try:
        pickle.dumps(result)
    except Exception as exc:
        return False, f"fn's result could not be sent back: {exc!r}"
    return True, result


@contextlib.contextmanager
def _output_to(path: str) -> Iterator[None]:
    """Send file descriptors 1 and 2 (print, C libraries, faulthandler) to ``path``."""
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    saved = [os.dup(1), os.dup(2)]
    try:
        _redirect(path)
        yield
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for fd in saved:
            os.close(fd)


def _redirect(path: str) -> None:
    """Point file descriptors 1 and 2 at ``path``, emptied."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.dup2(fd, 1)
        os.dup2(fd, 2)
    finally:
        os.close(fd)


def _mapped_in_dev_shm() -> list[str]:
    """The files in /dev/shm this process maps (an MPI library's shared-memory segment): the
    controller removes those left behind by ranks that died before their library could."""
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as maps:
            return sorted({line.split(None, 5)[5].strip() for line in maps if " /dev/shm/" in line})
    except (OSError, IndexError):
        return []


def _terminated(signum: int, frame: FrameType | None) -> None:
    """SIGTERM (the controller stopping a broken world): what the backend must do before the
    process ends (MPICH's shared-memory segment removed, say), then exit."""
    last_words()
    os._exit(128 + signum)


def _watch_controller(pid: int, folder: str) -> None:
    """End this process when the controller's process is gone (killed before it could say so),
    even while a call is stuck, and remove the world's folder, which the controller could not."""
    while True:
        time.sleep(_CONTROLLER_CHECK)
        if not _alive(pid):
            shutil.rmtree(folder, ignore_errors=True)  # the controller could not
            os._exit(1)


def _alive(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie, dead but not yet reaped, does not)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as stat:
            return stat.read().rpartition(")")[2].split()[0] not in ("Z", "X")
    except (OSError, IndexError):
        return False


if __name__ == "__main__":
    serve(sys.argv[1])
