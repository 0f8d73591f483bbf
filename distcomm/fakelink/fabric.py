"""The fabric of an in-process world: rendezvous slots for collectives, matched messages.

A :class:`Fabric` is one in-process world: ranks are threads (``distcomm.testing.run_threads``)
or, for a plain process, one rank. Collectives meet at a rendezvous slot keyed by communicator and
sequence number; the last rank to arrive computes every rank's result. Point-to-point messages are
matched like MPI's: in posting order, by source and tag, never overtaking. A rank that fails
aborts the fabric and every rank waiting in it stops at once.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from distcomm.backend import stacks
from distcomm.backend.arrays import adapter_for
from distcomm.errors import DistcommError, InvalidArgumentError

if TYPE_CHECKING:
    from distcomm.backend import BaseCommunicator

__all__ = ["Fabric", "FabricAborted", "FabricStalled"]


class FabricAborted(DistcommError):
    """Raised in every rank of a fabric after another rank failed or the run timed out."""


class FabricStalled(DistcommError):
    """Raised in the ranks waiting in a fabric when none of them can ever go on: every rank
    still running waits, and what each waits for is not there (a rank returned without a
    collective the others called, receives that no one sends ...)."""


def _GOES_ON() -> bool:
    """What a polling waiter waits for, to the stall check: it will go on by itself."""
    return True


class _Slot:
    __slots__ = ("done", "error", "inputs", "op", "result")

    def __init__(self, op: str) -> None:
        self.op = op
        self.inputs: dict[int, tuple[Any, ...]] = {}
        self.done = False
        self.error: BaseException | None = None
        self.result: Any = None


class _Recv:
    __slots__ = ("done", "error", "source", "src", "tag", "target")

    def __init__(self, target: Any, src: int | None, tag: int) -> None:
        self.target = target
        self.src = src
        self.tag = tag
        self.done = False
        self.error: BaseException | None = None
        self.source: int | None = None


class Fabric:
    """The shared state of one in-process world (see the module docstring)."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.cond = threading.Condition()
        self.failure: str | None = None
        self._slots: dict[tuple[int, int], _Slot] = {}
        self._messages: dict[tuple[int, int], list[tuple[int, int, Any]]] = {}
        self._posted: dict[tuple[int, int], list[_Recv]] = {}
        self._uids = itertools.count(1)
        self._members: dict[int, dict[int, BaseCommunicator]] = {}
        #: What each waiting thread waits for; the ranks that left (returned from their run).
        self._waiting: dict[int, Callable[[], bool]] = {}
        self._departed: set[int] = set()
        self._stalls = 0

    def new_uid(self) -> int:
        return next(self._uids)

    def abort(self, reason: str) -> None:
        """Stop every rank waiting in this fabric, now and later, with FabricAborted(reason)."""
        with self.cond:
            if self.failure is None:
                self.failure = reason
            self.cond.notify_all()

    def wait(
        self, ready: Callable[[], bool], timeout: float | None, *, polling: bool = False
    ) -> bool:
        """Block until ``ready()`` (called under the lock); False once ``timeout`` passed.

        ``polling``: the caller chose a timeout of its own (``Work.wait(timeout)``), after which
        it goes on: while it waits, the ranks are not stalled.

        Raises:
            FabricAborted: another rank failed, or the run was stopped.
            FabricStalled: every rank still running waits and none can go on.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        me = threading.get_ident()
        with self.cond:
            stalls = self._stalls
            try:
                while not ready():
                    if self.failure is not None:
                        raise FabricAborted(self.failure)
                    self._waiting[me] = _GOES_ON if polling else ready
                    self._check_stalled()
                    if self._stalls != stalls:
                        raise FabricStalled(self._stalled())
                    remaining = None if deadline is None else deadline - time.monotonic()
                    if remaining is not None and remaining <= 0:
                        return False
                    self.cond.wait(remaining)
            finally:
                self._waiting.pop(me, None)
        return True

    def depart(self, rank: int) -> None:
        """Rank ``rank`` will call nothing more (its thread returned): if every rank left
        waits for something that will never come, they stop (FabricStalled) at once."""
        with self.cond:
            self._departed.add(rank)
            self._check_stalled()

    def _check_stalled(self) -> None:
        """Under the lock: when every live rank waits and none can go on, wake them stalled."""
        live = self.size - len(self._departed)
        waiting = self._waiting
        if waiting and len(waiting) >= live and not any(ready() for ready in waiting.values()):
            self._stalls += 1
            self.cond.notify_all()

    def _stalled(self) -> str:
        left = sorted(self._departed)
        why = f"; rank(s) {left} returned without calling it" if left else ""
        return f"every rank of the run is waiting in distcomm and none can go on{why}"

    def register(self, uid: int, rank: int, comm: BaseCommunicator) -> None:
        """Record ``comm`` as rank ``rank`` of communicator ``uid`` (for :meth:`progress`)."""
        with self.cond:
            self._members.setdefault(uid, {})[rank] = comm

    def progress(self, uid: int) -> dict[int, int]:
        """The sequence number each rank of communicator ``uid`` has reached."""
        with self.cond:
            return {rank: comm.seq for rank, comm in self._members.get(uid, {}).items()}

    def stacks(self, uid: int, ranks: list[int]) -> dict[int, str]:
        """Where each of ``ranks`` of communicator ``uid`` is: its thread's Python stack."""
        with self.cond:
            members = self._members.get(uid, {})
            comms = {rank: members[rank] for rank in ranks if rank in members}
        return {rank: stacks.answer(comm) for rank, comm in comms.items()}

    def join(
        self,
        uid: int,
        seq: int,
        rank: int,
        size: int,
        op: str,
        inputs: tuple[Any, ...],
        compute: Callable[[dict[int, tuple[Any, ...]]], Any],
    ) -> _Slot:
        """Deposit this rank's inputs for collective ``seq`` of communicator ``uid``.

        The last of ``size`` ranks runs ``compute(inputs by rank)``; its result (or error) is
        shared by all through the returned slot.
        """
        with self.cond:
            if self.failure is not None:
                raise FabricAborted(self.failure)
            slot = self._slots.setdefault((uid, seq), _Slot(op))
            if slot.op != op and slot.error is None:
                slot.error = InvalidArgumentError(
                    f"collective mismatch at operation #{seq}: rank {rank} called {op} while "
                    f"another rank called {slot.op}. HINT: every rank must call the same "
                    "collectives in the same order."
                )
            slot.inputs[rank] = inputs
            if len(slot.inputs) == size:
                del self._slots[(uid, seq)]
                if slot.error is None:
                    try:
                        slot.result = compute(slot.inputs)
                    except Exception as exc:
                        slot.error = exc
                slot.inputs = {}  # every rank's buffers: each rank's Work lets go of its own
                slot.done = True
                self.cond.notify_all()
            return slot

    def post_send(self, uid: int, src: int, dst: int, tag: int, data: Any) -> None:
        with self.cond:
            posted = self._posted.get((uid, dst), [])
            for req in posted:
                if req.tag == tag and req.src in (None, src):
                    posted.remove(req)
                    _deliver(req, src, data)
                    self.cond.notify_all()
                    return
            self._messages.setdefault((uid, dst), []).append((src, tag, data))
            self.cond.notify_all()

    def post_recv(self, uid: int, dst: int, req: _Recv) -> None:
        with self.cond:
            queue = self._messages.get((uid, dst), [])
            for i, (src, tag, data) in enumerate(queue):
                if tag == req.tag and req.src in (None, src):
                    del queue[i]
                    _deliver(req, src, data)
                    return
            self._posted.setdefault((uid, dst), []).append(req)


def _deliver(req: _Recv, src: int, data: Any) -> None:
    adapter = adapter_for(req.target)
    got, room = adapter_for(data).numel(data), adapter.numel(req.target)
    if got != room:
        req.error = InvalidArgumentError(
            f"recv: the message from rank {src} (tag {req.tag}) has {got} elements but the "
            f"receive buffer has {room}. HINT: size the buffer like the sent tensor."
        )
    else:
        adapter.copy_(req.target, data)
    req.source = src
    req.done = True
