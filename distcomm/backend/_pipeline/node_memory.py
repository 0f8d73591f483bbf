"""Node memory: large object payloads handed between the processes of one node through memory.

When every rank of a communicator is a process of one node, an object collective need not push
a large payload through the engine (Gloo's TCP loopback moves about 0.7 to 3 GB/s here, a memory
copy about 9 GB/s). Its writer puts the payload in its *outbox*, an anonymous in-memory file
(``memfd_create``), and sends only where the outbox is (:data:`WHERE`: pid,
fd number, inode, capacity, kind) through the engine. Each reader opens
``/proc/<pid>/fd/<fd>`` read-only and maps it. Then every rank votes (:func:`agree`): the writer
may write its outbox again only once every reader is done with it, and a reader that could not
open or read it makes every rank fall back to the engine.

Why a memfd: it has no name, in /dev/shm or anywhere, so a rank killed with SIGKILL leaves
nothing behind: the kernel frees the memory with the last process holding it (an fd or a
mapping). Only processes allowed to inspect the writer (its own user, as for ptrace) can open
it through /proc, and its mode is 0600.

Two kinds of outbox, because a page of memory that a process touches for the first time costs
about 2.5 us to fault in on this machine (16 MiB: 10 ms, more than the copies):

- a payload of up to :data:`KEEP_BYTES` goes in the rank's *kept* outbox, mapped and reused by
  the next collective (readers keep their mapping of it too); each reader copies the payload out
  once, into memory of its own, so that what it unpickles never points into an outbox that the
  next collective rewrites;
- a larger payload gets an outbox of its own, written with ``pwrite`` (half the cost of faulting
  fresh pages in through a mapping) and never written again: readers map it copy-on-write and
  unpickle in place, without a copy (its arrays are writable; writes stay private). The writer
  closes it after the vote; the memory goes with the last object unpickled from it (one small
  array kept from a 1 GiB state dict keeps the whole 1 GiB).

Which communicators: the first object collective on a communicator (its object channel) with a
payload of at least :data:`NODE_BYTES` makes every rank :func:`learn` whether they all share a
node (one all-gather of each rank's node key and pid), cached for that communicator's life.
The node key is the kernel's boot id, the pid namespace and the user: ranks in other containers
or on other machines differ. Thread-ranks of one process (fakelink) share a pid: their engine
already hands memory over in the process, and node memory would only add a copy, so they never
use it. A failed vote turns node memory off for the communicator (every rank sees the same
votes): a lasting cause, such as a /proc that hides other processes, then costs one fallback.

Every rank must call these in the same order, as the collective calling them says.
"""

from __future__ import annotations

import dataclasses
import mmap
import os
import struct
import threading
import weakref
from typing import TYPE_CHECKING, Any

from distcomm._logs import logger
from distcomm._object_codec import lay_out

if TYPE_CHECKING:
    from collections.abc import Callable

    from distcomm.backend.communicator import BaseCommunicator

__all__ = [
    "KEEP_BYTES",
    "NODE_BYTES",
    "WHERE",
    "agree",
    "fetch",
    "learn",
    "local",
    "neighbours",
    "publish",
]

#: Payloads of at least this many bytes go through node memory. Below, the engine's transfer
#: costs no more than node memory's second collective, the vote (benchmarks/node_objects.py
#: --sweep, 2 ranks: 0.8x to 1.1x at 256 KiB on gloo and mpi, 1.1x to 1.7x at 1 MiB).
NODE_BYTES = 2**20
#: Payloads of at most this many bytes go in the rank's kept outbox, reused by the next
#: collective; a larger one gets an outbox of its own, read in place and closed after the call.
KEEP_BYTES = 64 * 2**20
#: Where an outbox is, as a slot carries it: the writer's pid, the outbox's fd number there, its
#: inode, its capacity in bytes, and whether it was made for this payload alone.
WHERE = struct.Struct("<qqqq?")
#: Outbox capacities are rounded up to this many bytes, so that sizes that vary a little reuse it.
_GRAIN = 2**20
#: A rank's record when learning: its node key (:func:`node_key`), then its pid.
_RECORD = struct.Struct("<16sQQq")
_NO_KEY = (bytes(16), 0, 0)


class _Outbox:
    """This rank's memfd on one communicator: kept (and mapped, for reuse) or ``once`` (for
    one payload above :data:`KEEP_BYTES`, not mapped here)."""

    def __init__(self, capacity: int, once: bool) -> None:
        self.fd = os.memfd_create("distcomm-objects", os.MFD_CLOEXEC)
        self.map: mmap.mmap | None = None
        try:
            os.fchmod(self.fd, 0o600)  # a memfd starts 0777; /proc's checks come first anyway
            os.ftruncate(self.fd, capacity)
            if not once:
                self.map = mmap.mmap(self.fd, capacity)
        except BaseException:
            os.close(self.fd)
            raise
        self.capacity, self.once = capacity, once
        self.inode = os.fstat(self.fd).st_ino
        self.close = weakref.finalize(self, _close, self.fd, self.map)

    def grow(self, capacity: int) -> None:
        """Make room for ``capacity`` bytes in the same memfd: pages already touched stay."""
        self.close.detach()
        if self.map is not None:
            self.map.close()
        os.ftruncate(self.fd, capacity)
        self.map = mmap.mmap(self.fd, capacity)
        self.capacity = capacity
        self.close = weakref.finalize(self, _close, self.fd, self.map)

    def write(self, pieces: list[tuple[int, Any]], size: int) -> None:
        """Write the payload's ``(offset, bytes)`` pieces (``size`` bytes in all)."""
        if self.map is not None:
            with memoryview(self.map) as view:
                lay_out(view, pieces, size)
            return
        for at, piece in pieces:  # the gaps stay holes, which read as zeros
            while piece.nbytes:
                written = os.pwrite(self.fd, piece, at)
                piece, at = piece[written:], at + written


def _close(fd: int, mapping: mmap.mmap | None) -> None:
    if mapping is not None:
        mapping.close()
    os.close(fd)


@dataclasses.dataclass
class _Peer:
    """A reader's mapping of another rank's outbox, and which outbox it is."""

    pid: int
    inode: int
    map: mmap.mmap


@dataclasses.dataclass
class _Node:
    """What a communicator knows and holds here: whether its ranks share a node (None: not
    learned yet), this rank's outbox, and its mappings of the other ranks' outboxes."""

    local: bool | None = None
    outbox: _Outbox | None = None
    peers: dict[int, _Peer] = dataclasses.field(default_factory=dict)

    def forget(self) -> None:
        """Give back the outbox and every mapping (node memory is off, or the channel gone)."""
        if self.outbox is not None:
            self.outbox.close()
            self.outbox = None
        for peer in self.peers.values():
            peer.map.close()
        self.peers.clear()


_nodes: weakref.WeakKeyDictionary[Any, _Node] = weakref.WeakKeyDictionary()
_nodes_lock = threading.Lock()


def _node(comm: BaseCommunicator) -> _Node:
    """``comm``'s state, made at first use; it goes with ``comm`` (a weak key)."""
    with _nodes_lock:
        node = _nodes.get(comm)
        if node is None:
            node = _nodes[comm] = _Node()
            weakref.finalize(comm, node.forget)
        return node


def local(comm: BaseCommunicator) -> bool | None:
    """Whether ``comm``'s ranks share a node, as learned; None before :func:`learn`."""
    node = _nodes.get(comm)
    return None if node is None else node.local


def node_key() -> tuple[bytes, int, int]:
    """This process's node: the kernel's boot id, the inode of its pid namespace and its user;
    :data:`_NO_KEY` where one cannot be read or memfds do not exist (such a rank never shares)."""
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as file:
            boot = bytes.fromhex(file.read().strip().replace("-", ""))
        namespace = os.stat("/proc/self/ns/pid").st_ino
    except (OSError, ValueError):
        return _NO_KEY
    if len(boot) != 16 or not hasattr(os, "memfd_create"):
        return _NO_KEY
    return boot, namespace, os.geteuid()


def neighbours(
    all_gather: Callable[[bytearray, bytearray], Any], world: int
) -> tuple[bool, list[int]]:
    """Collective (``all_gather(output, mine)``, blocking, over ``world`` ranks): whether every
    rank has this node's key (:func:`node_key`, a readable one), and each rank's pid."""
    every = bytearray(_RECORD.size * world)
    all_gather(every, bytearray(_RECORD.pack(*node_key(), os.getpid())))
    records = [_RECORD.unpack_from(every, r * _RECORD.size) for r in range(world)]
    keys = {record[:3] for record in records}
    return len(keys) == 1 and _NO_KEY not in keys, [record[3] for record in records]


def learn(comm: BaseCommunicator) -> bool:
    """Collective: whether every rank of ``comm`` is its own process on this node (one
    all-gather of node keys and pids, :func:`neighbours`); remembered for ``comm``."""
    world = comm.world_size
    same, pids = neighbours(
        lambda every, mine: comm._call(comm._all_gather_into, False, every, mine), world
    )
    _node(comm).local = same and len(set(pids)) == world
    return bool(_node(comm).local)


def publish(comm: BaseCommunicator, size: int, pieces: list[tuple[int, Any]]) -> bytes | None:
    """Write a payload of ``size`` bytes (its ``(offset, bytes)`` pieces) into this rank's
    outbox; return where it is (:data:`WHERE`), or None where no outbox could be made (the
    caller sends the payload through the engine instead)."""
    node = _node(comm)
    once = size > KEEP_BYTES
    capacity = size if once else -(-size // _GRAIN) * _GRAIN
    box = node.outbox
    try:
        if box is None or box.once or once:
            if box is not None:
                box.close()
                node.outbox = None
            box = node.outbox = _Outbox(capacity, once)
        elif box.capacity < size:
            box.grow(capacity)
        box.write(pieces, size)
    except OSError as exc:
        logger.info("node memory: no outbox of %d bytes (%s): the engine sends it", size, exc)
        if node.outbox is not None:
            node.outbox.close()
            node.outbox = None
        return None
    return WHERE.pack(os.getpid(), box.fd, box.inode, box.capacity, box.once)


def fetch(
    comm: BaseCommunicator, wanted: dict[int, tuple[bytes, int]], allocate: Callable[[int], Any]
) -> dict[int, Any] | None:
    """Collective: the payload of each rank in ``wanted`` (rank -> where, size), copied into
    memory of this rank's own (``allocate(size)``) from a kept outbox, mapped copy-on-write from
    an outbox made for it; then :func:`agree`. The payloads by rank, or None if a rank could
    not read one: node memory is then off and the caller uses the engine."""
    got: dict[int, Any] = {}
    for rank, (where, size) in wanted.items():
        payload = _read(_node(comm), rank, where, size, allocate)
        if payload is None:
            break
        got[rank] = payload
    return got if agree(comm, len(got) == len(wanted)) else None


def _read(node: _Node, rank: int, where: bytes, size: int, allocate: Callable[[int], Any]) -> Any:
    """Rank ``rank``'s payload at ``where`` (module docstring); None where its outbox cannot be
    opened or read (the reason is logged)."""
    pid, fd, inode, capacity, once = WHERE.unpack(where)
    try:
        if once:
            opened = _opened(pid, fd, inode, size)
            try:
                return mmap.mmap(opened, capacity, access=mmap.ACCESS_COPY)
            finally:
                os.close(opened)
        mapping = _mapping(node, rank, (pid, fd, inode), size)
        payload = allocate(size)
        with memoryview(mapping) as view:
            memoryview(payload)[:] = view[:size]
        return payload
    except (OSError, ValueError, MemoryError) as exc:  # the vote then tells every rank
        logger.info("node memory: cannot read rank %d's outbox (%s)", rank, exc)
        return None


def _mapping(node: _Node, rank: int, outbox: tuple[int, int, int], size: int) -> mmap.mmap:
    """A read-only mapping of rank ``rank``'s kept ``outbox`` (pid, fd, inode) that holds
    ``size`` bytes: the one kept from before when it is still that outbox and large enough."""
    pid, fd, inode = outbox
    peer = node.peers.get(rank)
    if peer is not None and (peer.pid, peer.inode) == (pid, inode) and len(peer.map) >= size:
        return peer.map
    if peer is not None:
        node.peers.pop(rank).map.close()
    opened = _opened(pid, fd, inode, size)
    try:
        mapping = mmap.mmap(opened, os.fstat(opened).st_size, prot=mmap.PROT_READ)
    finally:
        os.close(opened)
    node.peers[rank] = _Peer(pid, inode, mapping)
    return mapping


def _opened(pid: int, fd: int, inode: int, size: int) -> int:
    """A read-only fd of the outbox that fd ``fd`` of process ``pid`` is, if it is the one
    announced (``inode``) and holds ``size`` bytes."""
    opened = os.open(f"/proc/{pid}/fd/{fd}", os.O_RDONLY | os.O_CLOEXEC)
    seen = os.fstat(opened)
    if seen.st_ino != inode or seen.st_size < size:
        os.close(opened)
        raise OSError(f"/proc/{pid}/fd/{fd} is not the outbox it announced")
    return opened


def agree(comm: BaseCommunicator, ok: bool) -> bool:
    """Collective, after the readers read: whether every rank did (``ok`` is this rank's
    word). Only then may writers reuse their kept outboxes; one made for a single payload is
    closed (its readers hold mappings of their own). If a rank could not read, node memory is
    off for ``comm`` from now on, and False tells the caller to use the engine."""
    votes = bytearray(comm.world_size)
    comm._call(comm._all_gather_into, False, votes, bytearray([ok]))
    node = _node(comm)
    if all(votes):
        if node.outbox is not None and node.outbox.once:  # readers hold their own mappings
            node.outbox.close()
            node.outbox = None
        return True
    failed = [r for r, vote in enumerate(votes) if not vote]
    logger.info("node memory: off for this communicator (ranks %s could not read)", failed)
    node.local = False
    node.forget()
    return False
