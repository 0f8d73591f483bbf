"""Work handles: :class:`BaseWork`, the base of every backend's, and the ready-made ones.

A Work owns everything the engine may still read or write until the operation completes: the
caller's tensor, the views and staging copies made for the engine, and the step that copies a
result back at ``wait()``. Nothing a caller passes with ``async_op=True`` can be freed under the
engine, even a temporary (``all_reduce(torch.ones(4), async_op=True).wait()``) with the garbage
collector running. Once complete, a Work lets go of them.

A backend derives its Work from :class:`BaseWork`, passes the engine's buffers to the
constructor, and overrides :meth:`BaseWork._test` (has the engine finished?) and, when the engine
can block with a timeout, :meth:`BaseWork._block`. The base turns a timeout into the
communicator's :class:`~distcomm.errors.DistTimeoutError` (naming the ranks that had not arrived)
and an engine exception into :class:`~distcomm.errors.EngineError`. A Work that timed out or failed
keeps its buffers until the process exits: the engine may still write into them.
"""

from __future__ import annotations

import datetime
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from distcomm.backend import _reserved
from distcomm.errors import DistcommError
from distcomm.protocol import Work

if TYPE_CHECKING:
    from distcomm.backend.communicator import BaseCommunicator

__all__ = ["AllOf", "BaseWork", "CompletedWork", "PendingWorks", "WrappedWork", "retained"]

#: Works that timed out or failed: the engine may still touch their buffers, so they live
#: until the process exits.
_RETAINED: list[Any] = []
#: The longest sleep between two tests of an engine that cannot block with a timeout.
_MAX_POLL = 0.01


def retained() -> list[Any]:
    """The Works (and communicators) kept alive until exit because the engine may still use
    their memory (a timed-out or failed operation, a communicator finalized with one pending)."""
    return _RETAINED


class BaseWork:
    """A handle on one operation that owns its buffers until it completes (module docstring).

    Args:
        comm: the communicator the operation runs on (its timeout, its errors); None for a Work
            that is complete from the start.
        *buffers: what the engine may touch until the operation completes.
        op: the operation's name for messages; default: the communicator's current collective
            (``comm.op``), and then ``seq`` defaults to its sequence number.
        seq: the operation's sequence number; None for point-to-point messages, which have
            none.
    """

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        _reserved.check(cls, BaseWork, _reserved.WORK, _reserved.WORK)

    def __init__(
        self,
        comm: BaseCommunicator | None,
        *buffers: Any,
        op: str | None = None,
        seq: int | None = None,
    ) -> None:
        if op is None and comm is not None:
            op, seq = comm.op, comm.seq
        self._kit_comm = comm
        self.op = op or ""
        self.seq = seq
        self._kit_owned: list[Any] = list(buffers)
        self._kit_finishers: list[Callable[[], None]] = []
        self._kit_done = False

    # -- what a backend overrides --------------------------------------------------------------
    def _test(self) -> bool:
        """Whether the engine has finished the operation, without blocking."""
        raise NotImplementedError(f"{type(self).__qualname__} must implement _test()")

    def _block(self, timeout: float | None) -> bool:
        """Wait for the engine; return False if ``timeout`` seconds passed first.

        ``timeout`` None means the communicator's timeout, enforced however the engine can
        (an engine that cannot cancel a blocking call may end the job instead). ``timeout`` may
        be 0 or a fraction of a millisecond (``finalize`` of a failed communicator, a deadline
        already past): test, wait at most briefly, never forever; an engine that reads a zero
        timeout as "none" (torch's ``kNoTimeout``) must get at least its smallest unit instead.
        The default tests the engine with short sleeps until the deadline.
        """
        limit = (
            self._kit_comm.timeout if timeout is None and self._kit_comm is not None else timeout
        )
        deadline = None if limit is None else time.monotonic() + limit
        pause = 0.0001
        while not self._test():
            if deadline is not None and time.monotonic() >= deadline:
                return False
            time.sleep(pause)
            pause = min(pause * 2, _MAX_POLL)
        return True

    # -- ownership and finishing ---------------------------------------------------------------
    def own(self, *objects: Any) -> None:
        """Keep ``objects`` alive until the operation completes."""
        if not self._kit_done:
            self._kit_owned.extend(objects)

    def then(self, finish: Callable[[], None]) -> None:
        """Run ``finish`` once, in the waiting thread, when the operation completes (at once if
        it already has): the copy back into a caller's tensor, the division of an emulated
        AVG."""
        if self._kit_done:
            finish()
        else:
            self._kit_finishers.append(finish)

    @property
    def source(self) -> int | None:
        """For an irecv: the sender's rank in the communicator, once complete (else None)."""
        return None

    @property
    def done(self) -> bool:
        """Whether the operation has completed and its result is in place, as far as this Work
        knows (no engine call: :meth:`is_completed` asks the engine)."""
        return self._kit_done

    # -- the Work protocol ---------------------------------------------------------------------
    def wait(self, timeout: float | datetime.timedelta | None = None) -> bool:
        """Block until the operation completes and its result is in place; return True.

        ``timeout`` is in seconds, or a ``datetime.timedelta`` as torch's Work takes it.

        Raises:
            DistTimeoutError: not complete within ``timeout`` seconds (default: the
                communicator's timeout); the message names the ranks that had not arrived.
            EngineError: the engine failed (a peer went away, ...); its exception is the cause.
        """
        if self._kit_done:
            return True
        comm = self._kit_comm
        if isinstance(timeout, datetime.timedelta):
            timeout = timeout.total_seconds()
        marked = comm if timeout is None else None
        if marked is not None:  # what this rank is blocked in, for watchdogs and diagnostics
            marked.blocked_op = self._kit_label()
            marked.blocked_seq = self.seq or -next(marked.p2p_marks)
        try:
            finished = self._block(timeout)
        except BaseException as exc:  # a Ctrl-C too: the engine may still use the buffers
            _RETAINED.append(self)
            if comm is None or not isinstance(exc, Exception) or _ours(comm, exc):
                raise
            limit = comm.timeout if timeout is None else timeout
            raise comm.engine_failed(self.op, self.seq, exc, limit, self._waiting_for()) from exc
        finally:
            if marked is not None:
                marked.blocked_seq, marked.blocked_op = 0, ""
        if not finished:
            _RETAINED.append(self)
            comm = self._kit_comm
            assert comm is not None, "a Work without a communicator cannot time out"
            limit = comm.timeout if timeout is None else timeout
            raise comm.timed_out(self.op, self.seq, limit, self._waiting_for())
        self._kit_complete()
        return True

    def is_completed(self) -> bool:
        """Whether the operation has completed (its result then in place), without blocking."""
        if self._kit_done:
            return True
        try:
            finished = self._test()
        except Exception as exc:
            if self._kit_comm is None:
                raise
            _RETAINED.append(self)  # failed or timed out: the engine may still use the buffers
            if _ours(self._kit_comm, exc):
                raise
            raise self._kit_comm.engine_failed(
                self.op, self.seq, exc, waiting_for=self._waiting_for()
            ) from exc
        if finished:
            self._kit_complete()
        return finished

    def _kit_label(self) -> str:
        """The operation in messages: its name, and its sequence number when it has one."""
        return self.op if self.seq is None else f"{self.op} (operation #{self.seq})"

    def _waiting_for(self) -> str:
        """What the operation waits for, when not every rank of a collective (a receive's
        sender): the message of a timeout says it."""
        return ""

    def _kit_complete(self) -> None:
        self._kit_done = True
        finishers, self._kit_finishers = self._kit_finishers, []
        for finish in finishers:
            finish()
        self._kit_owned = []
        if self._kit_comm is not None:
            self._kit_comm._kit_pending.discard(self)

    def __repr__(self) -> str:
        state = "done" if self._kit_done else "pending"
        return f"<{type(self).__name__} {self.op or 'operation'} #{self.seq} {state}>"


def _ours(comm: BaseCommunicator, exc: BaseException) -> bool:
    """Whether ``exc`` is distcomm's own error, raised as it is, rather than an engine's (which
    includes a DistcommError that the backend's ``_timeout_of`` calls its engine's timeout)."""
    return isinstance(exc, DistcommError) and comm._timeout_of(exc) is None


class CompletedWork(BaseWork):
    """A Work that is complete from the start (eager engines, worlds of 1)."""

    def __init__(self, source: int | None = None) -> None:
        super().__init__(None, op="", seq=0)
        self._kit_done = True
        self._kit_source = source

    @property
    def source(self) -> int | None:
        return self._kit_source

    def _test(self) -> bool:
        return True


class WrappedWork(BaseWork):
    """A :class:`BaseWork` around a Work of another kind (a plugin's own), so that the
    communicator can own buffers and add finishing steps to it."""

    def __init__(self, comm: BaseCommunicator, inner: Work, *buffers: Any) -> None:
        super().__init__(comm, *buffers)
        self._kit_inner = inner

    @property
    def source(self) -> int | None:
        source = getattr(self._kit_inner, "source", None)
        return None if source is None else int(source)

    def _test(self) -> bool:
        return bool(self._kit_inner.is_completed())

    def _block(self, timeout: float | None) -> bool:
        self._kit_inner.wait(timeout)
        return True


class AllOf(BaseWork):
    """One Work for several: complete when every one of ``works`` is (an operation built from
    several engine calls, such as all-to-all from point-to-point messages)."""

    def __init__(self, comm: BaseCommunicator, works: list[Work], *buffers: Any) -> None:
        super().__init__(comm, *buffers)
        self._kit_parts = [w if isinstance(w, BaseWork) else WrappedWork(comm, w) for w in works]

    def _test(self) -> bool:
        return all(part.is_completed() for part in self._kit_parts)

    def _block(self, timeout: float | None) -> bool:
        deadline = None if timeout is None else time.monotonic() + timeout
        for part in self._kit_parts:
            if part._kit_done:
                continue
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not part._block(left):
                return False
            part._kit_complete()
        return True


class PendingWorks:
    """The Works a communicator handed to its caller that have not completed yet.

    A Work leaves when it completes; Works nobody waits for are tested (and finished) when many
    have gathered, so that fire-and-forget operations do not hold their buffers until finalize.
    """

    #: From this many on, adding one also asks the engine which of the others are done.
    _TEST_FROM = 64

    def __init__(self) -> None:
        self._works: dict[int, BaseWork] = {}

    def add(self, work: BaseWork) -> None:
        """Remember ``work`` until it completes."""
        if len(self._works) >= self._TEST_FROM:
            for other in list(self._works.values()):
                _quietly_completed(other)
        if not work._kit_done:
            self._works[id(work)] = work

    def discard(self, work: BaseWork) -> None:
        """Forget ``work`` (it completed)."""
        self._works.pop(id(work), None)

    def settle(self, timeout: float) -> list[BaseWork]:
        """Wait for every pending Work, ``timeout`` seconds in all; return those that did not
        complete (they keep their buffers until exit)."""
        deadline = time.monotonic() + timeout
        left = []
        for work in list(self._works.values()):
            try:
                finished = work._kit_done or work._block(max(0.0, deadline - time.monotonic()))
            except Exception:
                finished = False
            if finished:
                work._kit_complete()
            else:
                _RETAINED.append(work)
                left.append(work)
        self._works = {}
        return left

    def __len__(self) -> int:
        return len(self._works)


def _quietly_completed(work: BaseWork) -> bool:
    """Whether ``work`` has completed; a failure is left for its own ``wait()`` to raise."""
    try:
        return work.is_completed()
    except Exception:
        return False
