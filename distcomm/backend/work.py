"""Work handles: :class:`BaseWork`, the base of every backend's, and the ready-made ones.

A Work owns everything the engine may still read or write until the operation completes: the
caller's tensor, the views and staging copies made for the engine, and the step that copies a
result back at ``wait()``. Nothing a caller passes with ``async_op=True`` can be freed under the
engine, even a temporary (``all_reduce(torch.ones(4), async_op=True).wait()``) with the garbage
collector running. Once complete, a Work lets go of them.

An engine returns an :class:`EngineWork`: the kit's Work around the engine's own request (an
object whose ``test()`` says whether the engine has finished and, where the engine can block with
a timeout, whose ``block(timeout)`` waits), owning the buffers it is given. The kit turns a
timeout into the communicator's :class:`~distcomm.errors.DistTimeoutError` (naming the ranks
that had not arrived) and an engine exception into :class:`~distcomm.errors.EngineError`. A
Work that timed out or failed keeps its buffers until the process exits: the engine may still
write into them.
"""

from __future__ import annotations

import datetime
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from distcomm.errors import DistcommError
from distcomm.protocol import Work

if TYPE_CHECKING:
    from distcomm.backend.communicator import BaseCommunicator

__all__ = [
    "AllOf",
    "BaseWork",
    "CompletedWork",
    "EngineWork",
    "PendingWorks",
    "WrappedWork",
    "retained",
]

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

    def __init__(
        self,
        comm: BaseCommunicator | None,
        *buffers: Any,
        op: str | None = None,
        seq: int | None = None,
    ) -> None:
        if op is None and comm is not None:
            op, seq = comm.op, comm.seq
        self._comm = comm
        self.op = op or ""
        self.seq = seq
        self._owned: list[Any] = list(buffers)
        self._finishers: list[Callable[[], None]] = []
        self._done = False

    # -- what each kind of Work defines ---------------------------------------------------------
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
        limit = self._comm.timeout if timeout is None and self._comm is not None else timeout
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
        if not self._done:
            self._owned.extend(objects)

    def then(self, finish: Callable[[], None]) -> None:
        """Run ``finish`` once, in the waiting thread, when the operation completes (at once if
        it already has): the copy back into a caller's tensor, the division of an emulated
        AVG."""
        if self._done:
            finish()
        else:
            self._finishers.append(finish)

    @property
    def source(self) -> int | None:
        """For an irecv: the sender's rank in the communicator, once complete (else None)."""
        return None

    def engine_future(self) -> Any:
        """The engine's own future of the operation (torch's ``Future``, for the torch engines),
        completed by the engine when it has finished, where the engine offers one; else None.
        Once it is done, :meth:`is_completed` says True (or raises the operation's error), in
        its callbacks too: so it says when to finish the Work without a thread of the rank's
        waiting (torch's group over distcomm hands it to DDP)."""
        return None

    @property
    def done(self) -> bool:
        """Whether the operation has completed and its result is in place, as far as this Work
        knows (no engine call: :meth:`is_completed` asks the engine)."""
        return self._done

    # -- the Work protocol ---------------------------------------------------------------------
    def wait(self, timeout: float | datetime.timedelta | None = None) -> bool:
        """Block until the operation completes and its result is in place; return True.

        ``timeout`` is in seconds, or a ``datetime.timedelta`` as torch's Work takes it.

        Raises:
            DistTimeoutError: not complete within ``timeout`` seconds (default: the
                communicator's timeout); the message names the ranks that had not arrived.
            EngineError: the engine failed (a peer went away, ...); its exception is the cause.
        """
        if self._done:
            return True
        comm = self._comm
        if isinstance(timeout, datetime.timedelta):
            timeout = timeout.total_seconds()
        marked = comm if timeout is None else None
        if marked is not None:  # what this rank is blocked in, for watchdogs and diagnostics
            marked.blocked_op = self._label()
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
            comm = self._comm
            assert comm is not None, "a Work without a communicator cannot time out"
            limit = comm.timeout if timeout is None else timeout
            raise comm.timed_out(self.op, self.seq, limit, self._waiting_for())
        self._complete()
        return True

    def is_completed(self) -> bool:
        """Whether the operation has completed (its result then in place), without blocking."""
        if self._done:
            return True
        try:
            finished = self._test()
        except Exception as exc:
            if self._comm is None:
                raise
            _RETAINED.append(self)  # failed or timed out: the engine may still use the buffers
            if _ours(self._comm, exc):
                raise
            raise self._comm.engine_failed(
                self.op, self.seq, exc, waiting_for=self._waiting_for()
            ) from exc
        if finished:
            self._complete()
        return finished

    def _label(self) -> str:
        """The operation in messages: its name, and its sequence number when it has one."""
        return self.op if self.seq is None else f"{self.op} (operation #{self.seq})"

    def _waiting_for(self) -> str:
        """What the operation waits for, when not every rank of a collective (a receive's
        sender): the message of a timeout says it."""
        return ""

    def _complete(self) -> None:
        self._done = True
        finishers, self._finishers = self._finishers, []
        for finish in finishers:
            finish()
        self._owned = []
        if self._comm is not None:
            self._comm._pending.discard(self)

    def __repr__(self) -> str:
        state = "done" if self._done else "pending"
        return f"<{type(self).__name__} {self.op or 'operation'} #{self.seq} {state}>"


def _ours(comm: BaseCommunicator, exc: BaseException) -> bool:
    """Whether ``exc`` is distcomm's own error, raised as it is, rather than an engine's (which
    includes a DistcommError that the backend's ``_timeout_of`` calls its engine's timeout)."""
    return isinstance(exc, DistcommError) and comm._timeout_of(exc) is None


class EngineWork(BaseWork):
    """The Work of an engine's operation: ``request`` is the engine's own handle on it.

    ``request.test()`` says, without blocking, whether the engine has finished (it may raise
    the engine's error). Optional: ``request.block(timeout)`` waits, returning False if
    ``timeout`` seconds passed first (``timeout`` None: the communicator's timeout, enforced
    however the engine can; 0 or a fraction of a millisecond: never wait forever), else the
    kit tests with short sleeps; ``request.source``, a receive's sender once complete;
    ``request.waiting_for()``, what a timeout's message says it waited for (a receive's
    sender); ``request.future()``, the engine's own future of the operation
    (:meth:`BaseWork.engine_future`).

    Args:
        comm: the communicator (the engine's ``bind`` gave it).
        request: the engine's handle.
        *buffers: what the engine may touch until the operation completes.
        op: the operation's name for messages (default: the communicator's current one).
        seq: its sequence number (None for point-to-point messages).
    """

    def __init__(
        self,
        comm: BaseCommunicator | None,
        request: Any,
        *buffers: Any,
        op: str | None = None,
        seq: int | None = None,
    ) -> None:
        super().__init__(comm, *buffers, op=op, seq=seq)
        self.request = request
        self._test = request.test  # type: ignore[method-assign]
        block = getattr(request, "block", None)
        if block is not None:
            self._block = block  # type: ignore[method-assign]
        waiting_for = getattr(request, "waiting_for", None)
        if waiting_for is not None:
            self._waiting_for = waiting_for  # type: ignore[method-assign]

    def engine_future(self) -> Any:
        future = getattr(self.request, "future", None)
        return None if future is None else future()

    @property
    def source(self) -> int | None:
        source = getattr(self.request, "source", None) if self._done else None
        return None if source is None else int(source)


class CompletedWork(BaseWork):
    """A Work that is complete from the start (eager engines, worlds of 1)."""

    def __init__(self, source: int | None = None) -> None:
        super().__init__(None, op="", seq=0)
        self._done = True
        self._source = source

    @property
    def source(self) -> int | None:
        return self._source

    def _test(self) -> bool:
        return True


class WrappedWork(BaseWork):
    """A :class:`BaseWork` around a Work of another kind (a plugin's own), so that the
    communicator can own buffers and add finishing steps to it."""

    def __init__(self, comm: BaseCommunicator, inner: Work, *buffers: Any) -> None:
        super().__init__(comm, *buffers)
        self._inner = inner

    @property
    def source(self) -> int | None:
        source = getattr(self._inner, "source", None)
        return None if source is None else int(source)

    def _test(self) -> bool:
        return bool(self._inner.is_completed())

    def _block(self, timeout: float | None) -> bool:
        self._inner.wait(timeout)
        return True


class AllOf(BaseWork):
    """One Work for several: complete when every one of ``works`` is (an operation built from
    several engine calls, such as all-to-all from point-to-point messages)."""

    def __init__(self, comm: BaseCommunicator, works: list[Work], *buffers: Any) -> None:
        super().__init__(comm, *buffers)
        self._parts = [w if isinstance(w, BaseWork) else WrappedWork(comm, w) for w in works]

    def _test(self) -> bool:
        return all(part.is_completed() for part in self._parts)

    def _block(self, timeout: float | None) -> bool:
        deadline = None if timeout is None else time.monotonic() + timeout
        for part in self._parts:
            if part._done:
                continue
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not part._block(left):
                return False
            part._complete()
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
        if not work._done:
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
                finished = work._done or work._block(max(0.0, deadline - time.monotonic()))
            except Exception:
                finished = False
            if finished:
                work._complete()
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
