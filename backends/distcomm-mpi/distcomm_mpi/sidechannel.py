"""Questions between the ranks of an MPI job, out of band: "which operation are you at?" and
"where are you?".

When an operation times out, the rank that waited asks every other member of the communicator
for its sequence number on a private duplicate of COMM_WORLD, then asks them for their Python
stack and calls (:func:`distcomm.backend.stacks.answer`); each rank's monitor thread answers a
few times per second, whatever its main thread is doing (blocked in another collective, busy
in Python, asleep). A rank that does not answer in time is reported as such, never guessed.
A question is two integers: the communicator's key and the tag to answer on, negated for
"where are you?".

Communicators are named by a key every member computes alike: their world ranks and how many
communicators of the same ranks this process made before (members create groups collectively,
in the same order).
"""

from __future__ import annotations

import atexit
import itertools
import struct
import threading
import time
import weakref
import zlib
from collections.abc import Sequence
from typing import Any

from mpi4py import MPI

from distcomm.backend import aborts, stacks

__all__ = ["SideChannel", "channel"]

_QUERY = 1
_FIRST_REPLY = 2
_MESSAGE = struct.Struct("<qq")  # (communicator key, reply tag) / (sequence number, 0)
_UNKNOWN = -1
#: The key of "the job ends" (communicators' keys are CRC-32 values, never negative).
_ENDING = -1
#: The longest answer to "where are you?", in bytes.
_WHERE_BYTES = 4 * stacks.MAX_TEXT

_channel: SideChannel | None = None


def channel(world: Any) -> SideChannel:
    """The process's side channel, made on first use (collective over ``world``, COMM_WORLD)."""
    global _channel
    if _channel is None or _channel.closed:
        _channel = SideChannel(world)
    return _channel


class SideChannel:
    """Answers and asks "which operation are you at on communicator K?" (module docstring)."""

    #: The monitor ticks at least this often while the channel is open.
    monitor_interval = 0.25

    def __init__(self, world: Any) -> None:
        self._comm = world.Dup()
        self._lock = threading.RLock()
        self._inbox = bytearray(_MESSAGE.size)
        self._status = MPI.Status()
        self._request = self._comm.Irecv(self._inbox, MPI.ANY_SOURCE, _QUERY)
        self._sends: list[Any] = []
        self._known: dict[int, weakref.ref[Any]] = {}
        self._made: dict[tuple[int, ...], int] = {}
        self._tags = itertools.count()
        self._tag_ub = int(self._comm.Get_attr(MPI.TAG_UB) or 32767)
        self.closed = False
        atexit.register(self.close)  # after mpi4py's own: runs before MPI_Finalize

    def register(self, comm: Any) -> int:
        """Name ``comm`` (an mpi communicator) so that peers can ask about it; return its key."""
        ranks = tuple(comm.global_ranks)
        with self._lock:
            index = self._made.get(ranks, 0)
            self._made[ranks] = index + 1
            key = zlib.crc32(f"{','.join(map(str, ranks))}#{index}".encode())
            self._known[key] = weakref.ref(comm)
        return key

    def monitor_tick(self, now: float) -> None:
        """Answer the questions that arrived (the monitor thread calls this)."""
        self.serve()

    def serve(self) -> None:
        """Answer every question that has arrived, without blocking."""
        with self._lock:
            while not self.closed and self._request.Test(self._status):
                key, tag = _MESSAGE.unpack(self._inbox)
                asker = self._status.Get_source()
                comm = self._known.get(key, lambda: None)()
                if key == _ENDING:
                    aborts.last_words()
                    reply = bytearray(_MESSAGE.pack(0, 0))
                elif tag < 0:  # where are you?
                    text = stacks.answer(comm).encode(errors="replace")[:_WHERE_BYTES]
                    reply = bytearray(text)
                else:
                    seq = _UNKNOWN if comm is None else int(comm.seq)
                    reply = bytearray(_MESSAGE.pack(seq, 0))
                self._sends.append((self._comm.Isend(reply, asker, abs(tag)), reply))
                self._request = self._comm.Irecv(self._inbox, MPI.ANY_SOURCE, _QUERY)
            self._sends = [(r, b) for r, b in self._sends if not r.Test()]

    def ask(self, key: int, peers: Sequence[int], wait: float) -> dict[int, int]:
        """Each of ``peers`` (world ranks)'s sequence number on communicator ``key``; peers that
        did not answer within ``wait`` seconds, or do not know it, are left out."""
        replies = self._exchange(key, peers, wait, where=False)
        seqs = {peer: _MESSAGE.unpack(reply)[0] for peer, reply in replies.items()}
        return {peer: seq for peer, seq in seqs.items() if seq != _UNKNOWN}

    def where(self, key: int, peers: Sequence[int], wait: float) -> dict[int, str]:
        """Where each of ``peers`` (world ranks) is: the stack of the thread that uses
        communicator ``key`` there; peers that did not answer within ``wait`` seconds are left
        out."""
        replies = self._exchange(key, peers, wait, where=True)
        return {peer: reply.decode(errors="replace") for peer, reply in replies.items()}

    def job_ends(self, wait: float) -> None:
        """Tell every other rank that this one is about to end the job; return once each has
        run its last words, or after ``wait`` seconds."""
        me = self._comm.Get_rank()
        self._exchange(_ENDING, [r for r in range(self._comm.Get_size()) if r != me], wait, False)

    def _exchange(
        self, key: int, peers: Sequence[int], wait: float, where: bool
    ) -> dict[int, bytes]:
        """Ask ``peers`` about communicator ``key``; their answers within ``wait`` seconds."""
        with self._lock:
            if self.closed:
                return {}
            tag = _FIRST_REPLY + next(self._tags) % (self._tag_ub - _FIRST_REPLY)
            question = bytearray(_MESSAGE.pack(key, -tag if where else tag))
            size = _WHERE_BYTES if where else _MESSAGE.size
            replies = {peer: bytearray(size) for peer in peers}
            receives = {peer: self._comm.Irecv(replies[peer], peer, tag) for peer in peers}
            for peer in peers:
                self._sends.append((self._comm.Isend(question, peer, _QUERY), question))
        answers: dict[int, bytes] = {}
        status = MPI.Status()
        deadline = time.monotonic() + wait
        while receives and time.monotonic() < deadline:
            self.serve()  # peers asking us at the same time get their answer too
            with self._lock:
                for peer, request in list(receives.items()):
                    if request.Test(status):
                        answers[peer] = bytes(replies[peer][: status.Get_count(MPI.BYTE)])
                        del receives[peer]
            time.sleep(0.005)
        with self._lock:
            for request in receives.values():
                request.Cancel()
                request.Wait()
        return answers

    def close(self) -> None:
        """Stop answering and free the channel (at exit, before MPI_Finalize)."""
        with self._lock:
            if self.closed or MPI.Is_finalized() or not MPI.Is_initialized():
                self.closed = True
                return
            self.closed = True
            self._request.Cancel()
            self._request.Wait()
            for request, _ in self._sends:
                request.Free()  # a small send completes on its own; nothing waits for it
            self._sends = []
            self._comm.Free()
