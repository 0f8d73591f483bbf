"""`spawn`: N processes on this node, each an initialised rank, for tests of real backends.

The multi-process sibling of :func:`distcomm.testing.run_threads`: the launcher variables that
``distcomm run`` sets, over the process machinery of :mod:`distcomm._processes.workers`
(multiprocessing's ``spawn`` method, never ``fork``; a result or a traceback back from each rank
through a pipe).
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import Any, TypeVar

from distcomm._plugins.loader import check_backend
from distcomm._processes.variables import launch_variables, new_run_id
from distcomm._processes.workers import run_processes
from distcomm.backend.ports import free_port
from distcomm.errors import DistTimeoutError, InvalidArgumentError, RankFailedError

__all__ = ["spawn"]

T = TypeVar("T")


def spawn(
    fn: Callable[..., T],
    nprocs: int,
    *args: Any,
    backend: str = "gloo",
    timeout: float = 120.0,
    max_restarts: int = 0,
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
        timeout: seconds for the whole run. Operations inside time out after
            ``DISTCOMM_TIMEOUT`` seconds when it is set (their DistTimeoutError names the ranks
            that had not arrived), else a few seconds after the run, so that a stuck run ends
            with this function's DistTimeoutError. Each attempt has the whole timeout.
        max_restarts: when a rank fails (or the run times out), stop every rank and run
            again in a fresh world (new processes, run id and port;
            ``TORCHELASTIC_RESTART_COUNT`` and ``distcomm.restart_count()`` say which
            restart), up to this many times, as ``distcomm run --max-restarts`` does. A line on
            stderr says why each failed attempt ended; the last attempt's outcome is returned
            or raised.

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
    _check(timeout, max_restarts)
    name = check_backend(backend)
    for restart in range(max_restarts + 1):
        try:
            return _attempt(fn, nprocs, args, name, timeout, restart)
        except (RankFailedError, DistTimeoutError) as exc:
            if restart == max_restarts:
                raise
            _say_restarting(exc, restart, max_restarts)
    raise AssertionError("unreachable: the last attempt returns or raises")


def _check(timeout: float, max_restarts: int) -> None:
    """Raise InvalidArgumentError for a ``timeout`` that is not a positive number of seconds or
    a ``max_restarts`` that is not an int >= 0."""
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
        raise InvalidArgumentError(
            f"timeout={timeout!r} must be a positive number of seconds. HINT: the default is 120."
        )
    if not isinstance(max_restarts, int) or isinstance(max_restarts, bool) or max_restarts < 0:
        raise InvalidArgumentError(
            f"max_restarts={max_restarts!r} must be an int >= 0. HINT: e.g. 1 to run again once "
            "after a failure; 0 (the default) never does."
        )


def _attempt(
    fn: Callable[..., T],
    nprocs: int,
    args: tuple[Any, ...],
    backend: str,
    timeout: float,
    restart: int,
) -> list[T]:
    """One attempt: every rank run in a fresh world (a new port and run id)."""
    port, run = free_port(), new_run_id()
    return run_processes(
        fn,
        nprocs,
        args,
        variables=functools.partial(
            _variables, nprocs=nprocs, port=port, backend=backend, run=run, restart=restart
        ),
        backend=backend,
        timeout=timeout,
    )


def _say_restarting(exc: BaseException, restart: int, max_restarts: int) -> None:
    """Say on stderr why attempt ``restart + 1`` ended, and that every rank starts again."""
    first = (str(exc).splitlines() or [type(exc).__name__])[0]
    print(
        f"spawn: attempt {restart + 1} of {max_restarts + 1} failed "
        f"({type(exc).__name__}: {first}); starting every rank again "
        f"(restart {restart + 1} of {max_restarts})",
        file=sys.stderr,
        flush=True,
    )


def _variables(
    rank: int, *, nprocs: int, port: int, backend: str, run: str, restart: int
) -> dict[str, str]:
    return launch_variables(rank, nprocs, port, backend, run, restart)
