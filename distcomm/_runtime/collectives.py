"""Module-level collectives: the default communicator's, or ``group=``'s.

Before ``init()`` they are identities when the detected launch is a world of 1, and raise
NotInitializedError when the launcher says the world is larger: never N silently independent
programs.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

from distcomm._runtime import state
from distcomm._runtime.detection import detect_environment
from distcomm.backend._pipeline.coalesced import DEFAULT_BUCKET_BYTES
from distcomm.errors import InvalidArgumentError, NotInitializedError
from distcomm.protocol import Communicator, NonMember, ReduceOp, Work

__all__ = [
    "all_gather",
    "all_gather_into_tensor",
    "all_gather_object",
    "all_reduce",
    "all_reduce_coalesced",
    "all_to_all_single",
    "assert_same",
    "barrier",
    "broadcast",
    "broadcast_object",
    "gather",
    "gather_object",
    "irecv",
    "isend",
    "new_group",
    "recv",
    "reduce",
    "reduce_scatter_tensor",
    "scatter",
    "scatter_object",
    "send",
]

_solo: Communicator | None = None
_solo_lock = threading.Lock()


def resolve_group(group: Any) -> Communicator:
    """The communicator a module-level call acts on (see the module docstring)."""
    if group is None:
        ctx = state.current()
        if ctx is not None:
            return ctx.comm
        return _before_init()
    if isinstance(group, NonMember):
        raise InvalidArgumentError(
            "group=NON_MEMBER: this rank is not a member of that group (new_group or split "
            "returned NON_MEMBER here). HINT: call the group's collectives on members only: "
            "`if group: distcomm.all_reduce(t, group=group)`."
        )
    if not hasattr(group, "all_reduce") or not hasattr(group, "world_size"):
        raise InvalidArgumentError(
            f"group={group!r} is not a distcomm communicator. HINT: pass one returned by "
            "distcomm.new_group(), comm.split(), or None for the default."
        )
    return group  # type: ignore[no-any-return]


def _before_init() -> Communicator:
    global _solo
    launch = detect_environment()
    if launch.world_size != 1:
        raise NotInitializedError(
            f"the {launch.method} launch says this is rank {launch.rank} of {launch.world_size}, "
            "but distcomm is not initialised, so a collective here would run alone. "
            "HINT: call distcomm.init() first."
        )
    with _solo_lock:
        if _solo is None:
            from distcomm.fakelink import create

            _solo = create(launch)
        return _solo


def all_reduce(
    tensor: Any, op: Any = ReduceOp.SUM, group: Any = None, async_op: bool = False
) -> Any:
    """Reduce ``tensor`` in place on every rank (a number: return the result)."""
    if group is None:  # the hottest call of all: resolve_group inlined
        ctx = state.current() if state.thread_ranks else state._process
        if ctx is not None:
            return ctx.comm.all_reduce(tensor, op, async_op)
    return resolve_group(group).all_reduce(tensor, op, async_op)


def broadcast(tensor: Any, src: int = 0, group: Any = None, async_op: bool = False) -> Work | None:
    """Copy ``src``'s ``tensor`` to every rank."""
    return resolve_group(group).broadcast(tensor, src, async_op)


def reduce(
    tensor: Any, dst: int = 0, op: Any = ReduceOp.SUM, group: Any = None, async_op: bool = False
) -> Work | None:
    """Reduce ``tensor`` into ``dst``'s."""
    return resolve_group(group).reduce(tensor, dst, op, async_op)


def all_gather(
    tensor_list: list[Any], tensor: Any, group: Any = None, async_op: bool = False
) -> Work | None:
    """Gather every rank's ``tensor`` into ``tensor_list`` on every rank."""
    return resolve_group(group).all_gather(tensor_list, tensor, async_op)


def all_gather_into_tensor(
    output_tensor: Any, input_tensor: Any, group: Any = None, async_op: bool = False
) -> Work | None:
    """Gather every rank's ``input_tensor`` into one ``output_tensor``."""
    return resolve_group(group).all_gather_into_tensor(output_tensor, input_tensor, async_op)


def reduce_scatter_tensor(
    output: Any, input: Any, op: Any = ReduceOp.SUM, group: Any = None, async_op: bool = False
) -> Work | None:
    """Reduce ``input`` across ranks and give rank r chunk r in ``output``."""
    return resolve_group(group).reduce_scatter_tensor(output, input, op, async_op)


def gather(
    tensor: Any,
    gather_list: list[Any] | None = None,
    dst: int = 0,
    group: Any = None,
    async_op: bool = False,
) -> Work | None:
    """Gather every rank's ``tensor`` into ``gather_list`` on ``dst`` (None elsewhere)."""
    return resolve_group(group).gather(tensor, gather_list, dst, async_op)


def scatter(
    tensor: Any,
    scatter_list: list[Any] | None = None,
    src: int = 0,
    group: Any = None,
    async_op: bool = False,
) -> Work | None:
    """Give rank r ``scatter_list[r]`` from ``src``, in ``tensor``."""
    return resolve_group(group).scatter(tensor, scatter_list, src, async_op)


def all_to_all_single(
    output: Any, input: Any, group: Any = None, async_op: bool = False
) -> Work | None:
    """Chunk r of every rank's ``input`` goes to rank r's ``output``."""
    return resolve_group(group).all_to_all_single(output, input, async_op)


def send(tensor: Any, dst: int, group: Any = None, tag: int = 0) -> None:
    """Send ``tensor`` to ``dst``."""
    resolve_group(group).send(tensor, dst, tag)


def recv(tensor: Any, src: int | None = None, group: Any = None, tag: int = 0) -> int:
    """Receive into ``tensor`` from ``src`` (None: any); return the sender's rank."""
    return resolve_group(group).recv(tensor, src, tag)


def isend(tensor: Any, dst: int, group: Any = None, tag: int = 0) -> Work:
    """Start sending ``tensor`` to ``dst``."""
    return resolve_group(group).isend(tensor, dst, tag)


def irecv(tensor: Any, src: int | None = None, group: Any = None, tag: int = 0) -> Work:
    """Start receiving into ``tensor``; the Work's ``source`` names the sender."""
    return resolve_group(group).irecv(tensor, src, tag)


def barrier(group: Any = None, async_op: bool = False) -> Work | None:
    """Wait for every rank."""
    return resolve_group(group).barrier(async_op)


def broadcast_object(obj: Any, src: int = 0, group: Any = None) -> Any:
    """``src``'s object on every rank."""
    return resolve_group(group).broadcast_object(obj, src)


def all_gather_object(obj: Any, group: Any = None) -> list[Any]:
    """Every rank's object, in rank order."""
    return resolve_group(group).all_gather_object(obj)


def gather_object(obj: Any, dst: int = 0, group: Any = None) -> list[Any] | None:
    """Every rank's object on ``dst``; None elsewhere."""
    return resolve_group(group).gather_object(obj, dst)


def scatter_object(objs: Sequence[Any] | None, src: int = 0, group: Any = None) -> Any:
    """``objs[rank]`` from ``src``."""
    return resolve_group(group).scatter_object(objs, src)


def all_reduce_coalesced(
    tensors: Sequence[Any],
    op: Any = ReduceOp.SUM,
    group: Any = None,
    bucket_bytes: int = DEFAULT_BUCKET_BYTES,
) -> None:
    """Reduce every tensor of ``tensors`` in place, in a few engine calls (one per bucket of
    ``bucket_bytes``; see :meth:`~distcomm.backend.BaseCommunicator.all_reduce_coalesced`)."""
    resolve_group(group).all_reduce_coalesced(tensors, op, bucket_bytes)


def assert_same(x: Any, group: Any = None, what: str = "") -> None:
    """Raise NotSameError on every rank unless every rank of ``group`` holds the same ``x``
    (a tensor, array, state_dict, module or picklable object; see
    :meth:`~distcomm.backend.BaseCommunicator.assert_same`)."""
    resolve_group(group).assert_same(x, what)


def new_group(ranks: Sequence[int], group: Any = None) -> Communicator | NonMember:
    """A sub-communicator of ``ranks`` (of ``group``, default the world); collective over it."""
    return resolve_group(group).new_group(ranks)
