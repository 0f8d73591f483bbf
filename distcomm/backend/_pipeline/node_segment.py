"""A group's node segment: memory that every rank of a one-node group maps, and the waits on it.

The node-memory transport of CPU tensor collectives (:mod:`.node_collectives`) moves a group's
tensors through one shared segment instead of the engine. The segment is an anonymous in-memory
file (``memfd_create``) that the group's rank 0 makes and every other rank opens through
``/proc/<pid>/fd/<fd>`` and maps: it has no name anywhere, so a rank killed with SIGKILL leaves
nothing behind (the kernel frees the memory with the last process mapping it). Rank 0 closes its
fd once every rank mapped it.

**The proof that a group shares a node** (:func:`prove`) is that memory: the ranks first compare
their node keys (:func:`~distcomm.backend._pipeline.node_memory.node_key`: the kernel's boot id,
pid namespace and user), then every rank opens rank 0's segment, checks that it is the file rank
0 announced (its inode) and reads back 16 random bytes rank 0 wrote there, and all vote. Host
names and launcher variables play no part: two hosts with one name, or ranks in other containers,
fail the proof and keep the engine. Ranks in other network namespaces of one host share its
memory, and pass.

**Layout**: a control line of 64 bytes per rank, then two sets (by the parity of the step) of
one slot of :data:`SLOT_BYTES` per rank. A rank writes only its own line and slots; it reads the
others'. Its line holds its arrival count (a 32-bit word that the others wait on) and, for each
parity, the descriptor of the call it arrived for (op, dtype, root, bytes), which the others
compare with theirs (:meth:`Segment.arrive`): ranks that called different collectives get
:class:`~distcomm.errors.CollectiveMismatchError` instead of each other's bytes.

**Waits** (:meth:`Segment.wait`) read a peer's count, spin briefly (not at all when the node has
fewer cores than the group has ranks), then sleep on the word with the kernel's futex, in slices
of :data:`SLICE` seconds (then it looks at the clock): a rank that arrives wakes its waiters. A
watcher thread per segment sleeps on the peers' pidfds; when a peer's process ends it wakes the
waits, which then raise at once. A rank whose process ended, or one that has not arrived within
the group's timeout, ends the wait with the group's DistTimeoutError naming it, as a wait in
the engine does (:meth:`~distcomm.backend._pipeline.engine_failures.Failures.timed_out`; a
rank that ended is named without asking the others out of band).

**Order**: a rank writes its slot, then stores its count; a peer that reads the count then reads
the slot. x86-64 keeps stores in order and loads in order (its memory model, TSO), which is what
this needs; elsewhere the transport is off (:func:`available`), as plain Python stores come with
no fence.
"""

from __future__ import annotations

import contextlib
import ctypes
import mmap
import os
import platform
import select
import struct
import sys
import threading
import time
from typing import TYPE_CHECKING, Any

from distcomm._logs import logger
from distcomm.backend._pipeline.node_memory import neighbours

if TYPE_CHECKING:
    from collections.abc import Callable

    from distcomm.backend.communicator import BaseCommunicator

__all__ = ["SLICE", "SLOT_BYTES", "Segment", "available", "prove"]

#: Bytes of one rank's slot in each of the two sets; a larger call moves in pieces of it. A rank
#: maps ``2 * world_size * SLOT_BYTES`` of the group's segment and writes ``2 * SLOT_BYTES`` of
#: it; pages are touched only as calls need them (benchmarks/node_tensors.py --slots).
SLOT_BYTES = 4 * 2**20
#: Seconds a waiter sleeps at most before it looks at the clock.
SLICE = 0.05
#: A rank's control line: 16 words of 32 bits (64 bytes, a cache line of its own).
_LINE_WORDS = 16
#: The words of a descriptor: op and root, dtype, bytes (low, high).
_DESCRIPTOR = 4
#: Where rank 0's segment is: pid, fd, inode, bytes, and the 16 bytes it wrote at its end.
_WHERE = struct.Struct("<qqqq16s")
_MASK = 2**32 - 1
_FUTEX_WAIT, _FUTEX_WAKE, _ETIMEDOUT = 0, 1, 110
_SYS_FUTEX = 202  # x86-64


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


def _syscall() -> Callable[..., int] | None:
    """libc's ``syscall`` for the futex, or None where the transport is off (not Linux on
    x86-64, no memfd, no libc)."""
    if sys.platform != "linux" or platform.machine() not in ("x86_64", "AMD64"):
        return None
    if not hasattr(os, "memfd_create") or not hasattr(os, "pidfd_open"):
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None
    call = libc.syscall
    call.restype = ctypes.c_long
    call.argtypes = (
        ctypes.c_long,
        ctypes.c_void_p,
        ctypes.c_int,
        ctypes.c_uint,
        ctypes.c_void_p,
        ctypes.c_void_p,
        ctypes.c_uint,
    )
    return call  # type: ignore[no-any-return]


_futex = _syscall()


def available() -> str:
    """Why node memory cannot carry tensors in this process ("" where it can)."""
    if _futex is None:
        return (
            f"node memory needs Linux on x86-64 with memfd and pidfd (here: {sys.platform}, "
            f"{platform.machine()})"
        )
    return ""


def _layout(world: int) -> tuple[int, int]:
    """Where the slots start (after the control lines, page-aligned) and the segment's size."""
    start = -(-world * _LINE_WORDS * 4 // mmap.PAGESIZE) * mmap.PAGESIZE
    return start, start + 2 * world * SLOT_BYTES


class Segment:
    """One group's node segment, mapped in this rank (module docstring): the slots
    (:meth:`slot`) and the arrivals (:meth:`arrive`, :meth:`wait`)."""

    def __init__(self, mapping: mmap.mmap, rank: int, world: int, pids: list[int]) -> None:
        self.map = mapping
        self.rank, self.world = rank, world
        self.start, _ = _layout(world)
        self.lines = memoryview(mapping)[: world * _LINE_WORDS * 4].cast("I")
        anchor = ctypes.c_char.from_buffer(mapping)
        self._base = ctypes.addressof(anchor)  # valid while the mapping is: closed last
        del anchor
        self.count = self.lines[rank * _LINE_WORDS]  # 0 when made: every rank starts there
        self.pids = pids
        self.pidfds: dict[int, int] = {}
        for peer, pid in enumerate(pids):
            if peer != rank:
                self.pidfds[peer] = os.pidfd_open(pid)
        #: The peers whose process ended, as the watcher saw them (then it wakes the waits).
        self.ended: list[int] = []
        self._stop_r, self._stop_w = os.pipe2(os.O_CLOEXEC)
        self._watcher = threading.Thread(
            target=self._watch, name="distcomm-node-peers", daemon=True
        )
        self._watcher.start()
        try:
            cores = len(os.sched_getaffinity(0))
        except OSError:  # pragma: no cover - Linux always has it
            cores = os.cpu_count() or 1
        #: Reads of a peer's count before sleeping: none where the ranks outnumber the cores
        #: (the peer needs this core to arrive).
        self.spins = 200 if cores >= world else 0

    def slot(self, parity: int, rank: int) -> int:
        """The offset of ``rank``'s slot in set ``parity``."""
        return self.start + (parity * self.world + rank) * SLOT_BYTES

    def arrive(self, descriptor: tuple[int, int, int] | None = None) -> None:
        """This rank has written what the step needs from it: count it arrived (and, for the
        first step of a call, the call's ``descriptor``: op and root, dtype, bytes), and wake
        the ranks waiting for it."""
        count = (self.count + 1) & _MASK
        at = self.rank * _LINE_WORDS
        if descriptor is not None:
            lines, d = self.lines, at + 2 + (count & 1) * _DESCRIPTOR
            lines[d], lines[d + 1] = descriptor[0], descriptor[1]
            lines[d + 2], lines[d + 3] = descriptor[2] & _MASK, descriptor[2] >> 32
        self.lines[at] = count
        self.count = count
        _futex(_SYS_FUTEX, self._base + at * 4, _FUTEX_WAKE, 2**31 - 1, None, None, 0)  # type: ignore[misc]

    def descriptor(self, rank: int) -> tuple[int, int, int]:
        """The descriptor ``rank`` arrived with at this step (call after :meth:`wait`)."""
        d = rank * _LINE_WORDS + 2 + (self.count & 1) * _DESCRIPTOR
        lines = self.lines
        return lines[d], lines[d + 1], lines[d + 2] | lines[d + 3] << 32

    def wait(
        self, timeout: float, timed_out: Callable[[float, str, list[int]], BaseException]
    ) -> None:
        """Return once every other rank arrived at this step (counted as far as this one). A
        rank that has not arrived within ``timeout`` seconds, or whose process ended, raises
        ``timed_out(seconds waited, why it can never complete or "", the ranks whose process
        ended)``: the group's DistTimeoutError (module docstring)."""
        lines, count, deadline = self.lines, self.count, None
        for peer in range(self.world):
            if peer == self.rank:
                continue
            at = peer * _LINE_WORDS
            for _ in range(self.spins):
                if (lines[at] - count) & _MASK < 2**31:
                    break
            else:
                while True:
                    seen = lines[at]
                    if (seen - count) & _MASK < 2**31:
                        break
                    if deadline is None:
                        deadline = time.monotonic() + timeout
                    self._sleep(peer, seen, deadline, timeout, timed_out)

    def _sleep(
        self,
        peer: int,
        seen: int,
        deadline: float,
        timeout: float,
        timed_out: Callable[[float, str, list[int]], BaseException],
    ) -> None:
        """Sleep on ``peer``'s count while it is ``seen``, a slice at most; after a slice with
        no wake, check the clock and the peers' processes (raising the timeout)."""
        left = deadline - time.monotonic()
        if left <= 0:
            raise timed_out(timeout, "", [])
        span = min(left, SLICE)
        wait = _Timespec(int(span), int((span % 1) * 1e9))
        address = self._base + peer * _LINE_WORDS * 4
        _futex(_SYS_FUTEX, address, _FUTEX_WAIT, seen, ctypes.byref(wait), None, 0)  # type: ignore[misc]
        ended = self.ended
        if ended:
            ranks = ", ".join(f"rank {r} (pid {self.pids[r]})" for r in ended)
            waited = timeout - (deadline - time.monotonic())
            raise timed_out(waited, f"the process of {ranks} ended", list(ended))

    def _watch(self) -> None:
        """The watcher thread: sleeps until a peer's process ends (its pidfd turns readable),
        then notes it in :attr:`ended` and wakes this rank's waits on every peer's count (a
        wait then raises at once); until :meth:`close`."""
        watched = dict(self.pidfds)
        while watched:
            readable, _, _ = select.select([*watched.values(), self._stop_r], [], [])
            if self._stop_r in readable:
                return
            for peer, fd in list(watched.items()):
                if fd in readable:
                    del watched[peer]
                    self.ended.append(peer)
            for peer in range(self.world):
                address = self._base + peer * _LINE_WORDS * 4
                _futex(_SYS_FUTEX, address, _FUTEX_WAKE, 2**31 - 1, None, None, 0)  # type: ignore[misc]

    def close(self) -> None:
        """Unmap the segment and close the pidfds (the views made of it are gone first)."""
        os.write(self._stop_w, b"x")
        self._watcher.join()
        for fd in (*self.pidfds.values(), self._stop_r, self._stop_w):
            os.close(fd)
        self.pidfds.clear()
        self.lines.release()
        with contextlib.suppress(BufferError):  # a view still exported: the GC frees it
            self.map.close()


def prove(
    comm: BaseCommunicator,
    all_gather: Callable[..., Any],
    broadcast: Callable[..., Any],
) -> Segment | str:
    """Collective over ``comm``'s engine (``all_gather(output, x)`` and ``broadcast(x, root)``,
    which block): whether every rank is a process of this node that maps the segment rank 0 made
    (module docstring). The segment, or why not (the same on every rank)."""
    world, rank = comm.world_size, comm.rank
    same, pids = neighbours(all_gather, world)
    if not same:
        return "its ranks are not all on this node (their boot ids, pid namespaces or users differ)"
    if len(set(pids)) != world:
        return "its ranks are threads of one process (their engine already shares memory)"
    where = bytearray(_WHERE.size)
    mine: int | None = None
    _, size = _layout(world)
    if rank == 0:
        try:
            mine, nonce = _made(size)
            where[:] = _WHERE.pack(os.getpid(), mine, os.fstat(mine).st_ino, size, nonce)
        except OSError as exc:
            logger.info("node memory: no segment of %d bytes (%s)", size, exc)
    broadcast(where, 0)
    try:
        mapping, reason = _mapped(where, size)
        ok = bytearray(world)
        all_gather(ok, bytearray([mapping is not None]))
    finally:
        if mine is not None:
            os.close(mine)  # every rank mapped it, or gave up: the mappings keep it
    if not all(ok):
        if mapping is not None:
            mapping.close()
        failed = [r for r, vote in enumerate(ok) if not vote]
        return f"ranks {failed} could not map rank 0's segment" + (f" ({reason})" if reason else "")
    assert mapping is not None
    try:
        return Segment(mapping, rank, world, pids)
    except OSError as exc:  # a peer already gone: its pidfd cannot be opened
        mapping.close()
        raise comm.engine_failed(comm.op, comm.seq, exc) from exc


def _made(size: int) -> tuple[int, bytes]:
    """Rank 0's segment: a memfd of ``size`` bytes (0600) and the 16 random bytes at its end."""
    fd = os.memfd_create("distcomm-node", os.MFD_CLOEXEC)
    try:
        os.fchmod(fd, 0o600)
        os.ftruncate(fd, size)
        nonce = os.urandom(16)
        os.pwrite(fd, nonce, size - 16)
    except BaseException:
        os.close(fd)
        raise
    return fd, nonce


def _mapped(where: bytearray, size: int) -> tuple[mmap.mmap | None, str]:
    """This rank's shared mapping of the segment ``where`` names, if it is the one rank 0 made
    (its inode and bytes); else None and why."""
    pid, fd, inode, announced, nonce = _WHERE.unpack(where)
    if pid == 0:
        return None, "rank 0 could not make it"
    if pid == os.getpid():
        opened = os.dup(fd)
    else:
        try:
            opened = os.open(f"/proc/{pid}/fd/{fd}", os.O_RDWR | os.O_CLOEXEC)
        except OSError as exc:
            return None, f"/proc/{pid}/fd/{fd}: {exc.strerror}"
    try:
        seen = os.fstat(opened)
        if seen.st_ino != inode or announced != size or seen.st_size != size:
            return None, "another file than rank 0 announced"
        mapping = mmap.mmap(opened, size)
    except OSError as exc:
        return None, str(exc)
    finally:
        os.close(opened)
    if mapping[size - 16 : size] != nonce:
        mapping.close()
        return None, "its bytes are not rank 0's"
    return mapping, ""
