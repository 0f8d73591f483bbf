"""mpi4py's own calls for the distcomm operations, for ``distcomm bench --compare raw``
(:meth:`MpiEngine.native_call`): the same buffers, mpi4py's API, no distcomm layer.
Object collectives use mpi4py's pickle-based lower-case methods."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from mpi4py import MPI

__all__ = ["native_call"]


def native_call(comm: Any, op: str, args: tuple[Any, ...]) -> Callable[[], object] | None:
    """A zero-argument callable running ``op`` with mpi4py on ``comm``, or None."""
    if any(_is_device_tensor(a) for a in args):
        return None  # a GPU buffer: mpi4py's CUDA path is not what the benchmark compares
    buffers = [_host(a) for a in args] if op in _TENSOR_OPS else list(args)
    make = _CALLS.get(op)
    return None if make is None else make(comm, *buffers)


def _is_device_tensor(x: Any) -> bool:
    return hasattr(x, "is_cpu") and not x.is_cpu


def _host(x: Any) -> Any:
    return x.detach().numpy() if hasattr(x, "detach") else x  # None (a root's buffer) too


def _reduce(c: Any, x: Any) -> Callable[[], object]:
    if c.rank == 0:
        return lambda: c.Reduce(MPI.IN_PLACE, x, MPI.SUM, 0)
    return lambda: c.Reduce(x, None, MPI.SUM, 0)


def _sendrecv(c: Any, x: Any, y: Any) -> Callable[[], object]:
    """bench's ping-pong: rank 0 sends ``x`` to rank 1 and receives into ``y``, rank 1 receives
    then sends; the other ranks have nothing to do."""
    if c.rank == 0:

        def ping() -> object:
            c.Send(x, 1)
            return c.Recv(y, 1)

        return ping
    if c.rank == 1:

        def pong() -> object:
            c.Recv(y, 0)
            return c.Send(x, 0)

        return pong
    return lambda: None


_TENSOR_OPS = frozenset(
    {"all_reduce", "broadcast", "reduce", "all_gather", "reduce_scatter", "all_to_all"}
    | {"gather", "scatter", "sendrecv"}
)
_CALLS: dict[str, Callable[..., Callable[[], object]]] = {
    "all_reduce": lambda c, x: lambda: c.Allreduce(MPI.IN_PLACE, x, MPI.SUM),
    "broadcast": lambda c, x: lambda: c.Bcast(x, 0),
    "reduce": _reduce,
    "gather": lambda c, x, full: lambda: c.Gather(x, full, 0),  # full: None off the root
    "scatter": lambda c, x, full: lambda: c.Scatter(full, x, 0),
    "all_gather": lambda c, out, x: lambda: c.Allgather(x, out),
    "reduce_scatter": lambda c, out, x: lambda: c.Reduce_scatter_block(x, out, MPI.SUM),
    "all_to_all": lambda c, out, x: lambda: c.Alltoall(x, out),
    "barrier": lambda c: lambda: c.Barrier(),
    "sendrecv": _sendrecv,
    "all_gather_object": lambda c, obj: lambda: c.allgather(obj),
    "broadcast_object": lambda c, obj: lambda: c.bcast(obj, 0),
    "gather_object": lambda c, obj: lambda: c.gather(obj, 0),
    "scatter_object": lambda c, objs: lambda: c.scatter(objs, 0),
}
