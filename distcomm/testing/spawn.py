"""`spawn`: N processes on this node, each an initialised rank, for tests of real backends.

The multi-process sibling of :func:`distcomm.testing.run_threads`. Processes are started with
multiprocessing's ``spawn`` method (never ``fork``: a forked child would inherit the parent's
threads and communicators in whatever state they were), with the launcher variables that
``distcomm run`` sets, and report their result or traceback through a pipe each.
"""

from __future__ import annotations

import contextlib
import faulthandler
import multiprocessing
import os
import pickle
import shutil
import signal
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable
from multiprocessing.connection import Connection, wait
from typing import Any, TypeVar

from distcomm.errors import DistTimeoutError, InvalidArgumentError, RankFailedError
from distcomm.launch import check_backend, exit_status, free_port, launch_variables
from distcomm.lifecycle import finalize, init

__all__ = ["spawn"]

T = TypeVar("T")
#: Seconds a rank's operations outlive the run's timeout, and a stopped rank has to exit.
_GRACE = 5.0
#: Seconds the ranks that timed out have to write their stacks.
_STACK_WAIT = 2.0
#: Seconds between a rank's checks that its parent is still there.
_PARENT_CHECK = 1.0


def spawn(
    fn: Callable[..., T],
    nprocs: int,
    *args: Any,
    backend: str = "gloo",
    timeout: float = 120.0,
) -> list[T]:
    """Run ``fn(*args)`` in ``nprocs`` processes, each an initialised rank; return the results.

    Each process gets the variables that ``distcomm run`` sets (RANK, WORLD_SIZE, LOCAL_RANK,
    LOCAL_WORLD_SIZE, GROUP_RANK, GROUP_WORLD_SIZE, MASTER_ADDR=127.0.0.1, one free MASTER_PORT,
    PYTHONUNBUFFERED=1) plus ``DISTCOMM_BACKEND=backend``, calls
    ``distcomm.init(backend=backend)``, runs ``fn(*args)``, calls ``distcomm.finalize()`` and
    sends the result back. Processes start with multiprocessing's ``spawn`` method: each one is
    a fresh interpreter that imports the module defining ``fn`` (and re-imports the parent's
    main script, as multiprocessing does, so a script needs ``if __name__ == "__main__":``).
    ``fn`` must therefore be importable by name: defined at the top level of a module, not a
    lambda or a nested function. ``fn``, ``args`` and the results are pickled. The processes'
    stdin is ``/dev/null``; their stdout and stderr are this process's.

    Args:
        fn: the function every rank runs.
        nprocs: the number of processes (at least 1).
        *args: passed to ``fn``.
        backend: the backend every rank initialises (``"fakelink"`` runs only at nprocs=1).
        timeout: seconds for the whole run. Operations inside time out a few seconds later, so
            a stuck run ends with this function's DistTimeoutError.

    Returns:
        ``fn``'s return values in rank order.

    Raises:
        InvalidArgumentError: ``fn`` is not callable or cannot be pickled, ``args`` cannot be
            pickled, or ``nprocs`` or ``timeout`` is invalid; nothing was started.
        BackendNotFoundError: ``backend`` names no backend; nothing was started.
        RankFailedError: a rank raised (its traceback), or died without reporting (its exit
            code); the first one seen is reported as soon as it fails, and the others are
            killed.
        DistTimeoutError: the run took longer than ``timeout``; ``missing_ranks`` are those
            that had not finished, and the message shows their stacks. All are killed.
    """
    payload = _check(fn, nprocs, args, timeout)
    backend = check_backend(backend)
    context = multiprocessing.get_context("spawn")
    port = free_port()
    stacks = tempfile.mkdtemp(prefix="distcomm-spawn-")
    procs: list[multiprocessing.process.BaseProcess] = []
    conns: list[Connection] = []
    try:
        for rank in range(nprocs):
            reader, writer = context.Pipe(duplex=False)
            proc = context.Process(
                target=_rank_main,
                args=(
                    writer,
                    launch_variables(rank, nprocs, port, backend),
                    payload,
                    backend,
                    float(timeout) + _GRACE,
                    os.path.join(stacks, f"rank-{rank}.txt"),
                    os.getpid(),
                ),
                name=f"distcomm-rank-{rank}",
            )
            proc.start()
            writer.close()
            procs.append(proc)
            conns.append(reader)
        return _collect(procs, conns, float(timeout), stacks)
    finally:
        _stop(procs)
        for conn in conns:
            conn.close()
        shutil.rmtree(stacks, ignore_errors=True)


def _check(fn: Callable[..., Any], nprocs: int, args: tuple[Any, ...], timeout: float) -> bytes:
    """Validate the arguments; return ``(fn, args)`` pickled."""
    if not isinstance(nprocs, int) or isinstance(nprocs, bool) or nprocs < 1:
        raise InvalidArgumentError(
            f"nprocs={nprocs!r} must be a positive int. HINT: e.g. spawn(fn, 2) for two ranks."
        )
    if not callable(fn):
        raise InvalidArgumentError(
            f"fn={fn!r} must be callable. HINT: pass the function itself, not its result."
        )
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
        raise InvalidArgumentError(
            f"timeout={timeout!r} must be a positive number of seconds. HINT: the default is 120."
        )
    try:
        pickle.dumps(fn)
    except Exception as exc:
        raise InvalidArgumentError(
            f"fn={fn!r} cannot be pickled ({exc}); spawn sends it to each process, which imports "
            "it by name. HINT: define fn at the top level of an importable module (not a lambda, "
            "a nested function or a function defined in an interactive session)."
        ) from exc
    try:
        return pickle.dumps((fn, args))
    except Exception as exc:
        raise InvalidArgumentError(
            f"args={args!r} cannot be pickled ({exc}). HINT: pass plain data, arrays or tensors; "
            "create anything else inside fn."
        ) from exc


def _collect(
    procs: list[multiprocessing.process.BaseProcess],
    conns: list[Connection],
    timeout: float,
    stacks: str,
) -> list[Any]:
    """Wait for every rank's report; raise at the first failure or at the deadline."""
    nprocs = len(procs)
    results: list[Any] = [None] * nprocs
    pending = set(range(nprocs))
    rank_of: dict[Any, int] = {conn: rank for rank, conn in enumerate(conns)}
    rank_of.update({proc.sentinel: rank for rank, proc in enumerate(procs)})
    deadline = time.monotonic() + timeout
    while pending:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise _timed_out(sorted(pending), procs, timeout, stacks)
        watched = [conns[r] for r in pending] + [procs[r].sentinel for r in pending]
        for ready in wait(watched, remaining):
            rank = rank_of[ready]
            if rank not in pending:
                continue
            report = _receive(conns[rank])
            if report is None:  # it exited and its pipe is empty: it died without reporting
                procs[rank].join(_GRACE)
                raise _died(rank, nprocs, procs[rank].exitcode)
            ok, value = report
            if not ok:
                raise RankFailedError(rank, value, f"rank {rank} of {nprocs} failed:\n{value}")
            results[rank] = value
            pending.discard(rank)
    return results


def _died(rank: int, nprocs: int, code: int | None) -> RankFailedError:
    """The RankFailedError for a rank that exited with ``code`` before reporting."""
    if code is not None and code < 0:
        why = f"was killed by {signal.Signals(-code).name} (exit code {exit_status(code)})"
    else:
        why = f"exited with code {code}"
    text = f"rank {rank} {why} without reporting a result or a traceback"
    return RankFailedError(
        rank,
        text,
        f"rank {rank} of {nprocs} failed: {text}. HINT: os._exit, a crash in native code or the "
        "OOM killer end a process without a Python traceback; its output, if any, is above.",
    )


def _receive(conn: Connection) -> tuple[bool, Any] | None:
    """The rank's report, or None if it closed its pipe without one."""
    try:
        if conn.poll():
            report: tuple[bool, Any] = conn.recv()
            return report
    except (EOFError, OSError):
        pass
    return None


def _timed_out(
    ranks: list[int],
    procs: list[multiprocessing.process.BaseProcess],
    timeout: float,
    stacks: str,
) -> DistTimeoutError:
    """The DistTimeoutError for ``ranks``, with the stacks they dump on SIGUSR1."""
    paths = {rank: os.path.join(stacks, f"rank-{rank}.txt") for rank in ranks}
    for rank in ranks:
        pid = procs[rank].pid
        if pid is not None and procs[rank].is_alive():
            os.kill(pid, signal.SIGUSR1)
    deadline = time.monotonic() + _STACK_WAIT
    texts = {rank: "" for rank in ranks}
    while time.monotonic() < deadline:  # until every dump is there and has stopped growing
        time.sleep(0.1)
        previous, texts = texts, {rank: _read(path) for rank, path in paths.items()}
        if all(texts.values()) and texts == previous:
            break
    where = "".join(
        f"  rank {rank}:\n{_indent(_trim(text) or '(no stack: fn had not started)')}"
        for rank, text in texts.items()
    )
    return DistTimeoutError(
        f"spawn: ranks {ranks} of {len(procs)} did not finish within {timeout:g} s.\n{where}"
        "HINT: a rank is stuck where shown (a rank outside distcomm keeps the others waiting in "
        "their next collective), or it is merely slow: raise timeout=.",
        op="spawn",
        missing_ranks=ranks,
    )


def _read(path: str) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as file:
            return file.read()
    except OSError:
        return ""


def _trim(dump: str) -> str:
    """Keep, of each thread in a faulthandler dump, the frames outside the process's plumbing.

    Frames in multiprocessing, threading and this module are dropped, and so are threads left
    with no frame (this module's parent watcher).
    """
    threads = []
    for block in dump.strip().split("\n\n"):
        header, *frames = block.strip().splitlines()
        kept = [f"  {frame.strip()}" for frame in frames if not _plumbing(frame)]
        if kept:
            threads.append("\n".join([header, *kept]))
    return "\n".join(threads)


def _plumbing(frame: str) -> bool:
    path = frame.strip().partition('File "')[2].partition('"')[0]
    return path in (__file__, threading.__file__, "<string>") or os.path.dirname(
        path
    ) == os.path.dirname(multiprocessing.__file__)


def _indent(text: str) -> str:
    return "".join(f"    {line}\n" for line in text.rstrip().splitlines())


def _stop(procs: list[multiprocessing.process.BaseProcess]) -> None:
    """Terminate every live process, kill those still there after the grace, join them all."""
    for proc in procs:
        if proc.is_alive():
            proc.terminate()
    deadline = time.monotonic() + _GRACE
    for proc in procs:
        proc.join(max(0.0, deadline - time.monotonic()))
    for proc in procs:
        if proc.is_alive():
            proc.kill()
        proc.join()


# -- in the rank's process ----------------------------------------------------------------------
def _rank_main(
    conn: Connection,
    variables: dict[str, str],
    payload: bytes,
    backend: str,
    op_timeout: float,
    stack_path: str,
    parent: int,
) -> None:
    """The body of each rank's process: set up, init, run fn, finalize, report."""
    _detach_stdin()
    os.environ.update(variables)
    for stream in (sys.stdout, sys.stderr):
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None:
            reconfigure(line_buffering=True)
    threading.Thread(target=_watch_parent, args=(parent,), daemon=True).start()
    with open(stack_path, "w", encoding="utf-8") as stack_file:
        faulthandler.register(signal.SIGUSR1, file=stack_file, all_threads=True)
        try:
            _run_rank(conn, payload, backend, op_timeout)
        finally:
            faulthandler.unregister(signal.SIGUSR1)
            conn.close()


def _run_rank(conn: Connection, payload: bytes, backend: str, op_timeout: float) -> None:
    """Init, run fn, finalize; send ``(True, result)`` or, at once, ``(False, traceback)``."""
    try:
        fn, args = pickle.loads(payload)
        init(backend=backend, timeout=op_timeout)
        result = fn(*args)
        finalize()
    except BaseException:
        conn.send((False, traceback.format_exc()))
        with contextlib.suppress(Exception):
            finalize()
        return
    try:
        conn.send((True, result))
    except Exception:
        conn.send((False, f"fn's result could not be sent back:\n{traceback.format_exc()}"))


def _detach_stdin() -> None:
    """Point file descriptor 0 at /dev/null, so that no rank reads the parent's stdin."""
    fd = os.open(os.devnull, os.O_RDONLY)
    try:
        os.dup2(fd, 0)
    finally:
        os.close(fd)


def _watch_parent(parent: int) -> None:
    """End this process if the parent that spawned it is gone (killed before it could stop us)."""
    while True:
        time.sleep(_PARENT_CHECK)
        if os.getppid() != parent:
            os._exit(1)
