"""Objects as payloads: pickle protocol 5 with out-of-band buffers, laid out in one buffer.

Out-of-band buffers (numpy arrays, bytearrays, anything exposing ``PickleBuffer``) travel beside
the pickle stream and the receiver unpickles them as views of received memory: no second copy,
and no size limit beyond memory.

Payload layout (:func:`pack`): ``[head bytes reserved][n: int64][length of each of the n
segments: int64 * n][inline segments, each 64-byte aligned]``. Segment 0 is the pickle stream,
the rest its out-of-band buffers; a negative length marks a *direct* segment, which is not in the
payload but sent on its own straight from the object's memory (a broadcast's large buffers, as
mpi4py's pkl5 does: no packing copy). A small object (:func:`small_slot`), the commonest, is the
stream alone in a collective's first exchange, its *slot*, made in one pickling and one copy.
"""

from __future__ import annotations

import pickle
import struct
import sys
from collections.abc import Sequence
from typing import Any

from distcomm._unpickling import loads, loads_own

__all__ = [
    "ALIGN",
    "DIRECT_BYTES",
    "HEAD",
    "INBAND_BYTES",
    "PAIR",
    "SIZE",
    "SLOT",
    "SMALL_HEAD",
    "STREAM",
    "Pickled",
    "aligned",
    "direct_lengths",
    "lay_out",
    "empty",
    "join_bytes",
    "pack",
    "small_slot",
    "unpack",
]

ALIGN = 64
SIZE = struct.Struct("<q")
PAIR = struct.Struct("<qq")
#: Bytes per rank of a collective's first exchange: the payload's size, then the payload if it fits.
SLOT = 2048
#: Where a payload starts in its slot (the size comes first; 64 keeps the buffers aligned).
HEAD = ALIGN
#: Buffers (numpy arrays, bytearrays, ...) below this many bytes are pickled in band.
INBAND_BYTES = 1024
#: Out-of-band buffers of at least this many bytes are broadcast on their own, not copied.
DIRECT_BYTES = 256 * 1024
#: Where a small object's stream starts in its slot (after the head and the one-entry table).
STREAM = HEAD + ALIGN
#: A small object's slot up to its stream: the payload's size and mode (the head), then the
#: one-entry table (1, the stream's length), each zero-padded to :data:`ALIGN`.
SMALL_HEAD = struct.Struct(f"<qq{HEAD - 16}xqq{ALIGN - 16}x")
#: Zero bytes to pad a small object's slot with, up to the widest slot.
_ZEROS = memoryview(bytes(SLOT))


def aligned(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


def empty(n: int) -> Any:
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
        table = aligned(8 * (len(self.segments) + 1))
        return head + table + sum(aligned(s.nbytes) for s in inline or self.segments)

    def split(
        self, head: int = 0, direct_bytes: int | None = None, room: int = 0
    ) -> tuple[Any, int, list[Any]]:
        """The payload, ``head`` bytes reserved at its start, as ``(payload, size, directs)``:
        with ``direct_bytes``, writable out-of-band buffers of at least that size stay out of
        the payload and are returned in order as ``directs``; a payload that fits in ``room``
        bytes is allocated with ``room`` bytes (its ``size`` first ones used)."""
        segments = self.segments
        stream = segments[0].nbytes
        if len(segments) == 1 and head + ALIGN + stream <= room:  # the common small object
            out = bytearray(room)
            PAIR.pack_into(out, head, 1, stream)
            out[head + ALIGN : head + ALIGN + stream] = segments[0]
            return out, head + ALIGN + aligned(stream), []
        direct = [
            direct_bytes is not None and i > 0 and s.nbytes >= direct_bytes and not s.readonly
            for i, s in enumerate(segments)
        ]
        size = self.size(head, direct)
        out = bytearray(room) if size <= room else empty(size)
        lay_out(memoryview(out), self.pieces(head, direct), size, type(out) is bytearray)
        return out, size, [s.cast("B") for s, d in zip(segments, direct, strict=True) if d]

    def pieces(self, head: int, direct: Sequence[bool] = ()) -> list[tuple[int, Any]]:
        """The payload from byte ``head`` on as ``(offset, bytes)`` pieces: the table, then each
        segment (``direct`` ones left out) at its 64-byte aligned offset."""
        flags = [*direct] or [False] * len(self.segments)
        lengths = [-s.nbytes if d else s.nbytes for s, d in zip(self.segments, flags, strict=True)]
        found = [(head, memoryview(struct.pack(f"<q{len(lengths)}q", len(lengths), *lengths)))]
        offset = head + aligned(8 * (len(lengths) + 1))
        for segment, is_direct in zip(self.segments, flags, strict=True):
            if not is_direct:
                found.append((offset, segment.cast("B")))
                offset += aligned(segment.nbytes)
        return found


def direct_lengths(payload: memoryview) -> list[int]:
    """The sizes of the direct segments a payload announces (``head`` already cut off)."""
    return [-n for n in _table(payload) if n < 0]


def _table(payload: memoryview) -> tuple[int, ...]:
    """A payload's segment lengths (module docstring), checked to fit the payload."""
    (count,) = SIZE.unpack_from(payload, 0)
    if not 0 < count <= payload.nbytes // 8 - 1:
        raise pickle.UnpicklingError(
            f"a broken object payload: its table announces {count} segments in "
            f"{payload.nbytes} bytes"
        )
    return struct.unpack_from(f"<{count}q", payload, 8)


def unpack(
    payload: memoryview, directs: Sequence[Any] = (), sender: int | None = None, own: bool = False
) -> Any:
    """Inverse of :func:`pack` (``head`` cut off); buffers stay views of ``payload``/``directs``.
    Unpickled as :mod:`~distcomm._unpickling` allows (``sender``: the rank it came from), or,
    ``own``: a payload this rank packed itself, in its own memory (never a peer's bytes), as
    :func:`~distcomm._unpickling.loads_own` reads it."""
    load = loads_own if own else loads
    count, first = PAIR.unpack_from(payload, 0)
    if count == 1:  # the pickle stream alone: the common small object
        return load(payload[ALIGN : ALIGN + first], sender=sender)
    lengths = _table(payload)
    offset = aligned(8 * (count + 1))
    views: list[Any] = []
    received = iter(directs)
    for length in lengths:
        if length < 0:
            views.append(next(received))
        else:
            views.append(payload[offset : offset + length])
            offset += aligned(length)
    return load(views[0], views[1:], sender)


class _Large(Exception):
    """A buffer too large to pickle in band: the object is not small (:func:`small_slot`)."""


def _in_band(buffer: pickle.PickleBuffer) -> bool:
    if buffer.raw().nbytes >= INBAND_BYTES:
        raise _Large
    return True


def small_slot(obj: Any, room: int) -> tuple[bytearray, bytes] | None:
    """The slot of an object whose pickle stream, with its buffers in band (all below
    :data:`INBAND_BYTES`), fits a slot of ``room`` bytes, and that stream: the slot laid out as
    :meth:`Pickled.split` lays out a stream alone (:data:`SMALL_HEAD`, the stream, zeros), in
    one pickling and one copy; None for any other object (the common objects' way: the few
    bytes of a rank's metadata, a loss)."""
    try:
        stream = pickle.dumps(obj, protocol=5, buffer_callback=_in_band)
    except (_Large, BufferError):
        return None
    n = len(stream)
    if n > room - STREAM:
        return None
    head = SMALL_HEAD.pack(STREAM + aligned(n), 0, 1, n)
    return join_bytes((head, stream, _ZEROS[: room - STREAM - n])), stream


#: Buffers joined into one new bytearray (one allocation, one copy each): slots, whole.
join_bytes = bytearray().join


def lay_out(
    view: memoryview, pieces: list[tuple[int, Any]], size: int, zeroed: bool = False
) -> None:
    """Copy each ``(offset, bytes)`` piece of a payload into ``view``, and zero the gaps up to
    ``size`` unless ``view`` already is zero (no stale memory goes out): node memory's kept
    outbox, and the payloads the engine sends."""
    end = 0
    for at, piece in pieces:
        if not zeroed:
            view[end:at] = bytes(at - end)
        end = at + piece.nbytes
        view[at:end] = piece  # a memoryview copy: a bytearray slice assignment is ten times slower
    if not zeroed:
        view[end:size] = bytes(size - end)
