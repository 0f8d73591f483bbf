"""Object collectives, written once over any communicator's byte collectives.

They run on the primitives of the communicator's object channel (a CPU side channel on GPU
engines): the public object collective counts as one operation. Objects are pickled with
protocol 5; out-of-band buffers (numpy arrays, bytearrays, anything
exposing ``PickleBuffer``) are packed after the pickle stream at 64-byte aligned offsets, and the
receiver unpickles them as views of one received buffer: no second copy, and no size limit beyond
memory. Each collective costs two engine operations: the sizes, then the payload.

Payload layout: ``[n: int64][length of each of the n segments: int64 * n][segments, each aligned]``
where segment 0 is the pickle stream and the rest are its out-of-band buffers.
"""

from __future__ import annotations

import functools
import math
import operator
import pickle
import struct
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
    "reduce_numbers",
    "scatter_object",
    "unpack",
]

_ALIGN = 64
_SIZE = struct.Struct("<q")


def _aligned(n: int) -> int:
    return (n + _ALIGN - 1) // _ALIGN * _ALIGN


def pack(obj: Any) -> bytearray:
    """Pickle ``obj`` (protocol 5) with its out-of-band buffers into one bytearray."""
    buffers: list[pickle.PickleBuffer] = []
    try:
        stream = pickle.dumps(obj, protocol=5, buffer_callback=buffers.append)
        segments = [memoryview(stream), *(b.raw() for b in buffers)]
    except BufferError:  # a non-contiguous buffer: pickle it in-band instead
        segments = [memoryview(pickle.dumps(obj, protocol=5))]
    table = _aligned(8 * (len(segments) + 1))
    total = table + sum(_aligned(s.nbytes) for s in segments)
    out = bytearray(total)
    struct.pack_into(f"<q{len(segments)}q", out, 0, len(segments), *(s.nbytes for s in segments))
    offset = table
    for segment in segments:
        out[offset : offset + segment.nbytes] = segment.cast("B")
        offset += _aligned(segment.nbytes)
    return out


def unpack(payload: memoryview) -> Any:
    """Inverse of :func:`pack`; out-of-band buffers stay views of ``payload``."""
    (count,) = _SIZE.unpack_from(payload, 0)
    lengths = struct.unpack_from(f"<{count}q", payload, 8)
    offset = _aligned(8 * (count + 1))
    views = []
    for length in lengths:
        views.append(payload[offset : offset + length])
        offset += _aligned(length)
    return pickle.loads(views[0], buffers=views[1:])


def broadcast_object(comm: BaseCommunicator, obj: Any, src: int) -> Any:
    """``src``'s object on every rank."""
    size = bytearray(8)
    if comm.rank == src:
        payload = pack(obj)
        _SIZE.pack_into(size, 0, len(payload))
    comm._call(comm._broadcast, False, size, src)
    if comm.rank != src:
        payload = bytearray(_SIZE.unpack(size)[0])
    comm._call(comm._broadcast, False, payload, src)
    return obj if comm.rank == src else unpack(memoryview(payload))


def all_gather_object(comm: BaseCommunicator, obj: Any) -> list[Any]:
    """Every rank's object, in rank order, on every rank."""
    payload = pack(obj)
    sizes = _exchange_sizes(comm, len(payload))
    width = max(sizes)
    payload.extend(bytes(width - len(payload)))
    out = bytearray(width * comm.world_size)
    comm._call(comm._all_gather_into, False, out, payload)
    return _unpack_all(out, sizes, width)


def gather_object(comm: BaseCommunicator, obj: Any, dst: int) -> list[Any] | None:
    """Every rank's object on ``dst``; None elsewhere."""
    payload = pack(obj)
    sizes = _exchange_sizes(comm, len(payload))
    width = max(sizes)
    payload.extend(bytes(width - len(payload)))
    out = bytearray(width * comm.world_size) if comm.rank == dst else None
    comm._call(comm._gather, False, out, payload, dst)
    return None if out is None else _unpack_all(out, sizes, width)


def scatter_object(comm: BaseCommunicator, objs: Sequence[Any] | None, src: int) -> Any:
    """``objs[rank]`` from ``src`` on every rank."""
    size = bytearray(8)
    full: bytearray | None = None
    if comm.rank == src:
        assert objs is not None
        payloads = [pack(o) for o in objs]
        width = max(len(p) for p in payloads)
        full = bytearray(width * len(payloads))
        for r, p in enumerate(payloads):
            full[r * width : r * width + len(p)] = p
        _SIZE.pack_into(size, 0, width)
    comm._call(comm._broadcast, False, size, src)
    mine = bytearray(_SIZE.unpack(size)[0])
    comm._call(comm._scatter, False, mine, full, src)
    return unpack(memoryview(mine))


def check_scatter_list(objs: Any, world_size: int) -> None:
    """Raise unless ``objs`` is a sequence with one object per rank."""
    if not isinstance(objs, Sequence) or isinstance(objs, (str, bytes)) or len(objs) != world_size:
        got = len(objs) if isinstance(objs, Sequence) else type(objs).__name__
        raise InvalidArgumentError(
            f"scatter_object: the source rank must pass a list of {world_size} objects (one per "
            f"rank), got {got!r}. HINT: on src, pass one object per rank, e.g. "
            "[obj_for(r) for r in range(world_size)]; other ranks may pass None."
        )


def _exchange_sizes(comm: BaseCommunicator, size: int) -> list[int]:
    mine = bytearray(8)
    _SIZE.pack_into(mine, 0, size)
    every = bytearray(8 * comm.world_size)
    comm._call(comm._all_gather_into, False, every, mine)
    return list(struct.unpack(f"<{comm.world_size}q", every))


def _unpack_all(out: bytearray, sizes: list[int], width: int) -> list[Any]:
    view = memoryview(out)
    return [unpack(view[r * width : r * width + size]) for r, size in enumerate(sizes)]


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
