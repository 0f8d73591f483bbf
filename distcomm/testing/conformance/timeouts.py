"""Checks of timeouts: a collective that a rank waits in, past its timeout, while the other ranks
do not join it, raises :class:`~distcomm.errors.DistTimeoutError` there, and nothing else (not an
``EngineError`` wrapping it, which is what a backend gets when its ``engine_errors`` lists a class
that DistTimeoutError derives from, such as ``OSError``).

Rank 0 waits, alone, on a sub-communicator of every rank made for the check (nobody uses it on
rank 0 again: a timed-out communicator is unusable), so the world stays usable for the checks that
follow. The other ranks wait for rank 0 in an asynchronous world barrier with a deadline of their
own, a poll rather than a stall, so that an in-process world does not take them for ranks that
can never go on. Both communicators run under ``debug="off"`` for the check: the mismatch check
would otherwise wait for every rank before the call it is about.

What is checked follows the capabilities. Without ``timeouts`` nothing is. With ``cancellable``,
a blocking ``all_reduce`` on a group made with a short timeout. Without it (MPI: a blocking call
past its timeout ends the job, by design), ``Work.wait(timeout=...)`` of an async ``all_reduce``,
which raises on every engine; the others then join that all_reduce, so the engine completes it
and nothing is left pending. Under ``DISTCOMM_ON_TIMEOUT=abort`` a timeout ends the job, as the
user asked: nothing is checked then either.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import distcomm
from distcomm.errors import DistTimeoutError, EngineError
from distcomm.protocol import Communicator, NonMember
from distcomm.testing.conformance.registry import check
from distcomm.testing.conformance.support import (
    cases,
    check_policy,
    comm,
    expect,
    expect_values,
    make,
    timeouts_raise,
)

#: Seconds rank 0 blocks alone in a collective of a group made with this timeout. The group is
#: made under it too, right after a barrier, so it must cover the ranks' skew there.
BLOCKING_TIMEOUT = 1.0
#: Seconds rank 0 gives ``Work.wait(timeout=...)`` of a collective the others have not called.
WAIT_TIMEOUT = 0.2


@check
def blocking_collective_times_out() -> None:
    """A blocking ``all_reduce`` that only rank 0 calls raises DistTimeoutError there once the
    group's timeout has passed (not EngineError, not anything else); the world still works."""
    c: Any = comm()
    rank, world = c.rank, c.world_size
    caps = c.capabilities
    if world == 1 or not (caps.timeouts and caps.cancellable) or not timeouts_raise():
        return
    if not isinstance(getattr(c, "timeout", None), (int, float)):
        return  # a Communicator not built on BaseCommunicator: no timeout to give a group
    group = _group_timing_out_after(c, BLOCKING_TIMEOUT)
    lib, dtype = next(cases(lambda d: d == "int64"))
    with check_policy("off", c), check_policy("off", group):
        if rank == 0:
            outcome = _outcome(group.all_reduce, make(lib, dtype, [1]))
            _meet(c)  # the others go on, whatever came out
            _expect_timeout(outcome, "a blocking all_reduce that only rank 0 called", world)
        else:
            _meet(c)
    _world_still_works(lib, dtype)


@check
def waiting_on_a_collective_times_out() -> None:
    """``Work.wait(timeout=...)`` of an async ``all_reduce`` that the other ranks have not called
    yet raises DistTimeoutError on rank 0 (not EngineError, not anything else); the others then
    join it, and the world still works."""
    c: Any = comm()
    rank, world = c.rank, c.world_size
    caps = c.capabilities
    if world == 1 or not (caps.timeouts and caps.async_ops) or not timeouts_raise():
        return
    group = distcomm.new_group(range(world))
    assert not isinstance(group, NonMember), "every rank is a member"
    lib, dtype = next(cases(lambda d: d == "int64"))
    with check_policy("off", c), check_policy("off", group):
        t = make(lib, dtype, [rank + 1])
        if rank == 0:
            work = group.all_reduce(t, async_op=True)
            outcome = _outcome(work.wait, timeout=WAIT_TIMEOUT)
            _meet(c)
            _expect_timeout(outcome, f"Work.wait(timeout={WAIT_TIMEOUT}) of an all_reduce", world)
        else:
            _meet(c)
            late = group.all_reduce(t, async_op=True)  # rank 0's completes in the engine
            assert late is not None
            late.wait()  # (async here as on rank 0: MPI never matches blocking with async)
            expect_values(t, [world * (world + 1) // 2], "the all_reduce rank 0 gave up on")
    _world_still_works(lib, dtype)


def _group_timing_out_after(c: Any, seconds: float) -> Communicator:
    """A new group of every rank of ``c`` whose operations time out after ``seconds`` (groups
    take their parent's timeout when they are made); ``c`` keeps its own."""
    c.barrier()  # the ranks make the group together: it is made under the short timeout
    before = c.timeout
    c.timeout = seconds
    try:
        group = distcomm.new_group(range(c.world_size))
    finally:
        c.timeout = before
    assert not isinstance(group, NonMember), "every rank is a member"
    return group


def _outcome(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> BaseException | None:
    """What ``fn(*args, **kwargs)`` raised (an Exception), or None when it returned."""
    try:
        fn(*args, **kwargs)
    except Exception as exc:
        return exc
    return None


def _expect_timeout(outcome: BaseException | None, what: str, world: int) -> None:
    """Raise AssertionError unless ``outcome`` is the DistTimeoutError of an all_reduce that
    rank 0 alone called: it names the op, and rank 0 is not among the ranks missing."""
    if outcome is None:
        raise AssertionError(f"{what} returned, though ranks 1..{world - 1} never joined it")
    if not isinstance(outcome, DistTimeoutError):
        cause = outcome.__cause__
        why = ""
        if isinstance(outcome, EngineError) and isinstance(cause, DistTimeoutError):
            why = (
                " (an EngineError wrapping distcomm's DistTimeoutError: the backend's "
                "engine_errors lists a class that DistTimeoutError derives from, such as "
                "OSError or TimeoutError; list only the engine's own exception classes)"
            )
        raise AssertionError(
            f"{what} raised {type(outcome).__name__}: {outcome}, not DistTimeoutError{why}"
        ) from outcome
    expect(outcome.op == "all_reduce", f"{what}: DistTimeoutError.op is {outcome.op!r}")
    missing = outcome.missing_ranks
    expect(
        missing is None or 0 not in missing,
        f"{what}: DistTimeoutError names rank 0, which had arrived, among the missing: {missing}",
    )


def _meet(c: Any) -> None:
    """Wait in an async world barrier until every rank has joined it: rank 0 once its check is
    done, the others for rank 0 (a poll, with a deadline of its own: an in-process world then
    does not take a waiting rank for one that can never go on). Every rank uses the async form:
    MPI never matches a blocking collective with a nonblocking one."""
    work = c.barrier(async_op=True)
    if work is not None:
        work.wait(timeout=max(float(getattr(c, "timeout", 0.0)), 60.0))


def _world_still_works(lib: str, dtype: str) -> None:
    world = distcomm.get_world_size()
    t = make(lib, dtype, [distcomm.get_rank()])
    distcomm.all_reduce(t)
    expect_values(t, [world * (world - 1) // 2], "a world all_reduce after the timeout")
