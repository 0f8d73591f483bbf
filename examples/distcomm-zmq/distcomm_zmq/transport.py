"""Messages between the ranks of a job over ZeroMQ: one inbox per process, matched by key.

Each process binds one PULL socket (its inbox) and sends to a peer through a PUSH socket
connected to the peer's inbox; a thread of its own (the receiver) reads the inbox and files each
message under its key, ``(kind, communicator, key, source)``, where a waiting operation finds it.
Messages of one key from one source arrive in the order they were sent (one PUSH socket per
sending thread and peer), so an operation's steps need no sequence numbers of their own.

Sending threads each get their own PUSH sockets (ZeroMQ sockets belong to one thread). A payload
of :data:`COPY_BELOW` bytes or more is sent without a copy (``copy=False``): the operation then
waits for ZeroMQ to let go of it (:meth:`Transport.settle`) before it completes, so that the caller
may write into its tensor again.

The receiver also answers "how far are you?" (the ``seq`` each communicator has reached), which
a timed-out operation asks its peers to name the ranks that had not arrived, and then "where are
you?" (the Python stack of the thread using the communicator), which it asks those ranks.
"""

from __future__ import annotations

import collections
import contextlib
import struct
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import zmq

__all__ = ["COLLECTIVE", "COPY_BELOW", "P2P", "Closed", "Transport"]

#: Message kinds.
COLLECTIVE, P2P, ASK, ANSWER, WHERE, HERE = 0, 1, 2, 3, 4, 5
#: Payloads smaller than this are copied into the message (cheaper than tracking them).
COPY_BELOW = 64 * 1024
_HEADER = struct.Struct("<BqqI")  # kind, communicator, key, source (a global rank)
_STOP = b"stop"


class Closed(Exception):
    """The transport was closed while an operation waited."""


class Transport:
    """The process's inbox, its receiver thread, and sending sockets (module docstring).

    Args:
        context: the ZeroMQ context.
        inbox: the bound PULL socket.
        endpoints: every rank's inbox address, by global rank.
        rank: this process's global rank.
    """

    def __init__(
        self, context: zmq.Context[Any], inbox: zmq.Socket[Any], endpoints: Sequence[str], rank: int
    ) -> None:
        self.context = context
        self.endpoints = list(endpoints)
        self.rank = rank
        self._inbox = inbox
        self._arrived: dict[tuple[int, int, int, int], collections.deque[Any]] = {}
        self._cond = threading.Condition()
        self._local = threading.local()
        self._sockets: list[zmq.Socket[Any]] = []
        self._lock = threading.Lock()
        self._closed = False
        #: What each communicator has reached (its ``seq``), and where the thread using it is
        #: (a stack's text), for peers that ask.
        self.progress: dict[int, Callable[[], int]] = {}
        self.whereabouts: dict[int, Callable[[], str]] = {}
        self._stop_address = f"inproc://distcomm-zmq-stop-{id(self)}"
        self._stop_in = context.socket(zmq.PULL)
        self._stop_in.bind(self._stop_address)
        self._receiver = threading.Thread(target=self._receive, name="distcomm-zmq", daemon=True)
        self._receiver.start()

    # -- sending -----------------------------------------------------------------------------
    def send(self, kind: int, comm: int, key: int, dst: int, payload: Any = b"") -> Any:
        """Send ``payload`` (bytes or a contiguous buffer) to global rank ``dst``; return a
        tracker to :meth:`settle` when it was sent without a copy, else None."""
        socket = self._socket(dst)
        header = _HEADER.pack(kind, comm, key, self.rank)
        view = memoryview(payload).cast("B")
        if view.nbytes < COPY_BELOW:
            socket.send_multipart((header, view), copy=True)
            return None
        return socket.send_multipart((header, view), copy=False, track=True)

    @staticmethod
    def settle(trackers: Sequence[Any], deadline: float) -> bool:
        """Wait until ZeroMQ let go of the buffers sent without a copy; False at ``deadline``."""
        for tracker in trackers:
            if tracker is None:
                continue
            while not tracker.done:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                with contextlib.suppress(zmq.NotDone):
                    tracker.wait(min(left, 0.05))
        return True

    def _socket(self, dst: int) -> zmq.Socket[Any]:
        sockets: dict[int, zmq.Socket[Any]] | None = getattr(self._local, "sockets", None)
        if sockets is None:
            sockets = self._local.sockets = {}
        socket = sockets.get(dst)
        if socket is None:
            with self._lock:
                if self._closed:
                    raise Closed("the zmq transport is closed")
                socket = self.context.socket(zmq.PUSH)
                socket.setsockopt(zmq.LINGER, 0)
                socket.setsockopt(zmq.SNDHWM, 0)  # never drop, never block on a slow peer
                socket.connect(self.endpoints[dst])
                self._sockets.append(socket)
            sockets[dst] = socket
        return socket

    # -- receiving ---------------------------------------------------------------------------
    def receive(self, kind: int, comm: int, key: int, src: int, deadline: float) -> Any:
        """The next payload (a memoryview) of ``(kind, comm, key)`` from global rank ``src``;
        None at ``deadline``.

        Raises:
            Closed: the transport was closed.
        """
        slot = (kind, comm, key, src)
        with self._cond:
            while True:
                queue = self._arrived.get(slot)
                if queue:
                    payload = queue.popleft()
                    if not queue:
                        del self._arrived[slot]
                    return payload
                if self._closed:
                    raise Closed("the zmq transport is closed")
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self._cond.wait(left)

    def poll(self, kind: int, comm: int, key: int, src: int) -> bool:
        """Whether a payload of that key from ``src`` has arrived (not taken)."""
        with self._cond:
            return bool(self._arrived.get((kind, comm, key, src)))

    def _receive(self) -> None:
        poller = zmq.Poller()
        poller.register(self._inbox, zmq.POLLIN)
        poller.register(self._stop_in, zmq.POLLIN)
        while True:
            ready = dict(poller.poll())
            if self._stop_in in ready:
                break
            while True:
                try:
                    header, payload = self._inbox.recv_multipart(zmq.NOBLOCK, copy=False)
                except zmq.Again:
                    break
                kind, comm, key, src = _HEADER.unpack(header.buffer)
                if kind in (ASK, WHERE):
                    self._answer(kind, comm, src)
                    continue
                with self._cond:
                    self._arrived.setdefault((kind, comm, key, src), collections.deque()).append(
                        payload.buffer
                    )
                    self._cond.notify_all()

    def _answer(self, kind: int, comm: int, src: int) -> None:
        if kind == WHERE:
            whereabouts = self.whereabouts.get(comm)
            text = "" if whereabouts is None else whereabouts()
            self.send(HERE, comm, 0, src, text.encode(errors="replace"))
            return
        reached = self.progress.get(comm)
        self.send(ANSWER, comm, -1 if reached is None else reached(), src)

    # -- asking --------------------------------------------------------------------------------
    def ask_progress(self, comm: int, peers: Sequence[int], wait: float) -> dict[int, int]:
        """The ``seq`` each of ``peers`` (global ranks) reached on communicator ``comm``, for
        those that answered within ``wait`` seconds."""
        answers = self._ask(ASK, comm, peers, wait)
        return {peer: key for peer, (key, _) in answers.items()}  # an answer's key: the seq

    def ask_where(self, comm: int, peers: Sequence[int], wait: float) -> dict[int, str]:
        """Where each of ``peers`` (global ranks) is (the stack of the thread that uses
        communicator ``comm`` there), for those that answered within ``wait`` seconds."""
        answers = self._ask(WHERE, comm, peers, wait)
        return {peer: bytes(text).decode(errors="replace") for peer, (_, text) in answers.items()}

    def _ask(
        self, kind: int, comm: int, peers: Sequence[int], wait: float
    ) -> dict[int, tuple[int, Any]]:
        """Send question ``kind`` to ``peers``; their answers' (key, payload) by peer."""
        reply = ANSWER if kind == ASK else HERE
        for peer in peers:
            self.send(kind, comm, 0, peer)
        deadline = time.monotonic() + wait
        answers: dict[int, tuple[int, Any]] = {}
        with self._cond:
            while len(answers) < len(peers) and time.monotonic() < deadline:
                for slot in [s for s in self._arrived if s[:2] == (reply, comm)]:
                    answers[slot[3]] = (slot[2], self._arrived.pop(slot)[0])
                if len(answers) < len(peers):
                    self._cond.wait(max(0.0, deadline - time.monotonic()))
        return answers

    # -- closing -------------------------------------------------------------------------------
    def close(self) -> None:
        """Stop the receiver, close every socket and the context; waiting operations raise
        Closed. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        stop = self.context.socket(zmq.PUSH)
        stop.connect(self._stop_address)
        stop.send(_STOP)
        self._receiver.join(5.0)
        stop.close(linger=0)
        with self._cond:
            self._cond.notify_all()
        self.context.destroy(linger=0)
