"""The zmq engine: distcomm's engine methods over the :mod:`~distcomm_zmq.transport`.

Each collective is one algorithm of :mod:`~distcomm_zmq.algorithms` run over an :class:`_Op` (the
operation's messages, keyed by the communicator and a count of the operations issued on it, so
that the ranks match them whatever else is in flight). A blocking collective runs in the caller's
thread; an async one runs in the engine's worker thread, in issue order, and its Work completes
when it has. Point-to-point messages are keyed by tag; a receive is matched by whichever thread
waits for its Work. Every wait has a deadline: past the communicator's timeout the operation
raises :class:`_Late`, which :meth:`ZmqEngine.timeout_of` calls a timeout, and distcomm raises
DistTimeoutError naming the ranks that had not arrived (the peers say how far they got).
"""

from __future__ import annotations

import hashlib
import queue
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import zmq

from distcomm.backend import EngineWork, LaunchInfo, stacks
from distcomm.errors import InvalidArgumentError
from distcomm_zmq import algorithms, rendezvous
from distcomm_zmq.algorithms import as_numpy
from distcomm_zmq.transport import COLLECTIVE, P2P, Closed, Transport

if TYPE_CHECKING:
    from distcomm.backend import BaseCommunicator
    from distcomm.protocol import ReduceOp, Work

__all__ = ["ZmqEngine", "connect"]


class _Late(Exception):
    """An operation's message (or the release of its sends) did not come before its deadline."""


class _Op(algorithms.Link):
    """One operation's messages on a communicator (the algorithms' Link)."""

    def __init__(self, engine: ZmqEngine, key: int, timeout: float) -> None:
        self.rank, self.size = engine.rank, engine.size
        self._engine, self._key = engine, key
        self._deadline = time.monotonic() + timeout
        self._sent: list[Any] = []

    def send(self, dst: int, data: Any) -> None:
        engine = self._engine
        tracker = engine.transport.send(COLLECTIVE, engine.uid, self._key, engine.ranks[dst], data)
        if tracker is not None:
            self._sent.append(tracker)

    def recv(self, src: int) -> memoryview:
        engine = self._engine
        got = engine.transport.receive(
            COLLECTIVE, engine.uid, self._key, engine.ranks[src], self._deadline
        )
        if got is None:
            raise _Late(f"no message from rank {src} before the deadline")
        view: memoryview = got
        return view

    def settle(self) -> None:
        if not Transport.settle(self._sent, self._deadline):
            raise _Late("ZeroMQ did not let go of a sent buffer before the deadline")
        self._sent.clear()


class _Future:
    """The request of an async collective: done when the worker thread has run it."""

    def __init__(self, limit: float) -> None:
        self.done = threading.Event()
        self.error: BaseException | None = None
        self._limit = limit

    def test(self) -> bool:
        if not self.done.is_set():
            return False
        if self.error is not None:
            raise self.error
        return True

    def block(self, timeout: float | None) -> bool:
        self.done.wait(self._limit + 5 if timeout is None else timeout)
        return self.test()


class _Send:
    """The request of an isend: done when ZeroMQ let go of the buffer (at once for a small one)."""

    def __init__(self, tracker: Any) -> None:
        self._tracker = tracker

    def test(self) -> bool:
        return self._tracker is None or bool(self._tracker.done)


class _Receive:
    """The request of an irecv: done once the message from ``source`` with ``tag`` arrived and
    was copied into ``target``."""

    def __init__(self, engine: ZmqEngine, target: Any, source: int, tag: int) -> None:
        self._engine, self._target, self.source, self._tag = engine, target, source, tag

    def test(self) -> bool:
        return self._take(time.monotonic())

    def block(self, timeout: float | None) -> bool:
        limit = self._engine.comm.timeout if timeout is None else timeout
        return self._take(time.monotonic() + limit)

    def _take(self, deadline: float) -> bool:
        engine = self._engine
        got = engine.transport.receive(
            P2P, engine.uid, self._tag, engine.ranks[self.source], deadline
        )
        if got is None:
            return False
        target = as_numpy(self._target)
        if len(got) != target.nbytes:
            raise InvalidArgumentError(
                f"recv: the message from rank {self.source} (tag {self._tag}) has {len(got)} "
                f"bytes but the receive buffer has {target.nbytes}. HINT: size the buffer like "
                "the sent tensor."
            )
        target.view("u1")[...] = memoryview(got).cast("B")
        return True

    def waiting_for(self) -> str:
        return f"no message from rank {self.source} with tag {self._tag} arrived"


class ZmqEngine:
    """An engine whose bytes travel over ZeroMQ sockets (module docstring); ``native`` is the
    transport (its ZeroMQ context is ``native.context``).

    Args:
        transport: the process's transport (shared by the groups made from this engine).
        uid: this communicator's number, the same on every member.
        owns: whether ``finalize`` closes the transport (the world's engine).
    """

    engine_errors = (_Late, Closed, zmq.ZMQError)

    def __init__(self, transport: Transport, uid: int, *, owns: bool) -> None:
        self.transport = self.native = transport
        self.uid, self._owns = uid, owns
        self._issued = 0  # operations issued here: the key of the next one's messages
        self._groups = 0  # groups made from here: part of their uid
        self._queue: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self._worker: threading.Thread | None = None

    def bind(self, comm: BaseCommunicator) -> None:
        """Keep the communicator (rank, size, world ranks, timeout); answer the peers that ask
        how far it got and where its thread is."""
        self.comm = comm
        self.rank, self.size, self.ranks = comm.rank, comm.world_size, comm.global_ranks
        self.transport.progress[self.uid] = lambda: comm.seq
        self.transport.whereabouts[self.uid] = lambda: stacks.answer(comm)

    # -- running an algorithm ----------------------------------------------------------------
    def _algorithm(self, async_op: bool, algorithm: Callable[..., None], *args: Any) -> Work | None:
        """``algorithm(op, *args)`` now (blocking) or in the worker thread (async)."""
        self._issued += 1
        op = _Op(self, self._issued, self.comm.timeout)
        if not async_op:
            _run(op, algorithm, args)
            return None
        future = _Future(self.comm.timeout)

        def job() -> None:
            try:
                _run(op, algorithm, args)
            except BaseException as exc:
                future.error = exc
            finally:
                future.done.set()

        if self._worker is None:
            self._worker = threading.Thread(
                target=self._work, name=f"distcomm-zmq-{self.uid}", daemon=True
            )
            self._worker.start()
        self._queue.put(job)
        return EngineWork(self.comm, future)

    def _work(self) -> None:
        while True:
            job = self._queue.get()
            if job is None:
                return
            job()

    # -- failures ------------------------------------------------------------------------------
    def timeout_of(self, exc: BaseException) -> str | None:
        """A message that did not come before the deadline is the engine's timeout."""
        return "" if isinstance(exc, _Late) else None

    def peer_progress(self) -> dict[int, int]:
        peers = [g for r, g in enumerate(self.ranks) if r != self.rank]
        answers = self.transport.ask_progress(self.uid, peers, 1.0)
        return {self.ranks.index(g): seq for g, seq in answers.items() if seq >= 0}

    def peer_stacks(self, ranks: list[int]) -> dict[int, str]:
        answers = self.transport.ask_where(self.uid, [self.ranks[r] for r in ranks], 1.0)
        return {self.ranks.index(g): text for g, text in answers.items() if text}

    # -- the engine's methods --------------------------------------------------------------------
    def all_reduce(self, tensor: Any, op: ReduceOp, async_op: bool) -> Work | None:
        return self._algorithm(async_op, algorithms.all_reduce, as_numpy(tensor), op)

    def broadcast(self, tensor: Any, src: int, async_op: bool) -> Work | None:
        return self._algorithm(async_op, algorithms.broadcast, as_numpy(tensor), src)

    def all_gather_into(self, output: Any, tensor: Any, async_op: bool) -> Work | None:
        return self._algorithm(async_op, algorithms.all_gather, as_numpy(output), as_numpy(tensor))

    def reduce(self, tensor: Any, dst: int, op: ReduceOp, async_op: bool) -> Work | None:
        return self._algorithm(async_op, algorithms.reduce, as_numpy(tensor), dst, op)

    def reduce_scatter(self, output: Any, input: Any, op: ReduceOp, async_op: bool) -> Work | None:
        out, x = as_numpy(output), as_numpy(input)
        return self._algorithm(async_op, algorithms.reduce_scatter, out, x, op)

    def gather(self, output: Any | None, tensor: Any, dst: int, async_op: bool) -> Work | None:
        out = None if output is None else as_numpy(output)
        return self._algorithm(async_op, algorithms.gather, out, as_numpy(tensor), dst)

    def scatter(self, output: Any, full: Any | None, src: int, async_op: bool) -> Work | None:
        whole = None if full is None else as_numpy(full)
        return self._algorithm(async_op, algorithms.scatter, as_numpy(output), whole, src)

    def all_to_all(self, output: Any, input: Any, async_op: bool) -> Work | None:
        return self._algorithm(async_op, algorithms.all_to_all, as_numpy(output), as_numpy(input))

    def barrier(self, async_op: bool) -> Work | None:
        return self._algorithm(async_op, algorithms.barrier)

    def isend(self, tensor: Any, dst: int, tag: int) -> Work:
        tracker = self.transport.send(P2P, self.uid, tag, self.ranks[dst], as_numpy(tensor))
        op = f"send to rank {dst} (tag {tag})"
        return EngineWork(self.comm, _Send(tracker), tensor, op=op, seq=None)

    def irecv(self, tensor: Any, src: int | None, tag: int) -> Work:
        assert src is not None  # any_source=False: distcomm refuses src=None before this
        op = f"recv from rank {src} (tag {tag})"
        return EngineWork(self.comm, _Receive(self, tensor, src, tag), tensor, op=op, seq=None)

    def split(self, groups: list[tuple[int, ...]], index: int | None) -> ZmqEngine | None:
        self._groups += 1
        if index is None:
            return None
        made = f"{self.uid} {self._groups} {index}".encode()
        uid = int.from_bytes(hashlib.blake2b(made, digest_size=8).digest(), "little") >> 2
        return ZmqEngine(self.transport, uid, owns=False)

    def finalize(self) -> None:
        if self._worker is not None:
            self._queue.put(None)
            self._worker.join(self.comm.timeout)
        self.transport.progress.pop(self.uid, None)
        self.transport.whereabouts.pop(self.uid, None)
        if self._owns:
            self.transport.close()


def _run(op: _Op, algorithm: Callable[..., None], args: tuple[Any, ...]) -> None:
    """One operation: the algorithm, then the release of the buffers it sent without a copy."""
    algorithm(op, *args)
    op.settle()


def connect(launch: LaunchInfo, timeout: float) -> ZmqEngine:
    """This rank's world engine: bind the inbox, exchange addresses at the rendezvous, connect."""
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
    return ZmqEngine(Transport(context, inbox, endpoints, launch.rank), 1, owns=True)
