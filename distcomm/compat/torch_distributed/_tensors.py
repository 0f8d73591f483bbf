"""torch's tensor collectives, messages and barriers over distcomm: the same signatures, ranks
given as global ranks (or the group's, ``group_src=``), a rank outside ``group`` doing nothing.
"""

from __future__ import annotations

import datetime
from collections.abc import Sequence
from typing import Any

import distcomm
from distcomm._runtime.collectives import resolve_group
from distcomm.compat.torch_distributed._groups import member, root
from distcomm.errors import InvalidArgumentError
from distcomm.protocol import Communicator, ReduceOp, Work

__all__ = [
    "P2POp",
    "all_gather",
    "all_gather_into_tensor",
    "all_reduce",
    "all_to_all",
    "all_to_all_single",
    "barrier",
    "batch_isend_irecv",
    "broadcast",
    "gather",
    "irecv",
    "isend",
    "monitored_barrier",
    "recv",
    "reduce",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "scatter",
    "send",
]

_all_reduce = distcomm.all_reduce


def all_reduce(
    tensor: Any, op: Any = ReduceOp.SUM, group: Any = None, async_op: bool = False
) -> Work | None:
    """Reduce ``tensor`` in place on every rank of ``group`` (``distcomm.all_reduce``)."""
    if group is None:
        return _all_reduce(tensor, op, None, async_op)  # type: ignore[no-any-return]
    comm = member(group, "all_reduce")
    return None if comm is None else comm.all_reduce(tensor, op, async_op)


def broadcast(
    tensor: Any,
    src: int | None = None,
    group: Any = None,
    async_op: bool = False,
    group_src: int | None = None,
) -> Work | None:
    """Copy global rank ``src``'s ``tensor`` (or the group's rank ``group_src``'s) to every
    rank of ``group``."""
    comm = member(group, "broadcast")
    if comm is None:
        return None
    return comm.broadcast(tensor, root(comm, src, group_src, "src"), async_op)


def reduce(
    tensor: Any,
    dst: int | None = None,
    op: Any = ReduceOp.SUM,
    group: Any = None,
    async_op: bool = False,
    group_dst: int | None = None,
) -> Work | None:
    """Reduce ``tensor`` into global rank ``dst``'s (or the group's rank ``group_dst``'s)."""
    comm = member(group, "reduce")
    if comm is None:
        return None
    return comm.reduce(tensor, root(comm, dst, group_dst, "dst"), op, async_op)


def all_gather(
    tensor_list: list[Any], tensor: Any, group: Any = None, async_op: bool = False
) -> Work | None:
    """Every rank's ``tensor`` into ``tensor_list``, in the group's rank order."""
    comm = member(group, "all_gather")
    return None if comm is None else comm.all_gather(tensor_list, tensor, async_op)


def all_gather_into_tensor(
    output_tensor: Any, input_tensor: Any, group: Any = None, async_op: bool = False
) -> Work | None:
    """Every rank's ``input_tensor``, concatenated in rank order, into ``output_tensor``."""
    comm = member(group, "all_gather_into_tensor")
    if comm is None:
        return None
    return comm.all_gather_into_tensor(output_tensor, input_tensor, async_op)


def gather(
    tensor: Any,
    gather_list: list[Any] | None = None,
    dst: int | None = None,
    group: Any = None,
    async_op: bool = False,
    group_dst: int | None = None,
) -> Work | None:
    """Every rank's ``tensor`` into ``gather_list`` on global rank ``dst`` (or ``group_dst``);
    ``gather_list`` is None on the other ranks."""
    comm = member(group, "gather")
    if comm is None:
        return None
    return comm.gather(tensor, gather_list, root(comm, dst, group_dst, "dst", 0), async_op)


def scatter(
    tensor: Any,
    scatter_list: list[Any] | None = None,
    src: int | None = None,
    group: Any = None,
    async_op: bool = False,
    group_src: int | None = None,
) -> Work | None:
    """Rank r's ``tensor`` gets ``scatter_list[r]`` of global rank ``src`` (or ``group_src``);
    ``scatter_list`` is None on the other ranks."""
    comm = member(group, "scatter")
    if comm is None:
        return None
    return comm.scatter(tensor, scatter_list, root(comm, src, group_src, "src", 0), async_op)


def reduce_scatter(
    output: Any,
    input_list: list[Any],
    op: Any = ReduceOp.SUM,
    group: Any = None,
    async_op: bool = False,
) -> Work | None:
    """Reduce the ranks' ``input_list[r]`` into rank r's ``output``."""
    comm = member(group, "reduce_scatter")
    return None if comm is None else comm.reduce_scatter(output, input_list, op, async_op)


def reduce_scatter_tensor(
    output: Any, input: Any, op: Any = ReduceOp.SUM, group: Any = None, async_op: bool = False
) -> Work | None:
    """Reduce ``input`` across ranks; rank r gets chunk r in ``output``."""
    comm = member(group, "reduce_scatter_tensor")
    return None if comm is None else comm.reduce_scatter_tensor(output, input, op, async_op)


def all_to_all(
    output_tensor_list: list[Any],
    input_tensor_list: list[Any],
    group: Any = None,
    async_op: bool = False,
) -> Work | None:
    """``input_tensor_list[r]`` goes to rank r, into its ``output_tensor_list[this rank]``."""
    comm = member(group, "all_to_all")
    if comm is None:
        return None
    return comm.all_to_all(output_tensor_list, input_tensor_list, async_op)


def all_to_all_single(
    output: Any,
    input: Any,
    output_split_sizes: Sequence[int] | None = None,
    input_split_sizes: Sequence[int] | None = None,
    group: Any = None,
    async_op: bool = False,
) -> Work | None:
    """Chunk r of every rank's ``input`` goes to rank r's ``output`` (``distcomm.
    all_to_all_single``: the split sizes' tables are checked across ranks)."""
    comm = member(group, "all_to_all_single")
    if comm is None:
        return None
    return comm.all_to_all_single(
        output, input, output_split_sizes, input_split_sizes, async_op=async_op
    )


def send(
    tensor: Any,
    dst: int | None = None,
    group: Any = None,
    tag: int = 0,
    group_dst: int | None = None,
) -> None:
    """Send ``tensor`` to global rank ``dst`` (or the group's ``group_dst``)."""
    comm = member(group, "send")
    if comm is not None:
        comm.send(tensor, root(comm, dst, group_dst, "dst"), tag)


def recv(
    tensor: Any,
    src: int | None = None,
    group: Any = None,
    tag: int = 0,
    group_src: int | None = None,
) -> int:
    """Receive into ``tensor`` from global rank ``src`` (or ``group_src``; both None: any);
    return the sender's global rank (-1 where this rank is not in ``group``)."""
    comm = member(group, "recv")
    if comm is None:
        return -1
    sender = None if src is None and group_src is None else root(comm, src, group_src, "src")
    return comm.global_ranks[comm.recv(tensor, sender, tag)]


def isend(
    tensor: Any,
    dst: int | None = None,
    group: Any = None,
    tag: int = 0,
    group_dst: int | None = None,
) -> Work | None:
    """Start sending ``tensor`` to global rank ``dst`` (or ``group_dst``); a Work."""
    comm = member(group, "isend")
    return None if comm is None else comm.isend(tensor, root(comm, dst, group_dst, "dst"), tag)


def irecv(
    tensor: Any,
    src: int | None = None,
    group: Any = None,
    tag: int = 0,
    group_src: int | None = None,
) -> Work | None:
    """Start receiving into ``tensor`` from global rank ``src`` (or ``group_src``; both None:
    any); a Work."""
    comm = member(group, "irecv")
    if comm is None:
        return None
    sender = None if src is None and group_src is None else root(comm, src, group_src, "src")
    return comm.irecv(tensor, sender, tag)


class P2POp:
    """One message of :func:`batch_isend_irecv`, as torch's: ``peer`` is the global rank and
    ``group_peer`` the group's, whichever was given.

    Attributes:
        op: :func:`isend` or :func:`irecv` (or distcomm's, torch's, or their names).
        tensor: the message or the buffer.
        peer: the global rank sent to or received from.
        group: the group; None: the default one.
        tag: the message's tag.
        group_peer: ``peer``'s rank in ``group``.
    """

    def __init__(
        self,
        op: Any,
        tensor: Any,
        peer: int | None = None,
        group: Any = None,
        tag: int = 0,
        group_peer: int | None = None,
    ) -> None:
        comm = resolve_group(group)
        self.group_peer = root(comm, peer, group_peer, "peer")
        self.peer = comm.global_ranks[self.group_peer]
        self.op, self.tensor, self.group, self.tag = op, tensor, group, tag

    def __repr__(self) -> str:
        kind = getattr(self.op, "__name__", self.op)
        return f"P2POp({kind}, peer={self.peer}, group_peer={self.group_peer}, tag={self.tag})"


def batch_isend_irecv(p2p_op_list: Sequence[P2POp]) -> list[Work]:
    """Start every message of ``p2p_op_list`` (its receives first); their Works."""
    ops = [distcomm.P2POp(op.op, op.tensor, op.group_peer, op.group, op.tag) for op in p2p_op_list]
    return distcomm.batch_isend_irecv(ops)


def barrier(
    group: Any = None,
    async_op: bool = False,
    device_ids: Sequence[int] | None = None,
    timeout: datetime.timedelta | None = None,
) -> Work | None:
    """Wait for every rank of ``group``. It never waits forever: past ``timeout`` (default:
    ``init_process_group``'s) it raises DistTimeoutError naming the ranks that had not come.
    ``device_ids`` is accepted for torch's sake (the device is the default group's).

    Raises:
        InvalidArgumentError: ``timeout`` with ``async_op=True``: give it to ``wait``.
    """
    del device_ids
    comm = member(group, "barrier")
    if comm is None:
        return None
    if timeout is None:
        return comm.barrier(async_op)
    if async_op:
        raise InvalidArgumentError(
            f"barrier(async_op=True, timeout={timeout!r}): a Work takes its timeout when waited "
            "for. HINT: dist.barrier(async_op=True).wait(timeout=...)."
        )
    _within(comm, timeout)
    return None


def monitored_barrier(
    group: Any = None, timeout: datetime.timedelta | None = None, wait_all_ranks: bool = False
) -> None:
    """A barrier that raises DistTimeoutError (a TimeoutError; torch raises RuntimeError)
    naming every rank that had not arrived within ``timeout`` (default:
    ``init_process_group``'s), on every backend; ``wait_all_ranks`` is accepted: every missing
    rank is named either way."""
    del wait_all_ranks
    comm = member(group, "monitored_barrier")
    if comm is not None:
        _within(comm, timeout)


def _within(comm: Communicator, timeout: datetime.timedelta | None) -> None:
    work = comm.barrier(async_op=True)
    assert work is not None
    work.wait(None if timeout is None else timeout.total_seconds())
