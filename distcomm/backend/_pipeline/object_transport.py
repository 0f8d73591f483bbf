"""Object collectives, written once over any communicator's byte collectives.

They run on the primitives of the communicator's object channel (a CPU side channel on GPU
engines): the public object collective counts as one operation. Objects travel as payloads
(:mod:`~distcomm._object_codec`: pickle protocol 5, out-of-band buffers beside the stream).

The first exchange of each collective is a fixed 2 KiB *slot* per rank carrying the payload's
size and, when it fits, the payload itself: an object of up to about 2 KiB costs one engine
operation; a larger one costs the slot, then the payload (a variable-size all-gather,
``_all_gather_v``, where the engine has one; scatter_object's payloads padded to the widest),
then its direct buffers. A rank reads its own object back (its part of an all-gather, a gather
or a scatter) from the stream it sent, with plain pickle where the stream names no global
(:func:`~distcomm._unpickling.loads_own`); a peer's, as the object policy allows. A payload of
:data:`~distcomm.backend._pipeline.node_memory.NODE_BYTES` or more, when every rank is a process
of one node, waits in its writer's node memory instead
(:mod:`~distcomm.backend._pipeline.node_memory`; broadcast_object, all_gather_object,
gather_object): its slot says where, the readers copy it from there, and a
vote ends the collective (or sends it through the engine where a rank could not read it).
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

from distcomm import _settings, _unpickling
from distcomm._object_codec import (
    ALIGN,
    DIRECT_BYTES,
    HEAD,
    INBAND_BYTES,
    PAIR,
    SIZE,
    SLOT,
    SMALL_HEAD,
    STREAM,
    Pickled,
    direct_lengths,
    empty,
    join_bytes,
    pack,
    small_slot,
    unpack,
)
from distcomm._unpickling import check_size, loads, loads_own
from distcomm.backend._pipeline import node_memory as node
from distcomm.errors import InvalidArgumentError

if TYPE_CHECKING:
    from distcomm.backend.communicator import BaseCommunicator

__all__ = [
    "DIRECT_BYTES",
    "HEAD",
    "INBAND_BYTES",
    "SLOT",
    "all_gather_object",
    "broadcast_object",
    "check_scatter_list",
    "gather_object",
    "pack",
    "recv_object",
    "scatter_object",
    "send_object",
    "unpack",
]

#: A slot's mode, its second int64: the payload comes through the engine (or is in the slot);
#: its writer asks every rank to learn whether they share a node first; or it is in the
#: writer's node memory, whose place (:data:`~distcomm.backend._pipeline.node_memory.WHERE`)
#: follows at _WHERE.
_PLAIN, _ASK, _SHARED = 0, 1, 2
_WHERE = 16
#: In a scatter_object slot: the widest payload that did not fit its slot (0: every one fit).
_WIDEST = 16


def broadcast_object(comm: BaseCommunicator, obj: Any, src: int) -> Any:
    """``src``'s object on every rank: the slot, then the payload from node memory (and the
    vote), or through the engine: the payload if it did not fit, each direct buffer."""
    if comm.rank != src:
        slot = bytearray(SLOT)
        comm._call(comm._broadcast, False, slot, src)
        size, mode, count, n = SMALL_HEAD.unpack_from(slot)
        if mode == _PLAIN and size <= SLOT and count == 1:  # the stream alone: a small object
            return loads(memoryview(slot)[STREAM : STREAM + n], (), src)
        return _broadcast_to(comm, src, slot)
    small = small_slot(obj, SLOT)
    if small is not None:
        comm._call(comm._broadcast, False, small[0], src)
        return obj
    pickled = Pickled(obj)
    while True:  # a question (then learning), or node memory that a rank could not read
        offer = _offer(comm, pickled, SLOT, DIRECT_BYTES)
        comm._call(comm._broadcast, False, offer.slot, src)
        if offer.mode == _PLAIN:
            break
        if offer.mode == _ASK:
            node.learn(comm)
            continue
        check_size(offer.size, src)  # where the other ranks check it: they refuse it too
        if node.fetch(comm, {}, empty) is not None:  # every rank has read it
            return obj
    # the sizes checked where the other ranks check them (they refuse them too): nobody waits
    check_size(offer.size, src)
    if offer.size > SLOT:
        comm._call(comm._broadcast, False, offer.payload, src)
    check_size(offer.size + sum(d.nbytes for d in offer.directs), src)
    for buffer in offer.directs:
        comm._call(comm._broadcast, False, buffer, src)
    return obj


def _broadcast_to(comm: BaseCommunicator, src: int, slot: bytearray) -> Any:
    """:func:`broadcast_object` on a rank other than ``src``, from its first ``slot`` on, one
    that held no small object: a question (then learning), node memory, or the payload."""
    while True:
        size, mode = PAIR.unpack_from(slot, 0)
        if mode == _PLAIN:
            break
        if mode == _ASK:
            node.learn(comm)
        else:
            check_size(size, src)
            got = node.fetch(comm, {src: _place(slot)}, empty)
            if got is not None:
                return unpack(memoryview(got[src])[HEAD:size], sender=src)
        comm._call(comm._broadcast, False, slot, src)
    check_size(size, src)
    if size <= SLOT:
        payload = slot
    else:
        payload = empty(size)
        comm._call(comm._broadcast, False, payload, src)
    view = memoryview(payload)[HEAD:size]
    lengths = direct_lengths(view)
    check_size(size + sum(lengths), src)
    received = [empty(n) for n in lengths]
    for buffer in received:
        comm._call(comm._broadcast, False, buffer, src)
    return unpack(view, received, src)


def all_gather_object(comm: BaseCommunicator, obj: Any) -> list[Any]:
    """Every rank's object, in rank order, on every rank: the slots, the payloads in node
    memory (and the vote), then, when another payload did not fit in its slot, the payloads
    that came through neither, through ``_all_gather_v`` (node memory's send none)."""
    width = slot_bytes(comm.world_size)
    small = small_slot(obj, width)
    slots = slot = None
    if small is not None:  # the common case: every rank's object small, one all-gather
        slot, stream = small
        slots = bytearray(width * comm.world_size)
        comm._call(comm._all_gather_into, False, slots, slot)
        streams = _small_streams(slots, width)
        if streams is not None:
            return _small_objects(slots, width, streams, comm.rank, stream)
    offer, slots, width, sizes, rest, got = _gather_slots(comm, obj, True, slot, slots)
    if max(rest) <= width:
        starts: Iterable[int] = range(0, len(slots), width)
        return _objects(sizes, got, memoryview(slots), starts, comm.rank, offer.payload)
    out = empty(sum(rest))
    mine = memoryview(offer.payload if rest[comm.rank] else bytearray())[: rest[comm.rank]]
    comm._call(comm._all_gather_v, False, out, rest, mine)
    starts = itertools.accumulate(rest, initial=0)
    return _objects(sizes, got, memoryview(out), starts, comm.rank, offer.payload)


def gather_object(comm: BaseCommunicator, obj: Any, dst: int) -> list[Any] | None:
    """Every rank's object on ``dst``; None elsewhere: the slots (all-gathered, so that every
    rank knows what follows), the payloads in node memory (read by ``dst``, and the vote), then
    the others padded to the largest."""
    here = comm.rank == dst
    width = slot_bytes(comm.world_size)
    small = small_slot(obj, width)
    slots = slot = None
    if small is not None:  # every rank's object small: one all-gather (as all_gather_object)
        slot, stream = small
        slots = bytearray(width * comm.world_size)
        comm._call(comm._all_gather_into, False, slots, slot)
        streams = _small_streams(slots, width)
        if streams is not None:
            return _small_objects(slots, width, streams, dst, stream) if here else None
    offer, slots, width, sizes, rest, got = _gather_slots(comm, obj, here, slot, slots)
    out: Any = slots
    if max(rest) > width:
        width = max(rest)
        padded = bytearray(width)
        if rest[comm.rank]:
            memoryview(padded)[: offer.size] = memoryview(offer.payload)[: offer.size]
        out = empty(width * comm.world_size) if here else None
        comm._call(comm._gather, False, out, padded, dst)
    if not here:
        return None
    return _objects(sizes, got, memoryview(out), range(0, len(out), width), dst, offer.payload)


def scatter_object(comm: BaseCommunicator, objs: Sequence[Any] | None, src: int) -> Any:
    """``objs[rank]`` from ``src`` on every rank: the slots, each holding its payload when it
    fits (:func:`small_slot`); then, when one did not, those payloads padded to the widest, in a
    second scatter (every slot says how wide, so that every rank takes part)."""
    width = slot_bytes(comm.world_size)
    mine = bytearray(width)
    slots = full = own = None
    if comm.rank == src:
        assert objs is not None
        slots, full, own = _scatter_slots(objs, width, src)
    comm._call(comm._scatter, False, mine, slots, src)
    size = SIZE.unpack_from(mine)[0]
    widest = SIZE.unpack_from(mine, _WIDEST)[0]
    check_size(max(size, widest), src)  # widest: the same on every rank, src too: nobody waits
    payload: Any = mine
    if widest:  # the payloads that did not fit their slots, this rank's among them or not
        wide = empty(widest)
        comm._call(comm._scatter, False, wide, full, src)
        payload = wide if size > width else mine
    if own is not None:  # src: its own payload, from what it sent (never a peer's bytes)
        return unpack(own, sender=src, own=True) if size > width else loads_own(own, (), src)
    return unpack(memoryview(payload)[HEAD:size], sender=src)


def _scatter_slots(objs: Sequence[Any], width: int, src: int) -> tuple[bytearray, Any, Any]:
    """``src``'s side of :func:`scatter_object`: every rank's slot, all in one buffer; when a
    payload does not fit its slot, those payloads, each at rank x the widest of them (the rest
    zeros; the slots say how wide), else None; and ``src``'s own stream (it fit) or payload."""
    smalls = [small_slot(obj, width) for obj in objs]
    if all(small is not None for small in smalls):
        return join_bytes([small[0] for small in smalls]), None, smalls[src][1]  # type: ignore[index]
    pickled = {r: Pickled(objs[r]) for r, small in enumerate(smalls) if small is None}
    sizes = {r: p.size(HEAD) for r, p in pickled.items()}
    widest = max(sizes.values())
    full = empty(widest * len(objs))
    view = memoryview(full)
    slots = []
    for r, small in enumerate(smalls):
        if small is None:
            slot = bytearray(width)
            SIZE.pack_into(slot, 0, sizes[r])
        else:
            slot = small[0]
        SIZE.pack_into(slot, _WIDEST, widest)
        slots.append(slot)
        pieces = pickled[r].pieces(HEAD) if r in pickled else []
        node.lay_out(view[r * widest : (r + 1) * widest], pieces, widest)  # zeros the rest
    mine = smalls[src]
    own = mine[1] if mine is not None else view[src * widest + HEAD : src * widest + sizes[src]]
    return join_bytes(slots), full, own


def send_object(comm: BaseCommunicator, obj: Any, dst: int, tag: int) -> None:
    """``obj`` to ``dst`` as two messages on ``tag``: its size (8 bytes), then its payload."""
    payload = pack(obj)
    n = memoryview(payload).nbytes
    size = bytearray(SIZE.pack(n))
    try:
        check_size(n, comm.rank)
    except _unpickling.Refused:  # the receiver refuses it on reading the size: so do we
        comm._start(comm._isend, "send_object", size, dst, tag).wait()
        raise
    works = [comm._start(comm._isend, "send_object", b, dst, tag) for b in (size, payload)]
    for work in works:
        work.wait()


def recv_object(comm: BaseCommunicator, src: int | None, tag: int) -> Any:
    """The object :func:`send_object` sent from ``src`` (None: whichever sender comes first;
    its payload is then taken from that same sender)."""
    size = bytearray(SIZE.size)
    first = comm._start(comm._irecv, "recv_object", size, src, tag)
    first.wait()
    sender = src if src is not None else getattr(first, "source", None)
    n = SIZE.unpack(size)[0]
    check_size(n, sender)
    payload = empty(n)
    comm._start(comm._irecv, "recv_object", payload, sender, tag).wait()
    return unpack(memoryview(payload), sender=sender)


@functools.lru_cache(maxsize=64)
def slot_bytes(world_size: int) -> int:
    """Bytes per rank of a gather's first exchange: :data:`SLOT`, less in large worlds (at most
    about 64 KiB in all; from 1024 ranks on, the size alone)."""
    return max(HEAD, min(SLOT, 64 * 1024 // world_size // ALIGN * ALIGN))


def _slot(payload: Any, width: int = SLOT) -> bytearray:
    """The slot of a payload too large for it: the payload's head (its size)."""
    slot = bytearray(width)
    memoryview(slot)[:HEAD] = memoryview(payload)[:HEAD]
    return slot


class _Offer(NamedTuple):
    """This rank's part of a collective: its slot, mode, payload size, and, when the payload
    goes through the engine, the payload and its direct buffers."""

    slot: Any
    mode: int
    size: int
    payload: Any = None
    directs: Sequence[Any] = ()


def _small_streams(slots: bytearray, width: int) -> list[int] | None:
    """The length of each rank's pickle stream in all-gathered ``slots`` of ``width`` bytes if
    every one is small (:func:`small_slot`: the stream alone, in its slot); None otherwise."""
    streams = []
    head = SMALL_HEAD.unpack_from
    for at in range(0, len(slots), width):
        size, mode, count, n = head(slots, at)
        if mode != _PLAIN or size > width or count != 1:
            return None
        streams.append(n)
    return streams


def _small_objects(
    slots: bytearray, width: int, streams: list[int], rank: int, mine: bytes
) -> list[Any]:
    """Every rank's object from all-gathered ``slots`` of ``width`` bytes, each the stream of
    ``streams``' length in its slot; this rank's own from ``mine``, the stream it sent."""
    view = memoryview(slots)
    found = []
    for r, n in enumerate(streams):
        if r == rank:
            found.append(loads_own(mine, (), r))
        else:
            at = r * width + STREAM
            found.append(loads(view[at : at + n], (), r))
    return found


def _offer(
    comm: BaseCommunicator, pickled: Pickled, room: int, direct_bytes: int | None = None
) -> _Offer:
    """This rank's slot of ``room`` bytes: for a large payload, when the ranks share a node,
    where it is in node memory (written there now), and while that is not known, a question;
    else today's (the payload whole when it fits)."""
    segments = pickled.segments
    size = 0 if len(segments) == 1 and segments[0].nbytes < room else pickled.size(HEAD)
    if (
        size > room
        and size >= node.NODE_BYTES
        and comm.capabilities.node_memory
        and (shared := node.local(comm)) is not False
        and _settings.read("DISTCOMM_NODE_MEMORY") != "off"
    ):
        where = None
        if shared:
            where = node.publish(comm, size, pickled.pieces(HEAD))
        if where is not None or shared is None:
            mode = _ASK if where is None else _SHARED
            slot = bytearray(room)
            PAIR.pack_into(slot, 0, size, mode)
            slot[_WHERE : _WHERE + node.WHERE.size] = where or bytes(node.WHERE.size)
            return _Offer(slot, mode, size)
    payload, size, directs = pickled.split(HEAD, direct_bytes, room)
    SIZE.pack_into(payload, 0, size)
    return _Offer(payload if size <= room else _slot(payload, room), _PLAIN, size, payload, directs)


def _gather_slots(
    comm: BaseCommunicator,
    obj: Any,
    reader: bool,
    small: bytearray | None,
    slots: bytearray | None = None,
) -> tuple[_Offer, bytearray, int, list[int], list[int], dict[int, Any]]:
    """All-gather the slots and, if ``reader``, read the payloads in node memory: ``(this rank's
    offer, slots, slot width, every rank's payload size, the bytes each still sends (none from
    node memory), payloads read by rank)``. ``small``: this rank's slot, if :func:`small_slot`
    made one; ``slots``: what its all-gather gave, if done already. A question makes every rank
    learn and offer again; so does a failed vote (node memory is then off)."""
    width = slot_bytes(comm.world_size)
    pickled = None
    if small is not None:
        offer = _Offer(small, _PLAIN, SIZE.unpack_from(small)[0], small)
    else:
        pickled = Pickled(obj)
        offer = _offer(comm, pickled, width)
    while True:
        if slots is None:
            slots = bytearray(width * comm.world_size)
            comm._call(comm._all_gather_into, False, slots, offer.slot)
        pairs = [PAIR.unpack_from(slots, at) for at in range(0, len(slots), width)]
        sizes = [n for n, _ in pairs]
        biggest = max(sizes)  # every rank has every slot: all refuse alike
        check_size(biggest, sizes.index(biggest))
        modes = [mode for _, mode in pairs]
        if not any(modes):  # the common case: every payload through the engine
            return offer, slots, width, sizes, sizes, {}
        if _ASK in modes:
            node.learn(comm)
        else:
            got = node.fetch(comm, _places(slots, width, modes) if reader else {}, empty)
            if got is not None:
                rest = [0 if mode == _SHARED else n for n, mode in pairs]
                return offer, slots, width, sizes, rest, got
        if offer.mode != _PLAIN:
            assert pickled is not None  # only a pickled object's offer asks or shares
            offer = _offer(comm, pickled, width)
        slots = None


def _places(slots: bytearray, width: int, modes: list[int]) -> dict[int, tuple[bytes, int]]:
    """Where each payload in node memory is and its size, by rank, as the slots say."""
    return {r: _place(slots, r * width) for r, mode in enumerate(modes) if mode == _SHARED}


def _place(slot: bytearray, at: int = 0) -> tuple[bytes, int]:
    return bytes(slot[at + _WHERE : at + _WHERE + node.WHERE.size]), SIZE.unpack_from(slot, at)[0]


def _objects(
    sizes: list[int],
    got: dict[int, Any],
    view: memoryview,
    starts: Iterable[int],
    rank: int,
    mine: Any,
) -> list[Any]:
    """Every rank's object: this rank's own from ``mine``, its payload (None: it went through
    node memory), rank r's read from node memory (``got``), else its payload in ``view``, which
    starts at the r-th of ``starts``."""
    found = []
    for r, (n, at) in enumerate(zip(sizes, starts, strict=False)):
        if r == rank and mine is not None:
            found.append(unpack(memoryview(mine)[HEAD:n], sender=r, own=True))
        elif r in got:
            found.append(unpack(memoryview(got[r])[HEAD:n], sender=r))
        else:
            found.append(unpack(view[at + HEAD : at + n], sender=r))
    return found


def check_scatter_list(objs: Any, world_size: int) -> None:
    """Raise unless ``objs`` is a sequence with one object per rank."""
    if not isinstance(objs, Sequence) or isinstance(objs, (str, bytes)) or len(objs) != world_size:
        got = len(objs) if isinstance(objs, Sequence) else type(objs).__name__
        raise InvalidArgumentError(
            f"scatter_object: the source rank must pass a list of {world_size} objects (one per "
            f"rank), got {got!r}. HINT: on src, pass one object per rank, e.g. "
            "[obj_for(r) for r in range(world_size)]; other ranks may pass None."
        )
