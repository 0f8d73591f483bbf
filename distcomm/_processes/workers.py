"""Running a Python function in N fresh processes on this node, and reporting how each ended.

The machinery behind :func:`distcomm.testing.spawn` (test ranks) and
:func:`distcomm.compat.flame.start_distributed_training` (training workers). Processes are
started with multiprocessing's ``spawn`` method (never ``fork``: a forked child would inherit the
parent's threads and communicators in whatever state they were), get the variables the caller
gives each of them, and report their result or traceback through a pipe each. The first failure
is raised at once and every other process is stopped; none outlives the call, and a process
whose parent is killed ends itself.

``distcomm run`` (:mod:`distcomm._processes.supervisor`) is the other process starter: it runs a
command, not a function, and copies output line by line.
"""

from __future__ import annotations

import contextlib
import faulthandler
import multiprocessing
import os
import pickle
import shutil
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable
from multiprocessing.connection import Connection, wait
from typing import Any, TypeVar

from distcomm import _settings
from distcomm._plugins.loader import check_backend
from distcomm._processes.rank_ends import (
    STACK_SIGNAL,
    ask_for_stacks,
    died,
    listen_for_stack_requests,
    where_they_are,
)
from distcomm._runtime.lifecycle import finalize, init
from distcomm.backend._uncaught import format_exception
from distcomm.errors import DistTimeoutError, InvalidArgumentError, RankFailedError

__all__ = ["check_call", "detach_stdin", "run_processes"]

T = TypeVar("T")
#: Seconds a rank's operations outlive the run's timeout, and a stopped rank has to exit.
_GRACE = 5.0
#: Seconds between a rank's checks that its parent is still there.
_PARENT_CHECK = 1.0


def run_processes(
    fn: Callable[..., T],
    nprocs: int,
    args: tuple[Any, ...] = (),
    *,
    variables: Callable[[int], dict[str, str]],
    backend: str | None,
    timeout: float | None,
    first_rank: int = 0,
    world_size: int | None = None,
) -> list[T]:
    """Run ``fn(*args)`` in ``nprocs`` new processes; return the results in process order.

    Process ``i`` sets ``variables(i)`` in its environment (``variables`` is called here, in
    this process), then, when ``backend`` is given, calls ``distcomm.init(backend=backend)``,
    runs ``fn(*args)``, calls ``distcomm.finalize()`` and sends the result back. With
    ``backend=None`` it initialises nothing: ``fn`` does what it needs. Each process is a fresh
    interpreter that imports the module defining ``fn`` (and re-imports the parent's main
    script, as multiprocessing does), so ``fn`` must be importable by name; ``fn``, ``args``
    and the results are pickled. The processes' stdin is ``/dev/null``; their stdout and
    stderr are this process's.

    Args:
        fn: the function every process runs.
        nprocs: the number of processes (at least 1).
        args: passed to ``fn``.
        variables: the environment variables of process ``i`` (added to this process's).
        backend: the backend every process initialises, or None for none.
        timeout: seconds for the whole run, or None for no deadline. Operations inside time
            out after ``DISTCOMM_TIMEOUT`` seconds when it is set, else a few seconds after the
            run, so that a stuck run ends with this function's DistTimeoutError.
        first_rank: the rank of process 0, for the messages (process ``i`` is rank
            ``first_rank + i``).
        world_size: the number of ranks in the job, for the messages (default ``nprocs``).

    Returns:
        ``fn``'s return values in process order.

    Raises:
        InvalidArgumentError: ``fn`` is not callable or cannot be pickled, ``args`` cannot be
            pickled, or ``nprocs`` or ``timeout`` is invalid; nothing was started.
        BackendNotFoundError: ``backend`` names no backend; nothing was started.
        RankFailedError: a process raised (its traceback), or died without reporting (its exit
            code); the first one seen is reported, with its rank, as soon as it fails, and the
            others are killed.
        DistTimeoutError: the run took longer than ``timeout``; ``missing_ranks`` are those
            that had not finished, and the message shows their stacks. All are killed.
    """
    payload = check_call(fn, nprocs, args, timeout)
    if backend is not None:
        backend = check_backend(backend)
    ranks = range(first_rank, first_rank + nprocs)
    world = world_size if world_size is not None else nprocs
    # Operations time out after DISTCOMM_TIMEOUT when the user set it (the children inherit
    # it), else a little after the run, so that a stuck run ends with this function's error.
    user_set = _settings.is_set("DISTCOMM_TIMEOUT")
    op_timeout = None if timeout is None or user_set else float(timeout) + _GRACE
    return _start_and_collect(payload, variables, backend, op_timeout, timeout, ranks, world)


def _start_and_collect(
    payload: bytes,
    variables: Callable[[int], dict[str, str]],
    backend: str | None,
    op_timeout: float | None,
    timeout: float | None,
    ranks: range,
    world_size: int,
) -> list[Any]:
    """Start a process per rank of ``ranks`` and collect their results; whatever happens, stop
    every process started, close the pipes and remove the folder of their stacks."""
    context = multiprocessing.get_context("spawn")
    stacks = tempfile.mkdtemp(prefix="distcomm-spawn-")
    procs: list[multiprocessing.process.BaseProcess] = []
    conns: list[Connection] = []
    try:
        for index in range(len(ranks)):
            proc, reader = _start_process(
                context, variables, payload, backend, op_timeout, stacks, index, ranks
            )
            procs.append(proc)
            conns.append(reader)
        return _collect(procs, conns, timeout, stacks, ranks, world_size)
    finally:
        _stop(procs)
        for conn in conns:
            conn.close()
        shutil.rmtree(stacks, ignore_errors=True)


def _start_process(
    context: multiprocessing.context.SpawnContext,
    variables: Callable[[int], dict[str, str]],
    payload: bytes,
    backend: str | None,
    op_timeout: float | None,
    stacks: str,
    index: int,
    ranks: range,
) -> tuple[multiprocessing.process.BaseProcess, Connection]:
    """Start process ``index`` (rank ``ranks[index]``); return it and the end of its pipe that
    its report comes through."""
    reader, writer = context.Pipe(duplex=False)
    proc = context.Process(
        target=_rank_main,
        args=(
            writer,
            variables(index),
            payload,
            backend,
            op_timeout,
            os.path.join(stacks, f"rank-{index}.txt"),
            os.getpid(),
        ),
        name=f"distcomm-rank-{ranks[index]}",
    )
    proc.start()
    writer.close()
    return proc, reader


def check_call(
    fn: Callable[..., Any], nprocs: int, args: tuple[Any, ...], timeout: float | None
) -> bytes:
    """Validate the arguments of a call in ``nprocs`` processes (InvalidArgumentError naming
    the bad one); return ``(fn, args)`` pickled."""
    if not isinstance(nprocs, int) or isinstance(nprocs, bool) or nprocs < 1:
        raise InvalidArgumentError(
            f"nprocs={nprocs!r} must be a positive int. HINT: e.g. 2 for two processes."
        )
    if not callable(fn):
        raise InvalidArgumentError(
            f"fn={fn!r} must be callable. HINT: pass the function itself, not its result."
        )
    if timeout is not None and (
        isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0
    ):
        raise InvalidArgumentError(
            f"timeout={timeout!r} must be a positive number of seconds, or None for no deadline. "
            "HINT: e.g. 120."
        )
    try:
        pickle.dumps(fn)
    except Exception as exc:
        raise InvalidArgumentError(
            f"fn={fn!r} cannot be pickled ({exc}); it is sent to each process, which imports "
            "it by name. HINT: define fn at the top level of an importable module (not a "
            "lambda, a nested function or a function defined in an interactive session)."
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
    timeout: float | None,
    stacks: str,
    ranks: range,
    world_size: int,
) -> list[Any]:
    """Wait for every process's report; raise at the first failure or at the deadline."""
    results: list[Any] = [None] * len(procs)
    pending = set(range(len(procs)))
    index_of: dict[Any, int] = {conn: index for index, conn in enumerate(conns)}
    index_of.update({proc.sentinel: index for index, proc in enumerate(procs)})
    deadline = None if timeout is None else time.monotonic() + timeout
    while pending:
        remaining = None if deadline is None else deadline - time.monotonic()
        if remaining is not None and remaining <= 0:
            assert timeout is not None
            raise _timed_out(sorted(pending), procs, timeout, stacks, ranks, world_size)
        watched = [conns[i] for i in pending] + [procs[i].sentinel for i in pending]
        for ready in wait(watched, remaining):
            index = index_of[ready]
            if index not in pending:
                continue
            rank = ranks[index]
            report = _receive(conns[index])
            if report is None:  # it exited and its pipe is empty: it died without reporting
                procs[index].join(_GRACE)
                raise died(rank, world_size, procs[index].exitcode)
            ok, value = report
            if not ok:
                raise RankFailedError(rank, value, f"rank {rank} of {world_size} failed:\n{value}")
            results[index] = value
            pending.discard(index)
    return results


def _receive(conn: Connection) -> tuple[bool, Any] | None:
    """The process's report, or None if it closed its pipe without one."""
    try:
        if conn.poll():
            report: tuple[bool, Any] = conn.recv()
            return report
    except (EOFError, OSError):
        pass
    return None


def _timed_out(
    indices: list[int],
    procs: list[multiprocessing.process.BaseProcess],
    timeout: float,
    stacks: str,
    ranks: range,
    world_size: int,
) -> DistTimeoutError:
    """The DistTimeoutError for processes ``indices``, with the stacks they dump on SIGUSR1."""
    pids = {i: procs[i].pid if procs[i].is_alive() else None for i in indices}
    texts = ask_for_stacks(pids, {i: os.path.join(stacks, f"rank-{i}.txt") for i in indices})
    where = where_they_are(((ranks[i], text) for i, text in texts.items()), [__file__])
    missing = [ranks[index] for index in indices]
    return DistTimeoutError(
        f"spawn: ranks {missing} of {world_size} did not finish within {timeout:g} s.\n"
        f"{where}HINT: a rank is stuck where shown (a rank outside distcomm keeps the others "
        "waiting in their next collective), or it is merely slow: raise timeout=.",
        op="spawn",
        missing_ranks=missing,
    )


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


# -- in the child process -----------------------------------------------------------------------
def _rank_main(
    conn: Connection,
    variables: dict[str, str],
    payload: bytes,
    backend: str | None,
    op_timeout: float | None,
    stack_path: str,
    parent: int,
) -> None:
    """The body of each process: set up, (init,) run fn, (finalize,) report."""
    detach_stdin()
    os.environ.update(variables)
    for stream in (sys.stdout, sys.stderr):
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None:
            reconfigure(line_buffering=True)
    threading.Thread(target=_watch_parent, args=(parent,), daemon=True).start()
    with listen_for_stack_requests(stack_path):
        try:
            _run_rank(conn, payload, backend, op_timeout)
        finally:
            faulthandler.unregister(STACK_SIGNAL)
            conn.close()


def _run_rank(
    conn: Connection, payload: bytes, backend: str | None, op_timeout: float | None
) -> None:
    """(Init,) run fn, (finalize); send ``(True, result)`` or, at once, ``(False, traceback)``."""
    try:
        fn, args = pickle.loads(payload)
        if backend is not None:
            init(backend=backend, timeout=op_timeout)
        result = fn(*args)
        if backend is not None:
            finalize()
    except BaseException as exc:
        conn.send((False, format_exception(exc)))
        if backend is not None:
            with contextlib.suppress(Exception):
                finalize()
        return
    try:
        conn.send((True, result))
    except Exception:
        conn.send((False, f"fn's result could not be sent back:\n{traceback.format_exc()}"))


def detach_stdin() -> None:
    """Point file descriptor 0 at /dev/null, so that no process reads the parent's stdin."""
    fd = os.open(os.devnull, os.O_RDONLY)
    try:
        os.dup2(fd, 0)
    finally:
        os.close(fd)


def _watch_parent(parent: int) -> None:
    """End this process if the parent that started it is gone (killed before it could stop
    us); run it in a daemon thread."""
    while True:
        time.sleep(_PARENT_CHECK)
        if os.getppid() != parent:
            os._exit(1)
