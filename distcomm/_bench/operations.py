"""What ``distcomm bench`` times: each operation's buffers and its distcomm call (nccl-tests'
bus bandwidth factors are in :mod:`distcomm._measures`, shared with ``distcomm.profile``).

Sizes follow nccl-tests: ``size`` is the operation's whole buffer (all_reduce, broadcast and
reduce: the tensor; all_gather and gather: the gathered output, each rank giving ``size / n``;
reduce_scatter and scatter: the input, each rank keeping ``size / n``; all_to_all: the input).
gather and scatter have root 0, whose list is views of one buffer (which the engine's own call,
with ``--compare raw``, receives or sends as it is). Object collectives carry a numpy uint8
array in a dict, sized the same way. Bus bandwidth = algbw x factor, algbw = bytes / time.

barrier has no buffer and no size: one barrier per call. sendrecv is a ping-pong of ``size``
bytes between ranks 0 and 1 (rank 0 sends then receives, rank 1 receives then sends, the others
idle): one call is a round trip, which counts as two messages (:attr:`Prepared.units`), so its
time is half a round trip, the one-way latency, as OSU's osu_latency reports it.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

from distcomm import _operations

__all__ = ["OPERATIONS", "Operation", "Prepared", "prepare"]


@dataclasses.dataclass(frozen=True)
class Operation:
    """One operation ``distcomm bench`` knows."""

    name: str
    #: "tensor" (float32 buffers), "object" (a dict holding a byte array) or "none" (barrier)
    kind: str
    #: each rank's share is ``size / n`` (gathers, scatters, all_to_all)
    split: bool
    #: its name in ``Capabilities.ops`` (whether the engine runs it natively)
    capability: str

    @property
    def sized(self) -> bool:
        """Whether it moves a buffer of the sizes asked for (barrier does not: one record)."""
        return self.kind != "none"

    @property
    def pairwise(self) -> bool:
        """Whether it is point-to-point between ranks 0 and 1 (needs 2 ranks, and p2p)."""
        return self.name == "sendrecv"


def _kind(op: _operations.Operation) -> str:
    return "object" if op.objects else "none" if op.bench == "barrier" else "tensor"


#: The operations bench times, by bench's name of them (the table in distcomm._operations).
OPERATIONS: dict[str, Operation] = {
    op.bench: Operation(op.bench, _kind(op), op.shared, op.capability)
    for op in _operations.OPERATIONS
    if op.bench
}


@dataclasses.dataclass
class Prepared:
    """An operation's buffers for one size: the arguments, their bytes, the distcomm call, and
    the buffers' device (``"cpu"``, ``"cuda:N"``: the clock waits for a CUDA device's work)."""

    args: tuple[Any, ...]
    nbytes: int
    call: Callable[[], object]
    device: str = "cpu"
    #: what one call counts as: a time per call is divided by it (sendrecv: a round trip, 2
    #: one-way messages)
    units: int = 1


def prepare(comm: Any, op: Operation, size: int, device: str) -> Prepared:
    """The buffers of ``op`` at ``size`` bytes on this rank, and distcomm's call on them. The
    args are what ``_native_call`` is given: barrier ``()``, sendrecv ``(x, y)`` (sent, received
    into), the others as distcomm's method takes them."""
    from distcomm.backend.arrays import adapter_for

    n = comm.world_size
    if op.kind == "object":
        return _prepare_object(comm, op, size)
    unit = n if op.split else 1
    count = max(unit, size // 4 // unit * unit)  # float32 elements, a multiple of n if split
    part = count // n if op.split else count
    make = _torch_maker(device) if device == "cuda" or "numpy" not in _libraries() else _numpy
    if op.kind == "none":  # barrier: no buffer; a probe for the device whose clock it reads
        probe = make(1)
        return Prepared((), 0, comm.barrier, adapter_for(probe).device(probe))
    if op.name in ("gather", "scatter"):
        return _prepare_rooted(comm, op, make, count, part)
    if op.name == "sendrecv":
        return _prepare_ping_pong(comm, make, count)
    x = make(count if op.name in ("reduce_scatter", "all_to_all") else part)
    out = make(part if op.name == "reduce_scatter" else count)
    calls: dict[str, tuple[tuple[Any, ...], Callable[[], object]]] = {
        "all_reduce": ((x,), lambda: comm.all_reduce(x)),
        "broadcast": ((x,), lambda: comm.broadcast(x, 0)),
        "reduce": ((x,), lambda: comm.reduce(x, 0)),
        "all_gather": ((out, x), lambda: comm.all_gather_into_tensor(out, x)),
        "reduce_scatter": ((out, x), lambda: comm.reduce_scatter_tensor(out, x)),
        "all_to_all": ((out, x), lambda: comm.all_to_all_single(out, x)),
    }
    args, call = calls[op.name]
    return Prepared(args, count * 4, call, adapter_for(x).device(x))


def _prepare_rooted(
    comm: Any, op: Operation, make: Callable[[int], Any], count: int, part: int
) -> Prepared:
    """gather (into root 0) and scatter (from it): each rank's ``part`` elements, and on the
    root one buffer of ``count`` whose chunks are the list distcomm is given."""
    from distcomm.backend.arrays import adapter_for

    mine = make(part)
    full = make(count) if comm.rank == 0 else None
    parts = (
        None if full is None else [full[r * part : (r + 1) * part] for r in range(comm.world_size)]
    )
    method = comm.gather if op.name == "gather" else comm.scatter
    call = functools.partial(method, mine, parts, 0)
    return Prepared((mine, full), count * 4, call, adapter_for(mine).device(mine))


def _prepare_ping_pong(comm: Any, make: Callable[[int], Any], count: int) -> Prepared:
    """sendrecv: rank 0 sends its ``x`` to rank 1, which receives it into its ``y`` and sends
    its ``x`` back into rank 0's ``y``; one call is that round trip, 2 messages. The other ranks
    have nothing to do."""
    from distcomm.backend.arrays import adapter_for

    x, y = make(count), make(count)

    def ping() -> object:
        comm.send(x, 1)
        return comm.recv(y, 1)

    def pong() -> object:
        comm.recv(y, 0)
        return comm.send(x, 0)

    call = {0: ping, 1: pong}.get(comm.rank, _idle)
    return Prepared((x, y), count * 4, call, adapter_for(x).device(x), units=2)


def _idle() -> None:
    """A rank outside sendrecv's pair: nothing to do."""


def _prepare_object(comm: Any, op: Operation, size: int) -> Prepared:
    n = comm.world_size
    each = max(1, size // n) if op.split else size
    obj = {"rank": comm.rank, "data": _bytes(each, comm.rank)}
    if op.name == "scatter_object":
        objs = [{"rank": r, "data": _bytes(each, r)} for r in range(n)] if comm.rank == 0 else None
        return Prepared((objs,), each * n, lambda: comm.scatter_object(objs, 0))
    calls: dict[str, Callable[[], object]] = {
        "all_gather_object": lambda: comm.all_gather_object(obj),
        "broadcast_object": lambda: comm.broadcast_object(obj, 0),
        "gather_object": lambda: comm.gather_object(obj, 0),
    }
    return Prepared((obj,), each * (n if op.split else 1), calls[op.name])


@functools.cache
def _libraries() -> frozenset[str]:
    import importlib.util

    return frozenset(n for n in ("numpy", "torch") if importlib.util.find_spec(n) is not None)


def _numpy(count: int) -> Any:
    import numpy

    return numpy.zeros(count, dtype=numpy.float32)


def _torch_maker(device: str) -> Callable[[int], Any]:
    import torch

    where = torch.device("cuda", torch.cuda.current_device()) if device == "cuda" else "cpu"
    return lambda count: torch.zeros(count, dtype=torch.float32, device=where)


def _bytes(count: int, rank: int) -> Any:
    if "numpy" not in _libraries():
        return bytearray([rank % 256]) * count
    import numpy

    return numpy.full(count, rank % 256, dtype=numpy.uint8)
