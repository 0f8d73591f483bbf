"""Object collectives, written once over any communicator's byte collectives.

They run on the primitives of the communicator's object channel (a CPU side channel on GPU
engines): the public object collective counts as one operation. Objects are pickled with
protocol 5; out-of-band buffers (numpy arrays, bytearrays, anything exposing ``PickleBuffer``)
travel beside the pickle stream and the receiver unpickles them as views of received memory: no
second copy, and no size limit beyond memory.

Payload layout (:func:`pack`): ``[head bytes reserved][n: int64][length of each of the n
segments: int64 * n][inline segments, each 64-byte aligned]``. Segment 0 is the pickle stream,
the rest its out-of-band buffers; a negative length marks a *direct* segment, which is not in the
payload but sent on its own straight from the object's memory (a broadcast's large buffers, as
mpi4py's pkl5 does: no packing copy).

The first exchange of each collective is a fixed 2 KiB *slot* per rank carrying the payload's
size and, when it fits, the payload itself: an object of up to about 2 KiB costs one engine
operation; a larger one costs the slot, then the payload (a variable-size all-gather,
``_all_gather_v``, where the engine has one), then its direct buffers. A payload of
:data:`~distcomm._node_memory.NODE_BYTES` or more, when every rank is a process of one node,
waits in its writer's node memory instead (:mod:`~distcomm._node_memory`; broadcast_object,
all_gather_object, gather_object): its slot says where, the readers copy it from there, and a
vote ends the collective (or sends it through the engine where a rank could not read it).
"""

from __future__ import annotations

import functools
import itertools
import math
import operator
import pickle
import struct
import sys
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

from distcomm import _node_memory as node
from distcomm.errors import InvalidArgumentError
from distcomm.protocol import ReduceOp

if TYPE_CHECKING:
    from distcomm.backend.communicator import BaseCommunicator

__all__ = [
    "all_gather_object",
    "broadcast_object",
    "check_scatter_list",
    "gather_object",
    "pack",
    "recv_object",
    "reduce_numbers",
    "scatter_object",
    "send_object",
    "unpack",
]

_ALIGN = 64
_SIZE = struct.Struct("<q")
_PAIR = struct.Struct("<qq")
#: Bytes per rank of a collective's first exchange: the payload's size, then the payload if it fits.
SLOT = 2048
#: Where a payload starts in its slot (the size comes first; 64 keeps the buffers aligned).
HEAD = _ALIGN
#: Buffers (numpy arrays, bytearrays, ...) below this many bytes are pickled in band.
INBAND_BYTES = 1024
#: Out-of-band buffers of at least this many bytes are broadcast on their own, not copied.
DIRECT_BYTES = 256 * 1024
#: A slot's mode, its second int64: the payload comes through the engine (or is in the slot);
#: its writer asks every rank to learn whether they share a node first; or it is in the
#: writer's node memory, whose place (:data:`~distcomm._node_memory.WHERE`) follows at _WHERE.
_PLAIN, _ASK, _SHARED = 0, 1, 2
_WHERE = 16


def _aligned(n: int) -> int:
    return (n + _ALIGN - 1) // _ALIGN * _ALIGN


def _empty(n: int) -> Any:
    """``n`` writable bytes, not zeroed when large and numpy is loaded: numpy reuses freed heap
    memory, while a fresh zeroed ``bytearray`` of 32 MiB costs about 20 ms of page faults here."""
    numpy = sys.modules.get("numpy")
    if numpy is None or n < DIRECT_BYTES:
        return bytearray(n)
    return memoryview(numpy.empty(n, numpy.uint8))


def pack(obj: Any, head: int = 0) -> Any:
    """Pickle ``obj`` into one buffer (a bytearray, or a memoryview when large), ``head`` bytes
    reserved at its start (module docstring)."""
    return Pickled(obj).split(head)[0]


class Pickled:
    """An object pickled with protocol 5: its stream and its out-of-band buffers (the
    *segments*), laid out as a payload on demand, in a buffer of its own (:meth:`split`) or as
    pieces for node memory to write (:meth:`pieces`)."""

    __slots__ = ("segments",)

    def __init__(self, obj: Any) -> None:
        self.segments: list[Any] = [None]  # the stream, once pickled
        try:
            stream = pickle.dumps(obj, protocol=5, buffer_callback=self._out_of_band)
        except BufferError:  # a non-contiguous buffer: pickle it in-band instead
            del self.segments[1:]
            stream = pickle.dumps(obj, protocol=5)
        self.segments[0] = memoryview(stream)

    def _out_of_band(self, buffer: pickle.PickleBuffer) -> bool:
        """Keep a buffer beside the stream; a small one costs less copied into it (True)."""
        raw = buffer.raw()
        if raw.nbytes < INBAND_BYTES:
            return True
        self.segments.append(raw)
        return False

    def size(self, head: int, direct: Sequence[bool] = ()) -> int:
        """The payload's size in bytes, ``head`` included, ``direct`` segments left out."""
        inline = (
            [s for s, d in zip(self.segments, direct, strict=True) if not d] if direct else None
        )
        table = _aligned(8 * (len(self.segments) + 1))
        return head + table + sum(_aligned(s.nbytes) for s in inline or self.segments)

    def split(
        self, head: int = 0, direct_bytes: int | None = None, room: int = 0
    ) -> tuple[Any, int, list[Any]]:
        """The payload, ``head`` bytes reserved at its start, as ``(payload, size, directs)``:
        with ``direct_bytes``, writable out-of-band buffers of at least that size stay out of
        the payload and are returned in order as ``directs``; a payload that fits in ``room``
        bytes is allocated with ``room`` bytes (its ``size`` first ones used)."""
        segments = self.segments
        stream = segments[0].nbytes
        if len(segments) == 1 and head + _ALIGN + stream <= room:  # the common small object
            out = bytearray(room)
            _PAIR.pack_into(out, head, 1, stream)
            out[head + _ALIGN : head + _ALIGN + stream] = segments[0]
            return out, head + _ALIGN + _aligned(stream), []
        direct = [
            direct_bytes is not None and i > 0 and s.nbytes >= direct_bytes and not s.readonly
            for i, s in enumerate(segments)
        ]
        size = self.size(head, direct)
        out = bytearray(room) if size <= room else _empty(size)
        node.lay_out(memoryview(out), self.pieces(head, direct), size, type(out) is bytearray)
        return out, size, [s.cast("B") for s, d in zip(segments, direct, strict=True) if d]

    def pieces(self, head: int, direct: Sequence[bool] = ()) -> list[tuple[int, Any]]:
        """The payload from byte ``head`` on as ``(offset, bytes)`` pieces: the table, then each
        segment (``direct`` ones left out) at its 64-byte aligned offset."""
        flags = [*direct] or [False] * len(self.segments)
        lengths = [-s.nbytes if d else s.nbytes for s, d in zip(self.segments, flags, strict=True)]
        found = [(head, memoryview(struct.pack(f"<q{len(lengths)}q", len(lengths), *lengths)))]
        offset = head + _aligned(8 * (len(lengths) + 1))
        for segment, is_direct in zip(self.segments, flags, strict=True):
            if not is_direct:
                found.append((offset, segment.cast("B")))
                offset += _aligned(segment.nbytes)
        return found


def direct_lengths(payload: memoryview) -> list[int]:
    """The sizes of the direct segments a payload announces (``head`` already cut off)."""
    (count,) = _SIZE.unpack_from(payload, 0)
    return [-n for n in struct.unpack_from(f"<{count}q", payload, 8) if n < 0]


def unpack(payload: memoryview, directs: Sequence[Any] = ()) -> Any:
    """Inverse of :func:`pack` (``head`` cut off); buffers stay views of ``payload``/``directs``."""
    count, first = _PAIR.unpack_from(payload, 0)
    if count == 1:  # the pickle stream alone: the common small object
        return pickle.loads(payload[_ALIGN : _ALIGN + first])
    lengths = struct.unpack_from(f"<{count}q", payload, 8)
    offset = _aligned(8 * (count + 1))
    views: list[Any] = []
    received = iter(directs)
    for length in lengths:
        if length < 0:
            views.append(next(received))
        else:
            views.append(payload[offset : offset + length])
            offset += _aligned(length)
    return pickle.loads(views[0], buffers=views[1:])


def broadcast_object(comm: BaseCommunicator, obj: Any, src: int) -> Any:
    """``src``'s object on every rank: the slot, then the payload from node memory (and the
    vote), or through the engine: the payload if it did not fit, each direct buffer."""
    if comm.rank != src:
        return _broadcast_to(comm, src)
    pickled = Pickled(obj)
    while True:  # a question (then learning), or node memory that a rank could not read
        offer = _offer(comm, pickled, SLOT, DIRECT_BYTES)
        comm._kit_call(comm._broadcast, False, offer.slot, src)
        if offer.mode == _PLAIN:
            break
        if offer.mode == _ASK:
            node.learn(comm)
        elif node.fetch(comm, {}, _empty) is not None:  # every rank has read it
            return obj
    if offer.size > SLOT:
        comm._kit_call(comm._broadcast, False, offer.payload, src)
    for buffer in offer.directs:
        comm._kit_call(comm._broadcast, False, buffer, src)
    return obj


def _broadcast_to(comm: BaseCommunicator, src: int) -> Any:
    """:func:`broadcast_object` on a rank other than ``src``."""
    slot = bytearray(SLOT)
    while True:
        comm._kit_call(comm._broadcast, False, slot, src)
        size, mode = _PAIR.unpack_from(slot, 0)
        if mode == _PLAIN:
            break
        if mode == _ASK:
            node.learn(comm)
            continue
        got = node.fetch(comm, {src: _place(slot)}, _empty)
        if got is not None:
            return unpack(memoryview(got[src])[HEAD:size])
    if size <= SLOT:
        payload = slot
    else:
        payload = _empty(size)
        comm._kit_call(comm._broadcast, False, payload, src)
    view = memoryview(payload)[HEAD:size]
    received = [_empty(n) for n in direct_lengths(view)]
    for buffer in received:
        comm._kit_call(comm._broadcast, False, buffer, src)
    return unpack(view, received)


def all_gather_object(comm: BaseCommunicator, obj: Any) -> list[Any]:
    """Every rank's object, in rank order, on every rank: the slots, the payloads in node
    memory (and the vote), then, when another payload did not fit in its slot, the payloads
    that came through neither, through ``_all_gather_v`` (node memory's send none)."""
    offer, slots, width, sizes, rest, got = _gather_slots(comm, Pickled(obj), True)
    if max(rest) <= width:
        return _objects(sizes, got, memoryview(slots), range(0, len(slots), width))
    out = _empty(sum(rest))
    mine = memoryview(offer.payload if rest[comm.rank] else bytearray())[: rest[comm.rank]]
    comm._kit_call(comm._all_gather_v, False, out, rest, mine)
    return _objects(sizes, got, memoryview(out), itertools.accumulate(rest, initial=0))


def gather_object(comm: BaseCommunicator, obj: Any, dst: int) -> list[Any] | None:
    """Every rank's object on ``dst``; None elsewhere: the slots (all-gathered, so that every
    rank knows what follows), the payloads in node memory (read by ``dst``, and the vote), then
    the others padded to the largest."""
    here = comm.rank == dst
    offer, slots, width, sizes, rest, got = _gather_slots(comm, Pickled(obj), here)
    out: Any = slots
    if max(rest) > width:
        width = max(rest)
        padded = bytearray(width)
        if rest[comm.rank]:
            memoryview(padded)[: offer.size] = memoryview(offer.payload)[: offer.size]
        out = _empty(width * comm.world_size) if here else None
        comm._kit_call(comm._gather, False, out, padded, dst)
    return _objects(sizes, got, memoryview(out), range(0, len(out), width)) if here else None


def scatter_object(comm: BaseCommunicator, objs: Sequence[Any] | None, src: int) -> Any:
    """``objs[rank]`` from ``src`` on every rank."""
    size = bytearray(8)
    full: bytearray | None = None
    if comm.rank == src:
        assert objs is not None
        payloads = [pack(o) for o in objs]
        width = max(len(p) for p in payloads)
        full = bytearray(width * len(payloads))
        view = memoryview(full)
        for r, p in enumerate(payloads):
            view[r * width : r * width + len(p)] = p
        _SIZE.pack_into(size, 0, width)
    comm._kit_call(comm._broadcast, False, size, src)
    mine = bytearray(_SIZE.unpack(size)[0])
    comm._kit_call(comm._scatter, False, mine, full, src)
    return unpack(memoryview(mine))


def send_object(comm: BaseCommunicator, obj: Any, dst: int, tag: int) -> None:
    """``obj`` to ``dst`` as two messages on ``tag``: its size (8 bytes), then its payload."""
    payload = pack(obj)
    size = bytearray(_SIZE.pack(memoryview(payload).nbytes))
    works = [comm._kit_start(comm._isend, "send_object", b, dst, tag) for b in (size, payload)]
    for work in works:
        work.wait()


def recv_object(comm: BaseCommunicator, src: int | None, tag: int) -> Any:
    """The object :func:`send_object` sent from ``src`` (None: whichever sender comes first;
    its payload is then taken from that same sender)."""
    size = bytearray(_SIZE.size)
    first = comm._kit_start(comm._irecv, "recv_object", size, src, tag)
    first.wait()
    sender = src if src is not None else getattr(first, "source", None)
    payload = _empty(_SIZE.unpack(size)[0])
    comm._kit_start(comm._irecv, "recv_object", payload, sender, tag).wait()
    return unpack(memoryview(payload))


def slot_bytes(world_size: int) -> int:
    """Bytes per rank of a gather's first exchange: :data:`SLOT`, less in large worlds (at most
    about 64 KiB in all; from 1024 ranks on, the size alone)."""
    return max(HEAD, min(SLOT, 64 * 1024 // world_size // _ALIGN * _ALIGN))


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
        and comm._node_memory
        and (shared := node.local(comm)) is not False
    ):
        where = None
        if shared:
            where = node.publish(comm, size, pickled.pieces(HEAD))
        if where is not None or shared is None:
            mode = _ASK if where is None else _SHARED
            slot = bytearray(room)
            _PAIR.pack_into(slot, 0, size, mode)
            slot[_WHERE : _WHERE + node.WHERE.size] = where or bytes(node.WHERE.size)
            return _Offer(slot, mode, size)
    payload, size, directs = pickled.split(HEAD, direct_bytes, room)
    _SIZE.pack_into(payload, 0, size)
    return _Offer(payload if size <= room else _slot(payload, room), _PLAIN, size, payload, directs)


def _gather_slots(
    comm: BaseCommunicator, pickled: Pickled, reader: bool
) -> tuple[_Offer, bytearray, int, list[int], list[int], dict[int, Any]]:
    """All-gather the slots and, if ``reader``, read the payloads in node memory: ``(this rank's
    offer, slots, slot width, every rank's payload size, the bytes each still sends (none from
    node memory), payloads read by rank)``. A question makes every rank learn and offer again;
    so does a failed vote (node memory is then off)."""
    width = slot_bytes(comm.world_size)
    slots = bytearray(width * comm.world_size)
    offer = _offer(comm, pickled, width)
    while True:
        comm._kit_call(comm._all_gather_into, False, slots, offer.slot)
        pairs = [_PAIR.unpack_from(slots, at) for at in range(0, len(slots), width)]
        sizes = [n for n, _ in pairs]
        modes = [mode for _, mode in pairs]
        if not any(modes):  # the common case: every payload through the engine
            return offer, slots, width, sizes, sizes, {}
        if _ASK in modes:
            node.learn(comm)
        else:
            got = node.fetch(comm, _places(slots, width, modes) if reader else {}, _empty)
            if got is not None:
                rest = [0 if mode == _SHARED else n for n, mode in pairs]
                return offer, slots, width, sizes, rest, got
        if offer.mode != _PLAIN:
            offer = _offer(comm, pickled, width)


def _places(slots: bytearray, width: int, modes: list[int]) -> dict[int, tuple[bytes, int]]:
    """Where each payload in node memory is and its size, by rank, as the slots say."""
    return {r: _place(slots, r * width) for r, mode in enumerate(modes) if mode == _SHARED}


def _place(slot: bytearray, at: int = 0) -> tuple[bytes, int]:
    return bytes(slot[at + _WHERE : at + _WHERE + node.WHERE.size]), _SIZE.unpack_from(slot, at)[0]


def _objects(
    sizes: list[int], got: dict[int, Any], view: memoryview, starts: Iterable[int]
) -> list[Any]:
    """Every rank's object: rank r's read from node memory (``got``), else its payload in
    ``view``, which starts at the r-th of ``starts``."""
    if not got:
        return [unpack(view[at + HEAD : at + n]) for n, at in zip(sizes, starts, strict=False)]
    return [
        unpack(memoryview(got[r])[HEAD:n]) if r in got else unpack(view[at + HEAD : at + n])
        for r, (n, at) in enumerate(zip(sizes, starts, strict=False))
    ]


def check_scatter_list(objs: Any, world_size: int) -> None:
    """Raise unless ``objs`` is a sequence with one object per rank."""
    if not isinstance(objs, Sequence) or isinstance(objs, (str, bytes)) or len(objs) != world_size:
        got = len(objs) if isinstance(objs, Sequence) else type(objs).__name__
        raise InvalidArgumentError(
            f"scatter_object: the source rank must pass a list of {world_size} objects (one per "
            f"rank), got {got!r}. HINT: on src, pass one object per rank, e.g. "
            "[obj_for(r) for r in range(world_size)]; other ranks may pass None."
        )


def reduce_numbers(values: list[Any], op: ReduceOp) -> int | float:
    """Reduce Python numbers exactly (ints stay ints; bools follow the logical rules)."""
    if all(isinstance(v, bool) for v in values):
        if op is ReduceOp.AVG:
            raise InvalidArgumentError("ReduceOp.AVG needs numbers, got bools. HINT: use SUM.")
        if op is ReduceOp.BXOR:
            return bool(functools.reduce(operator.xor, values))
        return any(values) if op in (ReduceOp.SUM, ReduceOp.MAX, ReduceOp.BOR) else all(values)
    if op in (ReduceOp.BAND, ReduceOp.BOR, ReduceOp.BXOR) and any(
        isinstance(v, float) for v in values
    ):
        raise InvalidArgumentError(
            f"ReduceOp.{op.name} needs ints or bools, got {values!r}. HINT: convert the values "
            "with int(), or use SUM, PRODUCT, MIN, MAX or AVG."
        )
    result: int | float = _NUMBER_OPS[op](values)
    return result


_NUMBER_OPS: dict[ReduceOp, Callable[[list[Any]], Any]] = {
    ReduceOp.SUM: sum,
    ReduceOp.AVG: lambda values: sum(values) / len(values),
    ReduceOp.PRODUCT: math.prod,
    ReduceOp.MIN: min,
    ReduceOp.MAX: max,
    ReduceOp.BAND: lambda values: functools.reduce(operator.and_, values),
    ReduceOp.BOR: lambda values: functools.reduce(operator.or_, values),
    ReduceOp.BXOR: lambda values: functools.reduce(operator.xor, values),
}
