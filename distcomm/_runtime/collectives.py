"""Module-level collectives: the default communicator's, or ``group=``'s.

Before ``init()`` they are identities when the detected launch is a world of 1, and raise
NotInitializedError when the launcher says the world is larger: never N silently independent
programs.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

from distcomm._operations import DEFAULT_BUCKET_BYTES
from distcomm._runtime import state
from distcomm._runtime.detection import detect_environment
from distcomm._torch_names import (
    explains_torch_form,
    fill_placeholders,
    not_a_communicator,
    short,
    torch_form_error,
)
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
    "reduce",
    "reduce_scatter_tensor",
    "scatter",
    "scatter_object",
]

_solo: Communicator | None = None
_solo_lock = threading.Lock()


def resolve_group(group: Any, torch_form: str = "") -> Communicator:
    """The communicator a module-level call acts on (see the module docstring).

    Args:
        group: what the caller passed as ``group=``.
        torch_form: the caller's name when torch's namesake takes a list where distcomm's
            takes ``group`` (``all_gather_object(object_list, obj)``): a ``group`` that is not a
            communicator then gets the error naming torch's form.
    """
    if group is None:  # state.current() inlined: every module-level call comes here
        ctx = state.current() if state.thread_ranks else state._process
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
        raise not_a_communicator(group, torch_form)
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
            from distcomm.fakelink import Fabric, world

            _solo = world(Fabric(1), launch)
        return _solo


def all_reduce(
    tensor: Any, op: Any = ReduceOp.SUM, group: Any = None, async_op: bool = False
) -> Any:
    """Reduce ``tensor`` in place on every rank (a number: return the result).

    Every rank's ``tensor`` becomes the reduction of all ranks' tensors. A Python ``int``,
    ``float`` or ``bool`` is reduced and returned instead (the argument is left alone), exactly,
    in Python, from every rank's number (sent as objects): ints stay ints of any size, AVG
    returns a float, bools follow the logical rules; AVG of bools, and BAND, BOR or BXOR of
    floats, raise InvalidArgumentError, in a world of 1 too.

    Args:
        tensor: a torch tensor or numpy array, reduced in place; or a Python number.
        op: a ReduceOp or any spelling it accepts; default SUM.
        group: the communicator (one from ``new_group`` or ``split``); None: the default one.
        async_op: return a Work at once instead of waiting for the result (a number is
            returned all the same).

    Returns:
        None, a Work when ``async_op`` is true, or the reduced number.
    """
    if group is None:  # the hottest call of all: resolve_group inlined
        ctx = state.current() if state.thread_ranks else state._process
        if ctx is not None:
            return ctx.comm.all_reduce(tensor, op, async_op)
    return resolve_group(group).all_reduce(tensor, op, async_op)


def broadcast(tensor: Any, src: int = 0, group: Any = None, async_op: bool = False) -> Work | None:
    """Copy ``src``'s ``tensor`` to every rank: every rank's ``tensor`` becomes ``src``'s.

    Args:
        tensor: the data on ``src``; the output on the other ranks.
        src: the sending rank, a rank of the communicator in use.
        group: the communicator (one from ``new_group`` or ``split``); None: the default one.
        async_op: return a Work at once instead of waiting for the result.
    """
    return resolve_group(group).broadcast(tensor, src, async_op)


def reduce(
    tensor: Any, dst: int = 0, op: Any = ReduceOp.SUM, group: Any = None, async_op: bool = False
) -> Work | None:
    """Reduce ``tensor`` into ``dst``'s: ``dst``'s ``tensor`` becomes the reduction.

    The other ranks' tensors are unspecified afterwards.

    Args:
        tensor: this rank's input; on ``dst``, also the output.
        dst: the receiving rank, a rank of the communicator in use.
        op: a ReduceOp or any spelling it accepts; default SUM.
        group: the communicator (one from ``new_group`` or ``split``); None: the default one.
        async_op: return a Work at once instead of waiting for the result.
    """
    return resolve_group(group).reduce(tensor, dst, op, async_op)


def all_gather(
    tensor_list: list[Any], tensor: Any, group: Any = None, async_op: bool = False
) -> Work | None:
    """Gather every rank's ``tensor`` into ``tensor_list`` on every rank, in rank order.

    Args:
        tensor_list: the outputs: one tensor per rank, each of ``tensor``'s element count.
        tensor: this rank's input.
        group: the communicator (one from ``new_group`` or ``split``); None: the default one.
        async_op: return a Work at once instead of waiting for the result.
    """
    return resolve_group(group).all_gather(tensor_list, tensor, async_op)


def all_gather_into_tensor(
    output_tensor: Any, input_tensor: Any, group: Any = None, async_op: bool = False
) -> Work | None:
    """Gather every rank's ``input_tensor`` into one ``output_tensor``, concatenated in rank
    order.

    Args:
        output_tensor: the output: world_size times the input's number of elements, in any
            shape (``(world_size * 2, 3)`` or flat, for a ``(2, 3)`` input).
        input_tensor: this rank's input.
        group: the communicator (one from ``new_group`` or ``split``); None: the default one.
        async_op: return a Work at once instead of waiting for the result.
    """
    return resolve_group(group).all_gather_into_tensor(output_tensor, input_tensor, async_op)


def reduce_scatter_tensor(
    output: Any, input: Any, op: Any = ReduceOp.SUM, group: Any = None, async_op: bool = False
) -> Work | None:
    """Reduce ``input`` across ranks and give rank r chunk r in ``output``.

    Args:
        output: this rank's chunk of the result; it may be a view of ``input`` (its chunk, in
            place, as NCCL allows: the input is then copied first).
        input: world_size times the output's number of elements: chunk r goes to rank r.
        op: a ReduceOp or any spelling it accepts; default SUM.
        group: the communicator (one from ``new_group`` or ``split``); None: the default one.
        async_op: return a Work at once instead of waiting for the result.
    """
    return resolve_group(group).reduce_scatter_tensor(output, input, op, async_op)


def gather(
    tensor: Any,
    gather_list: list[Any] | None = None,
    dst: int = 0,
    group: Any = None,
    async_op: bool = False,
) -> Work | None:
    """Gather every rank's ``tensor`` into ``gather_list`` on ``dst`` (None elsewhere).

    Args:
        tensor: this rank's input.
        gather_list: on ``dst``, required: one tensor per rank, each with as many elements as
            ``tensor``, filled in rank order. On the other ranks it must be None.
        dst: the receiving rank, a rank of the communicator in use.
        group: the communicator (one from ``new_group`` or ``split``); None: the default one.
        async_op: return a Work at once instead of waiting for the result.

    Raises:
        InvalidArgumentError: ``gather_list`` missing on ``dst``, or given elsewhere (a
            ValueError, as in torch).
    """
    return resolve_group(group).gather(tensor, gather_list, dst, async_op)


def scatter(
    tensor: Any,
    scatter_list: list[Any] | None = None,
    src: int = 0,
    group: Any = None,
    async_op: bool = False,
) -> Work | None:
    """Give rank r ``scatter_list[r]`` from ``src``, in ``tensor``.

    Args:
        tensor: this rank's output.
        scatter_list: on ``src``, required: one tensor per rank, each with as many elements
            as ``tensor``. On the other ranks it must be None.
        src: the sending rank, a rank of the communicator in use.
        group: the communicator (one from ``new_group`` or ``split``); None: the default one.
        async_op: return a Work at once instead of waiting for the result.

    Raises:
        InvalidArgumentError: ``scatter_list`` missing on ``src``, given elsewhere, or not
            one tensor per rank (a ValueError, as in torch).
    """
    return resolve_group(group).scatter(tensor, scatter_list, src, async_op)


def all_to_all_single(
    output: Any,
    input: Any,
    output_split_sizes: Sequence[int] | None = None,
    input_split_sizes: Sequence[int] | None = None,
    group: Any = None,
    async_op: bool = False,
) -> Work | None:
    """Chunk r of every rank's ``input`` goes to rank r's ``output`` (torch's signature).

    Without split sizes, ``input`` is split into world_size equal chunks, and ``output``
    receives one chunk from each rank, in rank order. With them, the chunks are rows of the
    first dimension and may differ, as mixture-of-experts routing needs: ``input_split_sizes[r]``
    rows go to rank r, ``output_split_sizes[s]`` rows come from rank s (None: equal rows). What
    rank r sends s must be what s expects from r; the mismatch check compares the ranks' tables
    at its check points, and those of the calls between them at the next barrier, check point
    or ``finalize()``. All ranks use the same form (with split sizes, or without).

    Args:
        output: as many elements as ``input`` (with split sizes: ``sum(output_split_sizes)``
            rows of ``input``'s row shape); it may be ``input`` itself, or share its memory
            (the input is then copied first: no engine reads an input while writing over it).
        input: world_size equal chunks (with split sizes: ``sum(input_split_sizes)`` rows).
        output_split_sizes: rows received from each rank; None: equal.
        input_split_sizes: rows sent to each rank; None: equal.
        group: the communicator (one from ``new_group`` or ``split``); None: the default one.
        async_op: return a Work at once instead of waiting for the result.

    Raises:
        InvalidArgumentError: split sizes that are not one non-negative int per rank summing
            to the tensor's rows, or rows of different shapes.
        CollectiveMismatchError: the ranks' split tables disagree: at a check point, before
            anything is sent; of a call between check points, at the next barrier, check point
            or ``finalize()`` (that call and the ones after it ran; the communicator is
            retired).
    """
    return resolve_group(group).all_to_all_single(
        output, input, output_split_sizes, input_split_sizes, async_op
    )


def barrier(group: Any = None, async_op: bool = False) -> Work | None:
    """Wait for every rank: return when every rank has called it.

    The engine's barrier. Under the mismatch check (``debug``), a communicator's first barrier is
    confirmed by a vote of the ranks, as every new kind of call is, and so is a blocking barrier
    after uneven all-to-alls whose split tables wait to be compared (docs/debugging.md).

    Args:
        group: the communicator (one from ``new_group`` or ``split``); None: the default one.
        async_op: return a Work at once instead of waiting for the result.
    """
    return resolve_group(group).barrier(async_op)


def broadcast_object(obj: Any, src: int = 0, group: Any = None) -> Any:
    """``src``'s object on every rank.

    On ``src`` (and in a world of 1) it returns the very object passed, not a copy. Buffers of
    256 KiB or more are sent straight from the object's memory, each in its own broadcast (as
    mpi4py's pkl5 does): no packing copy at all. Code written for torch's
    ``broadcast_object_list`` works too: a rank other than ``src`` that passes a list of Nones
    (``[None] * n``) gets it filled in place when ``src``'s object is a list of ``n`` items.

    Args:
        obj: the object to send, on ``src`` (picklable); ignored on the other ranks.
        src: the sending rank, a rank of the communicator in use.
        group: the communicator (one from ``new_group`` or ``split``); None: the default one.
    """
    received = resolve_group(group).broadcast_object(obj, src)
    if obj.__class__ is list and obj is not received:
        fill_placeholders(obj, received)
    return received


def all_gather_object(obj: Any, group: Any = None) -> list[Any]:
    """Every rank's object, in rank order, on every rank.

    Args:
        obj: this rank's object (picklable).
        group: the communicator (one from ``new_group`` or ``split``); None: the default one.

    Raises:
        InvalidArgumentError: called in torch's form, ``all_gather_object(object_list, obj)``
            (``group`` is not a communicator); the message names distcomm's form.
    """
    return resolve_group(group, "all_gather_object").all_gather_object(obj)


@explains_torch_form
def gather_object(obj: Any, dst: int = 0, group: Any = None) -> list[Any] | None:
    """Every rank's object on ``dst``; None elsewhere.

    Args:
        obj: this rank's object (picklable).
        dst: the receiving rank, a rank of the communicator in use.
        group: the communicator (one from ``new_group`` or ``split``); None: the default one.

    Returns:
        On ``dst``, a list of world_size objects in rank order; None on the other ranks.

    Raises:
        InvalidArgumentError: called in torch's form, ``gather_object(obj, object_gather_list,
            dst)``; the message names distcomm's form.
    """
    if dst is None or dst.__class__ is list:
        raise torch_form_error("gather_object", f"dst={short(dst)} is not a rank")
    return resolve_group(group, "gather_object").gather_object(obj, dst)


@explains_torch_form
def scatter_object(objs: Sequence[Any] | None, src: int = 0, group: Any = None) -> Any:
    """``objs[rank]`` from ``src``.

    Args:
        objs: read on ``src`` only, where it must be a sequence of world_size objects; the
            other ranks may pass None.
        src: the sending rank, a rank of the communicator in use.
        group: the communicator (one from ``new_group`` or ``split``); None: the default one.

    Returns:
        This rank's object, ``objs[rank]``.

    Raises:
        InvalidArgumentError: on ``src``, ``objs`` is not one object per rank; or the call is
            in the form of torch's ``scatter_object_list(output_list, input_list, src)``.
    """
    if src is None or src.__class__ is list:
        raise torch_form_error("scatter_object", f"src={short(src)} is not a rank")
    return resolve_group(group, "scatter_object").scatter_object(objs, src)


def all_reduce_coalesced(
    tensors: Sequence[Any],
    op: Any = ReduceOp.SUM,
    group: Any = None,
    bucket_bytes: int = DEFAULT_BUCKET_BYTES,
) -> None:
    """Reduce every tensor of ``tensors`` in place, in a few engine calls (one per bucket of
    ``bucket_bytes``; see :meth:`~distcomm.backend.BaseCommunicator.all_reduce_coalesced`).

    The tensors are grouped by library, dtype and device; each group is cut into buckets of
    at most ``bucket_bytes``, and each bucket is all-reduced once (checked and seen by hooks
    like any ``all_reduce``): in place when its torch tensors are consecutive contiguous views
    of one buffer (as ``flat.split(sizes)`` makes them, or DDP's ``gradient_as_bucket_view``),
    with no copy; else flattened into a buffer the communicator keeps for the next call (fresh
    memory costs page faults) and copied back. Python's cyclic garbage collector is paused
    during the call (the views it makes die by reference count). Blocking only. 1000 tensors
    of 1 KiB against 1000 ``all_reduce`` calls (``benchmarks/coalesced.py``, 2 ranks): about
    190x on gloo; on mpi, where one call costs only a few us, see the measured ratios in
    ``docs/backends.md``.

    Args:
        tensors: torch tensors and numpy arrays of any dtypes and shapes, the same on every
            rank, in the same order.
        op: a ReduceOp or any spelling it accepts; default SUM.
        group: the communicator (one from ``new_group`` or ``split``); None: the default one.
        bucket_bytes: the largest bucket, in bytes; default 25 MiB.
    """
    resolve_group(group).all_reduce_coalesced(tensors, op, bucket_bytes)


def assert_same(x: Any, group: Any = None, what: str = "") -> None:
    """Raise NotSameError on every rank unless every rank of ``group`` holds the same ``x``
    (a tensor, array, state_dict, module or picklable object; see
    :meth:`~distcomm.backend.BaseCommunicator.assert_same`).

    The same as ``comm.assert_same(x, what)``. Bit for bit: ``-0.0`` differs from ``0.0`` and
    equal NaNs agree (docs/debugging.md).

    Args:
        x: the value every rank should hold.
        group: the communicator (one from ``new_group`` or ``split``); None: the default one.
        what: a label for the error message, e.g. ``"weights after step 1"``.

    Raises:
        NotSameError: the ranks hold different values; its ``ranks`` and ``keys`` say which.
    """
    resolve_group(group).assert_same(x, what)
