"""torch.distributed's own calls for the distcomm operations, for ``distcomm bench --compare raw``
(the engine's ``native_call``, :meth:`distcomm_torch.communicator.TorchEngine.native_call`): the
same buffers, torch's API, no distcomm layer."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch.distributed as dist

from distcomm.backend import as_torch

__all__ = ["all_gather_single", "native_call", "reduce_scatter_single"]

#: torch's one-tensor gather and reduce-scatter (renamed in torch 2.13; the old names before).
all_gather_single = getattr(dist, "all_gather_single", dist.all_gather_into_tensor)
reduce_scatter_single = getattr(dist, "reduce_scatter_single", dist.reduce_scatter_tensor)


def native_call(group: Any, world_size: int, op: str, args: tuple[Any, ...]) -> Any:
    """A zero-argument callable running ``op`` with torch.distributed on ``group``, or None."""
    tensors = [as_torch(a) if op in _TENSOR_OPS and a is not None else a for a in args]
    make = _CALLS.get(op)
    return None if make is None else make(group, world_size, *tensors)


def _all_gather_object(group: Any, world_size: int, obj: Any) -> Callable[[], object]:
    out: list[Any] = [None] * world_size

    def call() -> object:
        dist.all_gather_object(out, obj, group=group)
        return out

    return call


def _broadcast_object(group: Any, world_size: int, obj: Any) -> Callable[[], object]:
    def call() -> object:
        box = [obj]
        dist.broadcast_object_list(box, src=0, group=group)
        return box[0]

    return call


def _gather_object(group: Any, world_size: int, obj: Any) -> Callable[[], object]:
    mine = dist.get_rank(group) == 0
    out = [None] * world_size if mine else None
    return lambda: dist.gather_object(obj, out, dst=0, group=group)


def _scatter_object(group: Any, world_size: int, objs: Any) -> Callable[[], object]:
    def call() -> object:
        box: list[Any] = [None]
        dist.scatter_object_list(box, objs, src=0, group=group)
        return box[0]

    return call


def _root(group: Any) -> int:
    """The global rank of ``group``'s rank 0 (torch's dst and src are global ranks)."""
    return 0 if group is None else int(dist.get_global_rank(group, 0))


def _rooted(call: Callable[..., Any]) -> Callable[..., Callable[[], object]]:
    """gather or scatter with root 0: ``full`` (None off the root) as the list of its chunks."""

    def make(group: Any, world_size: int, x: Any, full: Any) -> Callable[[], object]:
        parts = None if full is None else list(full.chunk(world_size))
        root = _root(group)
        return lambda: call(x, parts, root, group=group)

    return make


def _sendrecv(group: Any, world_size: int, x: Any, y: Any) -> Callable[[], object]:
    """bench's ping-pong: the group's rank 0 sends ``x`` to its rank 1 and receives into ``y``,
    rank 1 receives then sends (torch's dst and src are global ranks); the others do nothing."""
    me = dist.get_rank(group)
    if me not in (0, 1):
        return lambda: None
    peer = 1 - me if group is None else int(dist.get_global_rank(group, 1 - me))
    if me == 0:

        def ping() -> object:
            dist.send(x, peer, group=group)
            return dist.recv(y, peer, group=group)

        return ping

    def pong() -> object:
        dist.recv(y, peer, group=group)
        return dist.send(x, peer, group=group)

    return pong


_TENSOR_OPS = frozenset(
    {"all_reduce", "broadcast", "reduce", "all_gather", "reduce_scatter", "all_to_all"}
    | {"gather", "scatter", "sendrecv"}
)
_CALLS: dict[str, Callable[..., Callable[[], object]]] = {
    "all_reduce": lambda g, n, x: lambda: dist.all_reduce(x, group=g),
    "broadcast": lambda g, n, x: lambda: dist.broadcast(x, src=0, group=g),
    "reduce": lambda g, n, x: lambda: dist.reduce(x, dst=_root(g), group=g),
    "gather": _rooted(dist.gather),
    "scatter": _rooted(dist.scatter),
    "all_gather": lambda g, n, out, x: lambda: all_gather_single(out, x, group=g),
    "reduce_scatter": lambda g, n, out, x: lambda: reduce_scatter_single(out, x, group=g),
    "all_to_all": lambda g, n, out, x: lambda: dist.all_to_all_single(out, x, group=g),
    "barrier": lambda g, n: lambda: dist.barrier(group=g),
    "sendrecv": _sendrecv,
    "all_gather_object": _all_gather_object,
    "broadcast_object": _broadcast_object,
    "gather_object": _gather_object,
    "scatter_object": _scatter_object,
}
