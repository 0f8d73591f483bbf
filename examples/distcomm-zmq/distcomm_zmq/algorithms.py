"""The collectives, written over one communicator's point-to-point messages (:class:`Link`).

Small payloads (below :data:`RING_FROM` bytes) take one round: each rank sends to every other at
once and combines what it receives in rank order, so that every rank computes the same bits. Large
all-reduces and all-gathers go around a ring (reduce-scatter, then all-gather: each rank sends and
receives ``2 (n - 1) / n`` of the data, whatever the number of ranks); broadcasts go down a
binomial tree, barriers through ``log2 n`` rounds of dissemination. Every algorithm works on flat
numpy views of the caller's memory (:func:`as_numpy`): nothing is copied to be sent.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from distcomm.backend import adapter_for
from distcomm.protocol import ReduceOp

__all__ = [
    "RING_FROM",
    "Link",
    "all_gather",
    "all_reduce",
    "all_to_all",
    "as_numpy",
    "barrier",
    "broadcast",
    "gather",
    "reduce",
    "reduce_scatter",
    "scatter",
]

#: From this many bytes, all-reduces and all-gathers go around the ring.
RING_FROM = 256 * 1024


class Link:
    """What an algorithm needs of a communicator: ``rank``, ``size``, ``send(dst, array)`` (a
    contiguous array, sent without a copy when large: not to be written until :meth:`settle`),
    ``recv(src)`` (the next message from ``src`` in this operation, a read-only bytes view) and
    ``settle()`` (wait until every array sent so far may be written again; the operation's end
    settles too)."""

    rank: int
    size: int

    def send(self, dst: int, data: Any) -> None:
        raise NotImplementedError

    def recv(self, src: int) -> memoryview:
        raise NotImplementedError

    def settle(self) -> None:
        raise NotImplementedError


def as_numpy(x: Any) -> np.ndarray:
    """A flat numpy view of ``x``'s memory: a numpy array, a CPU torch tensor, a bytearray."""
    if isinstance(x, np.ndarray):
        return x.reshape(-1)
    if isinstance(x, (bytearray, memoryview)):
        return np.frombuffer(x, dtype=np.uint8)
    return np.asarray(x.detach().numpy()).reshape(-1)  # a torch CPU tensor: shares its memory


def _combine(acc: np.ndarray, other: np.ndarray, op: ReduceOp) -> None:
    """``acc = acc (op) other`` in place: the kit's numpy adapter (bool data as logic)."""
    adapter_for(acc).combine_(acc, other, op)


def _combine_in_order(out: np.ndarray, parts: list[np.ndarray], op: ReduceOp) -> None:
    """``out = parts[0] (op) parts[1] (op) ...``: the same bits on every rank that does it."""
    out[...] = parts[0]
    for part in parts[1:]:
        _combine(out, part, op)


def _incoming(link: Link, src: int, like: np.ndarray) -> np.ndarray:
    return np.frombuffer(link.recv(src), dtype=like.dtype)


def _chunks(n: int, parts: int) -> list[slice]:
    """``parts`` contiguous slices covering ``range(n)``, as even as can be."""
    bounds = [n * p // parts for p in range(parts + 1)]
    return [slice(bounds[p], bounds[p + 1]) for p in range(parts)]


def all_reduce(link: Link, x: np.ndarray, op: ReduceOp) -> None:
    """Reduce ``x`` in place on every rank."""
    n, me = link.size, link.rank
    if x.nbytes < RING_FROM or x.size < n:
        for peer in range(n):
            if peer != me:
                link.send(peer, x)
        parts = [x.copy() if r == me else _incoming(link, r, x) for r in range(n)]
        link.settle()  # x was sent: now it may be written
        _combine_in_order(x, parts, op)
        return
    _ring_reduce_scatter(link, x, op)
    _ring_all_gather(link, x)


def _ring_reduce_scatter(link: Link, x: np.ndarray, op: ReduceOp) -> list[slice]:
    """After it, chunk ``r`` of ``x`` holds the reduction on rank ``r`` (other chunks: partial)."""
    n, me = link.size, link.rank
    chunks = _chunks(x.size, n)
    right, left = (me + 1) % n, (me - 1) % n
    for step in range(n - 1):
        send = chunks[(me - step - 1) % n]
        take = chunks[(me - step - 2) % n]
        link.send(right, x[send].copy())  # the all-gather writes this chunk again
        _combine(x[take], _incoming(link, left, x), op)
    return chunks


def _ring_all_gather(link: Link, x: np.ndarray) -> None:
    """Rank ``r`` holds chunk ``r`` of ``x``; after it every rank holds every chunk."""
    n, me = link.size, link.rank
    chunks = _chunks(x.size, n)
    right, left = (me + 1) % n, (me - 1) % n
    for step in range(n - 1):
        link.send(right, x[chunks[(me - step) % n]])
        x[chunks[(me - step - 1) % n]] = _incoming(link, left, x)


def reduce_scatter(link: Link, out: np.ndarray, x: np.ndarray, op: ReduceOp) -> None:
    """Reduce ``x`` (``size`` equal chunks) across ranks; chunk ``rank`` lands in ``out``."""
    n, me = link.size, link.rank
    width = out.size
    if x.nbytes < RING_FROM:
        for peer in range(n):
            if peer != me:
                link.send(peer, x[peer * width : (peer + 1) * width])
        mine = x[me * width : (me + 1) * width]
        parts = [mine if r == me else _incoming(link, r, x) for r in range(n)]
        _combine_in_order(out, parts, op)
        return
    scratch = x.copy()  # the ring's chunks are equal here: chunk r ends, reduced, on rank r
    _ring_reduce_scatter(link, scratch, op)
    out[...] = scratch[me * width : (me + 1) * width]


def all_gather(link: Link, out: np.ndarray, x: np.ndarray) -> None:
    """Every rank's ``x``, in rank order, into ``out`` on every rank."""
    n, me = link.size, link.rank
    width = x.size
    out[me * width : (me + 1) * width] = x
    if out.nbytes < RING_FROM:
        for peer in range(n):
            if peer != me:
                link.send(peer, x)
        for r in range(n):
            if r != me:
                out[r * width : (r + 1) * width] = _incoming(link, r, x)
        return
    right, left = (me + 1) % n, (me - 1) % n
    for step in range(n - 1):
        send, take = (me - step) % n, (me - step - 1) % n
        link.send(right, out[send * width : (send + 1) * width])
        out[take * width : (take + 1) * width] = _incoming(link, left, x)


def broadcast(link: Link, x: np.ndarray, root: int) -> None:
    """``root``'s ``x`` into every rank's, down a binomial tree."""
    n, me = link.size, link.rank
    relative = (me - root) % n
    mask = 1
    while mask < n:  # receive from the parent (the rank that differs in the lowest set bit)
        if relative & mask:
            x[...] = _incoming(link, (me - mask) % n, x)
            break
        mask <<= 1
    mask >>= 1
    while mask > 0:  # send to the children below that bit
        if relative + mask < n:
            link.send((me + mask) % n, x)
        mask >>= 1


def reduce(link: Link, x: np.ndarray, root: int, op: ReduceOp) -> None:
    """Reduce ``x`` into ``root``'s (in rank order); the others' are left as they are."""
    n, me = link.size, link.rank
    if me != root:
        link.send(root, x)
        return
    parts = [x.copy() if r == me else _incoming(link, r, x) for r in range(n)]
    _combine_in_order(x, parts, op)


def gather(link: Link, out: np.ndarray | None, x: np.ndarray, root: int) -> None:
    """Every rank's ``x`` into ``out`` on ``root``, in rank order."""
    n, me = link.size, link.rank
    if me != root:
        link.send(root, x)
        return
    assert out is not None
    width = x.size
    for r in range(n):
        out[r * width : (r + 1) * width] = x if r == me else _incoming(link, r, x)


def scatter(link: Link, out: np.ndarray, full: np.ndarray | None, root: int) -> None:
    """Chunk ``rank`` of ``root``'s ``full`` into every rank's ``out``."""
    n, me = link.size, link.rank
    width = out.size
    if me != root:
        out[...] = _incoming(link, root, out)
        return
    assert full is not None
    for r in range(n):
        if r != me:
            link.send(r, full[r * width : (r + 1) * width])
    out[...] = full[me * width : (me + 1) * width]


def all_to_all(link: Link, out: np.ndarray, x: np.ndarray) -> None:
    """Chunk ``r`` of every rank's ``x`` into chunk ``sender`` of rank ``r``'s ``out``."""
    n, me = link.size, link.rank
    width = x.size // n
    for r in range(n):
        if r != me:
            link.send(r, x[r * width : (r + 1) * width])
    out[me * width : (me + 1) * width] = x[me * width : (me + 1) * width]
    for r in range(n):
        if r != me:
            out[r * width : (r + 1) * width] = _incoming(link, r, x)


def barrier(link: Link) -> None:
    """Return once every rank has entered: ``ceil(log2 n)`` rounds of empty messages."""
    n, me = link.size, link.rank
    distance = 1
    empty = np.zeros(0, dtype=np.uint8)
    while distance < n:
        link.send((me + distance) % n, empty)
        link.recv((me - distance) % n)
        distance <<= 1
