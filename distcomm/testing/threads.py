"""`run_threads`: N fakelink thread-ranks in this process, for tests and examples."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from distcomm import _settings
from distcomm._runtime import state
from distcomm._runtime.request import resolve_timeout
from distcomm.backend import stacks
from distcomm.backend._uncaught import format_exception
from distcomm.environment.info import LaunchInfo
from distcomm.errors import DistTimeoutError, InvalidArgumentError, RankFailedError
from distcomm.fakelink import Fabric, FabricAborted, world
from distcomm.testing.faults import Fault, checked, inject

__all__ = ["run_threads"]

T = TypeVar("T")
_GRACE = 5.0


def run_threads(
    fn: Callable[..., T],
    world_size: int,
    *args: Any,
    timeout: float = 60.0,
    faults: Iterable[Fault] = (),
) -> list[T]:
    """Run ``fn(*args)`` in ``world_size`` thread-ranks of one fakelink world; return the results.

    Each thread starts initialised as rank r of ``world_size``: inside it the module-level API
    (``distcomm.all_reduce``, ``get_rank`` ...), helpers and compat modules act as that rank.
    ``init()`` returns the thread's communicator and ``finalize()`` is a no-op there.

    Args:
        fn: the function every rank runs.
        world_size: the number of ranks (at least 1).
        *args: passed to ``fn``.
        timeout: seconds for the whole run. Operations inside time out after
            ``DISTCOMM_TIMEOUT`` seconds when it is set (their DistTimeoutError names the ranks
            that had not arrived), else a few seconds after the run, so that a stuck run ends
            with this function's DistTimeoutError showing where every rank is. Under
            ``DISTCOMM_ON_TIMEOUT=abort`` a timed-out operation stops every rank of the run
            (never the process).
        faults: faults to inject into the ranks' world communicators
            (:mod:`distcomm.testing.faults`: ``delay``, ``raise_at``, ``skip``, ``resize``).

    Returns:
        ``fn``'s return values in rank order.

    Raises:
        RankFailedError: a rank raised; the first to fail is reported, with its traceback, as
            soon as it fails (ranks waiting in distcomm are stopped at once).
        DistTimeoutError: the run took longer than ``timeout``; the message shows where each
            unfinished rank was.
    """
    _check_arguments(fn, world_size)
    faults = checked(faults, world_size)
    set_by_user = _settings.is_set("DISTCOMM_TIMEOUT")
    op_timeout = resolve_timeout(None) if set_by_user else timeout + _GRACE
    run = _Run(Fabric(world_size), world_size)
    threads = [
        threading.Thread(
            target=_rank_body,
            args=(run, r, fn, args, faults, op_timeout, timeout),
            name=f"distcomm-rank-{r}",
            daemon=True,
        )
        for r in range(world_size)
    ]
    for thread in threads:
        thread.start()
    if not run.done.wait(timeout):
        raise _timed_out(run, threads, timeout)
    if run.failures:
        raise _first_failure(run, threads)
    for thread in threads:
        thread.join()
    return run.results


def _check_arguments(fn: Callable[..., Any], world_size: int) -> None:
    """Raise InvalidArgumentError for a world size that is not a positive int or an ``fn`` that
    is not callable."""
    if not isinstance(world_size, int) or isinstance(world_size, bool) or world_size < 1:
        raise InvalidArgumentError(f"world_size={world_size!r} must be a positive int")
    if not callable(fn):
        raise InvalidArgumentError(f"fn={fn!r} must be callable")


class _Run:
    """What the thread-ranks of one run share: the fabric, each rank's result, the failures, and
    which ranks have finished (``done`` is set when all have, or one has failed)."""

    def __init__(self, fabric: Fabric, world_size: int) -> None:
        self.fabric = fabric
        self.world_size = world_size
        self.results: list[Any] = [None] * world_size
        self.failures: list[tuple[int, str]] = []
        self.done = threading.Event()
        self.finished = [False] * world_size
        self.lock = threading.Lock()


def _rank_context(
    run: _Run, rank: int, faults: Iterable[Fault], op_timeout: float, timeout: float
) -> state.Context:
    """The context of thread-rank ``rank``: its launch, its communicator (faults injected) and
    the arguments ``init()`` would have been given."""
    world_size = run.world_size
    launch = LaunchInfo(
        method="threads",
        rank=rank,
        world_size=world_size,
        local_rank=rank,
        local_world_size=world_size,
        node_rank=0,
        num_nodes=1,
        sources={"method": "distcomm.testing.run_threads"},
    )
    comm = world(run.fabric, launch, op_timeout)
    inject(comm, faults)
    requested = {
        "backend": "fakelink",
        "method": "threads",
        "rank": rank,
        "world_size": world_size,
        "timeout": float(timeout),
    }
    return state.Context(comm, launch, ["run_threads"], requested, thread_owned=True)


def _rank_body(
    run: _Run,
    rank: int,
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    faults: Iterable[Fault],
    op_timeout: float,
    timeout: float,
) -> None:
    """One thread-rank: run ``fn(*args)`` as ``rank``, record its result or failure (aborting the
    fabric on a failure), then leave the fabric and mark the rank finished."""
    state.thread_context(_rank_context(run, rank, faults, op_timeout, timeout))
    try:
        run.results[rank] = fn(*args)
    except BaseException as exc:
        if not _caused_by_abort(exc):
            with run.lock:
                run.failures.append((rank, format_exception(exc)))
        run.fabric.abort(f"rank {rank} failed")
    finally:
        state.thread_context(None)
        run.fabric.depart(rank)
        with run.lock:
            run.finished[rank] = True
            if all(run.finished) or run.failures:
                run.done.set()


def _timed_out(run: _Run, threads: list[threading.Thread], timeout: float) -> DistTimeoutError:
    """Abort the run's fabric and return the error showing where each unfinished rank was."""
    unfinished = [r for r, f in enumerate(run.finished) if not f]
    where = {r: stacks.where(thread=threads[r].ident) for r in unfinished}
    run.fabric.abort(f"run_threads timed out after {timeout:g} s")
    shown = stacks.describe(where, unfinished, "Where they are")
    return DistTimeoutError(
        f"run_threads: ranks {unfinished} did not finish within {timeout:g} s.\n"
        f"{shown}\nHINT: a rank is stuck where shown (a rank outside distcomm keeps the "
        "others waiting in their next collective), or it is merely slow: raise timeout=.",
        op="run_threads",
        missing_ranks=unfinished,
        stacks=where,
    )


def _first_failure(run: _Run, threads: list[threading.Thread]) -> RankFailedError:
    """Give the other ranks a grace period to stop, then return the error reporting the first
    rank that failed (and naming the others that failed too)."""
    deadline = time.monotonic() + _GRACE
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    rank, text = run.failures[0]
    others = sorted({r for r, _ in run.failures[1:]})
    also = f" (ranks {others} failed too)" if others else ""
    message = f"rank {rank} of {run.world_size} failed{also}:\n{text.rstrip()}"
    return RankFailedError(rank, text, message)


def _caused_by_abort(exc: BaseException | None) -> bool:
    """Whether ``exc`` is, or was raised while handling, another rank's abort of the fabric.

    Such a rank did not fail by itself (the conformance runner, for one, wraps the abort in an
    AssertionError naming its check); only the rank that caused the abort is reported.
    """
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, FabricAborted):
            return True
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return False
