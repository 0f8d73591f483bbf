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
``_all_gather_v``, where the engine has one), then its direct buffers.
"""

from __future__ import annotations

import functools
import math
import operator
import pickle
import struct
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

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
    return split(obj, head)[0]


def split(
    obj: Any, head: int = 0, direct_bytes: int | None = None, room: int = 0
) -> tuple[Any, int, list[Any]]:
    """:func:`pack`, returning ``(payload, size, directs)``: with ``direct_bytes``, writable
    out-of-band buffers of at least that size stay out of the payload and are returned in order
    as ``directs``; a payload that fits in ``room`` bytes is allocated with ``room`` bytes (its
    ``size`` first ones used)."""
    buffers: list[pickle.PickleBuffer] = []

    def out_of_band(buffer: pickle.PickleBuffer) -> bool:
        if buffer.raw().nbytes < INBAND_BYTES:
            return True  # in band: a small buffer costs less copied than sent beside
        buffers.append(buffer)
        return False

    try:
        stream = pickle.dumps(obj, protocol=5, buffer_callback=out_of_band)
    except BufferError:  # a non-contiguous buffer: pickle it in-band instead
        stream, buffers = pickle.dumps(obj, protocol=5), []
    if not buffers and head + _ALIGN + len(stream) <= room:  # the common small object
        out = bytearray(room)
        _PAIR.pack_into(out, head, 1, len(stream))
        out[head + _ALIGN : head + _ALIGN + len(stream)] = stream
        return out, head + _ALIGN + _aligned(len(stream)), []
    segments = [memoryview(stream), *(b.raw() for b in buffers)]
    direct = [
        direct_bytes is not None and i > 0 and s.nbytes >= direct_bytes and not s.readonly
        for i, s in enumerate(segments)
    ]
    table = _aligned(8 * (len(segments) + 1))
    size = (
        head
        + table
        + sum(_aligned(s.nbytes) for s, d in zip(segments, direct, strict=True) if not d)
    )
    out = bytearray(room) if size <= room else _empty(size)
    view = memoryview(out)
    if type(out) is not bytearray:  # not zeroed: no stale memory in the head and table
        view[: head + table] = bytes(head + table)
    lengths = [-s.nbytes if d else s.nbytes for s, d in zip(segments, direct, strict=True)]
    struct.pack_into(f"<q{len(segments)}q", out, head, len(segments), *lengths)
    offset = head + table
    for segment, is_direct in zip(segments, direct, strict=True):
        if not is_direct:  # a memoryview copy: a bytearray slice assignment is ten times slower
            end = offset + segment.nbytes
            view[offset:end] = segment.cast("B")
            offset = _aligned(end)
            if type(out) is not bytearray:
                view[end:offset] = bytes(offset - end)
    return out, size, [s.cast("B") for s, d in zip(segments, direct, strict=True) if d]


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
    """``src``'s object on every rank: the slot, the payload if it did not fit, each direct
    buffer."""
    if comm.rank == src:
        payload, size, sent = split(obj, HEAD, DIRECT_BYTES, SLOT)
        _SIZE.pack_into(payload, 0, size)
        comm._kit_call(comm._broadcast, False, payload if size <= SLOT else _slot(payload), src)
        if size > SLOT:
            comm._kit_call(comm._broadcast, False, payload, src)
        for buffer in sent:
            comm._kit_call(comm._broadcast, False, buffer, src)
        return obj
    slot = bytearray(SLOT)
    comm._kit_call(comm._broadcast, False, slot, src)
    (size,) = _SIZE.unpack_from(slot, 0)
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
    """Every rank's object, in rank order, on every rank: the slots, then (when some payload
    did not fit in its slot) the payloads, through ``_all_gather_v``."""
    payload, size, sizes, slots, width = _gather_slots(comm, obj)
    if max(sizes) <= width:
        return _from_slots(slots, sizes, width)
    out = _empty(sum(sizes))
    comm._kit_call(comm._all_gather_v, False, out, sizes, memoryview(payload)[:size])
    view, at, objs = memoryview(out), 0, []
    for n in sizes:
        objs.append(unpack(view[at + HEAD : at + n]))
        at += n
    return objs


def gather_object(comm: BaseCommunicator, obj: Any, dst: int) -> list[Any] | None:
    """Every rank's object on ``dst``; None elsewhere: the slots (all-gathered, so that every
    rank knows whether a second round follows), then the payloads padded to the largest."""
    payload, size, sizes, slots, width = _gather_slots(comm, obj)
    if max(sizes) <= width:
        return _from_slots(slots, sizes, width) if comm.rank == dst else None
    width = max(sizes)
    padded = bytearray(width)
    memoryview(padded)[:size] = memoryview(payload)[:size]
    out = _empty(width * comm.world_size) if comm.rank == dst else None
    comm._kit_call(comm._gather, False, out, padded, dst)
    if out is None:
        return None
    view = memoryview(out)
    return [unpack(view[r * width + HEAD : r * width + n]) for r, n in enumerate(sizes)]


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
    """The first exchange's message for a payload too large for it: the payload's head (its
    size)."""
    slot = bytearray(width)
    memoryview(slot)[:HEAD] = memoryview(payload)[:HEAD]
    return slot


def _gather_slots(comm: BaseCommunicator, obj: Any) -> tuple[Any, int, list[int], bytearray, int]:
    """Pickle ``obj`` and all-gather the slots: ``(payload, size, every rank's size, slots,
    slot width)``."""
    width = slot_bytes(comm.world_size)
    payload, size, _ = split(obj, HEAD, room=width)
    _SIZE.pack_into(payload, 0, size)
    slots = bytearray(width * comm.world_size)
    comm._kit_call(
        comm._all_gather_into, False, slots, payload if size <= width else _slot(payload, width)
    )
    return (
        payload,
        size,
        [_SIZE.unpack_from(slots, r * width)[0] for r in range(comm.world_size)],
        slots,
        width,
    )


def _from_slots(slots: bytearray, sizes: list[int], width: int) -> list[Any]:
    view = memoryview(slots)
    return [unpack(view[r * width + HEAD : r * width + n]) for r, n in enumerate(sizes)]


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
