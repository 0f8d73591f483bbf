"""The zmq communicator: distcomm's primitives over the :mod:`~distcomm_zmq.transport`.

Each collective is one algorithm of :mod:`~distcomm_zmq.algorithms` run over an :class:`_Op` (the
operation's messages, keyed by the communicator and a count of the operations issued on it, so
that the ranks match them whatever else is in flight). A blocking collective runs in the caller's
thread; an async one runs in the communicator's worker thread, in issue order, and its Work
completes when it has. Point-to-point messages are keyed by tag; a receive is matched by
whichever thread waits for its Work. Every wait has a deadline: past the communicator's timeout
the operation raises DistTimeoutError naming the ranks that had not arrived (the peers say how
far they got).
"""

from __future__ import annotations

import hashlib
import queue
import threading
import time
from collections.abc import Callable
from typing import Any

import zmq

from distcomm.backend import BaseCommunicator, BaseWork, LaunchInfo, stacks
from distcomm.errors import DistcommError
from distcomm.protocol import NON_MEMBER, Communicator, NonMember, ReduceOp, Work
from distcomm_zmq import algorithms, rendezvous
from distcomm_zmq.algorithms import as_numpy
from distcomm_zmq.capabilities import ZMQ_CAPABILITIES
from distcomm_zmq.transport import COLLECTIVE, P2P, Closed, Transport

__all__ = ["ZmqCommunicator", "connect"]


class _Late(Exception):
    """An operation's message (or the release of its sends) did not come before its deadline."""


class _Op(algorithms.Link):
    """One operation's messages on a communicator (the algorithms' Link)."""

    def __init__(self, comm: ZmqCommunicator, key: int, timeout: float) -> None:
        self.rank, self.size = comm.rank, comm.world_size
        self._comm, self._key = comm, key
        self._ranks = comm.global_ranks
        self._deadline = time.monotonic() + timeout
        self._sent: list[Any] = []

    def send(self, dst: int, data: Any) -> None:
        tracker = self._comm.transport.send(
            COLLECTIVE, self._comm.uid, self._key, self._ranks[dst], data
        )
        if tracker is not None:
            self._sent.append(tracker)

    def recv(self, src: int) -> memoryview:
        got = self._comm.transport.receive(
            COLLECTIVE, self._comm.uid, self._key, self._ranks[src], self._deadline
        )
        if got is None:
            raise _Late
        view: memoryview = got
        return view

    def settle(self) -> None:
        if not Transport.settle(self._sent, self._deadline):
            raise _Late
        self._sent.clear()


class _FutureWork(BaseWork):
    """The Work of an async collective: done when the worker thread has run it."""

    def __init__(self, comm: ZmqCommunicator, done: threading.Event, box: list[Any]) -> None:
        super().__init__(comm)
        self._event, self._box, self._limit = done, box, comm.timeout

    def _test(self) -> bool:
        if not self._event.is_set():
            return False
        if self._box:
            raise self._box[0]
        return True

    def _block(self, timeout: float | None) -> bool:
        self._event.wait(self._limit + 5 if timeout is None else timeout)
        return self._test()


class _SendWork(BaseWork):
    """An isend: done when ZeroMQ let go of the buffer (at once for a small one)."""

    def __init__(self, comm: ZmqCommunicator, tracker: Any, tensor: Any, dst: int, tag: int):
        super().__init__(comm, tensor, op=f"send to rank {dst} (tag {tag})", seq=None)
        self._tracker = tracker

    def _test(self) -> bool:
        return self._tracker is None or bool(self._tracker.done)


class _RecvWork(BaseWork):
    """An irecv: done once the message from ``src`` with ``tag`` arrived and was copied in."""

    def __init__(self, comm: ZmqCommunicator, tensor: Any, src: int, tag: int) -> None:
        super().__init__(comm, tensor, op=f"recv from rank {src} (tag {tag})", seq=None)
        self._target, self._src, self._tag = tensor, src, tag
        self._zmq = comm

    @property
    def source(self) -> int | None:
        return self._src if self.done else None

    def _test(self) -> bool:
        return self._take(time.monotonic())

    def _block(self, timeout: float | None) -> bool:
        limit = self._zmq.timeout if timeout is None else timeout
        return self._take(time.monotonic() + limit)

    def _take(self, deadline: float) -> bool:
        comm = self._zmq
        got = comm.transport.receive(
            P2P, comm.uid, self._tag, comm.global_ranks[self._src], deadline
        )
        if got is None:
            return False
        target = as_numpy(self._target)
        if len(got) != target.nbytes:
            raise DistcommError(
                f"recv: the message from rank {self._src} (tag {self._tag}) has {len(got)} bytes "
                f"but the receive buffer has {target.nbytes}. HINT: size the buffer like the "
                "sent tensor."
            )
        target.view("u1")[...] = memoryview(got).cast("B")
        return True

    def _waiting_for(self) -> str:
        return f"no message from rank {self._src} with tag {self._tag} arrived"


class ZmqCommunicator(BaseCommunicator):
    """A communicator whose bytes travel over ZeroMQ sockets (module docstring).

    Args:
        transport: the process's transport (shared by the groups made from this communicator).
        uid: this communicator's number, the same on every member.
        owns: whether ``finalize`` closes the transport (the world communicator).
        **kwargs: BaseCommunicator's.
    """

    backend_name = "zmq"
    capabilities = ZMQ_CAPABILITIES
    engine_errors = (Closed, zmq.ZMQError)

    def __init__(self, transport: Transport, uid: int, *, owns: bool, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.transport, self.uid, self._owns = transport, uid, owns
        self._issued = 0  # operations issued here: the key of the next one's messages
        self._groups = 0  # groups made from here: part of their uid
        self._queue: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self._worker: threading.Thread | None = None
        transport.progress[uid] = lambda: self.seq
        transport.whereabouts[uid] = lambda: stacks.answer(self)

    @property
    def native(self) -> Transport:
        """The transport (its ZeroMQ context is ``native.context``)."""
        return self.transport

    # -- running an algorithm ----------------------------------------------------------------
    def _algorithm(self, async_op: bool, algorithm: Callable[..., None], *args: Any) -> Work | None:
        """``algorithm(op, *args)`` now (blocking) or in the worker thread (async)."""
        self._issued += 1
        op = _Op(self, self._issued, self.timeout)
        name, seq = self.op, self.seq
        if not async_op:
            self._execute(op, name, seq, algorithm, args)
            return None
        done, box = threading.Event(), []

        def job() -> None:
            try:
                self._execute(op, name, seq, algorithm, args)
            except BaseException as exc:
                box.append(exc)
            finally:
                done.set()

        if self._worker is None:
            self._worker = threading.Thread(
                target=self._work, name=f"distcomm-zmq-{self.uid}", daemon=True
            )
            self._worker.start()
        self._queue.put(job)
        return _FutureWork(self, done, box)

    def _execute(
        self, op: _Op, name: str, seq: int, algorithm: Callable[..., None], args: tuple[Any, ...]
    ) -> None:
        try:
            algorithm(op, *args)
            op.settle()
        except _Late:
            raise self.timed_out(name, seq, self.timeout) from None

    def _work(self) -> None:
        while True:
            job = self._queue.get()
            if job is None:
                return
            job()

    def _peer_progress(self) -> dict[int, int]:
        peers = [g for r, g in enumerate(self.global_ranks) if r != self.rank]
        answers = self.transport.ask_progress(self.uid, peers, 1.0)
        return {self.global_ranks.index(g): seq for g, seq in answers.items() if seq >= 0}

    def _peer_stacks(self, ranks: list[int]) -> dict[int, str]:
        peers = [self.global_ranks[r] for r in ranks]
        answers = self.transport.ask_where(self.uid, peers, 1.0)
        return {self.global_ranks.index(g): text for g, text in answers.items() if text}

    # -- the primitives ------------------------------------------------------------------------
    def _all_reduce(self, tensor: Any, op: ReduceOp, async_op: bool) -> Work | None:
        return self._algorithm(async_op, algorithms.all_reduce, as_numpy(tensor), op)

    def _broadcast(self, tensor: Any, src: int, async_op: bool) -> Work | None:
        return self._algorithm(async_op, algorithms.broadcast, as_numpy(tensor), src)

    def _all_gather_into(self, output: Any, tensor: Any, async_op: bool) -> Work | None:
        return self._algorithm(async_op, algorithms.all_gather, as_numpy(output), as_numpy(tensor))

    def _reduce(self, tensor: Any, dst: int, op: ReduceOp, async_op: bool) -> Work | None:
        return self._algorithm(async_op, algorithms.reduce, as_numpy(tensor), dst, op)

    def _reduce_scatter(self, output: Any, input: Any, op: ReduceOp, async_op: bool) -> Work | None:
        out, x = as_numpy(output), as_numpy(input)
        return self._algorithm(async_op, algorithms.reduce_scatter, out, x, op)

    def _gather(self, output: Any | None, tensor: Any, dst: int, async_op: bool) -> Work | None:
        out = None if output is None else as_numpy(output)
        return self._algorithm(async_op, algorithms.gather, out, as_numpy(tensor), dst)

    def _scatter(self, output: Any, full: Any | None, src: int, async_op: bool) -> Work | None:
        whole = None if full is None else as_numpy(full)
        return self._algorithm(async_op, algorithms.scatter, as_numpy(output), whole, src)

    def _all_to_all(self, output: Any, input: Any, async_op: bool) -> Work | None:
        return self._algorithm(async_op, algorithms.all_to_all, as_numpy(output), as_numpy(input))

    def _barrier(self, async_op: bool) -> Work | None:
        return self._algorithm(async_op, algorithms.barrier)

    def _isend(self, tensor: Any, dst: int, tag: int) -> Work:
        data = as_numpy(tensor)
        tracker = self.transport.send(P2P, self.uid, tag, self.global_ranks[dst], data)
        return _SendWork(self, tracker, tensor, dst, tag)

    def _irecv(self, tensor: Any, src: int | None, tag: int) -> Work:
        assert src is not None  # any_source=False: distcomm refuses src=None before this
        return _RecvWork(self, tensor, src, tag)

    def _split(self, groups: list[tuple[int, ...]], index: int | None) -> Communicator | NonMember:
        self._groups += 1
        if index is None:
            return NON_MEMBER
        members = groups[index]
        made = f"{self.uid} {self._groups} {index}".encode()
        uid = int.from_bytes(hashlib.blake2b(made, digest_size=8).digest(), "little") >> 2
        return ZmqCommunicator(self.transport, uid, owns=False, **self._group_arguments(members))

    def _finalize(self) -> None:
        if self._worker is not None:
            self._queue.put(None)
            self._worker.join(self.timeout)
        self.transport.progress.pop(self.uid, None)
        self.transport.whereabouts.pop(self.uid, None)
        if self._owns:
            self.transport.close()


def connect(launch: LaunchInfo, timeout: float) -> ZmqCommunicator:
    """This rank's world: bind the inbox, exchange addresses at the rendezvous, connect."""
    context: zmq.Context[Any] = zmq.Context()
    try:
        inbox = context.socket(zmq.PULL)
        inbox.setsockopt(zmq.LINGER, 0)
        inbox.setsockopt(zmq.RCVHWM, 0)
        endpoint = rendezvous.bind_inbox(inbox, launch)
        endpoints = rendezvous.exchange(context, launch, endpoint, timeout)
    except BaseException:
        context.destroy(linger=0)
        raise
    transport = Transport(context, inbox, endpoints, launch.rank)
    return ZmqCommunicator(
        transport,
        1,
        owns=True,
        rank=launch.rank,
        world_size=launch.world_size,
        launch=launch,
        timeout=timeout,
    )
