"""torch's object collectives, list in place: ``all_gather_object(object_list, obj)``,
``broadcast_object_list``, ``gather_object`` and ``scatter_object_list`` over distcomm's.

What differs from torch, on purpose: a peer's bytes are read through distcomm's allow-list
(``distcomm.allow_objects``; docs/security.md), not plain pickle; ``device`` is accepted and
unused (distcomm moves the bytes itself, so no GPU has to be the current one); and a rank whose
output list is the wrong size raises after the exchange, so that the other ranks are never left
waiting for it (``scatter_object_list``'s input list is checked on ``src`` before it, as in
torch).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from distcomm.compat.torch_distributed._groups import member, root
from distcomm.errors import InvalidArgumentError

__all__ = [
    "all_gather_object",
    "broadcast_object_list",
    "gather_object",
    "scatter_object_list",
]


def all_gather_object(object_list: list[Any], obj: Any, group: Any = None) -> None:
    """Fill ``object_list`` with every rank's ``obj``, in the group's rank order.

    Raises:
        InvalidArgumentError: ``object_list`` is not a list of at least the group's size.
    """
    comm = member(group, "all_gather_object")
    if comm is not None:
        _fill("all_gather_object", "object_list", object_list, comm.all_gather_object(obj))


def broadcast_object_list(
    object_list: list[Any],
    src: int | None = None,
    group: Any = None,
    device: Any = None,
    group_src: int | None = None,
) -> None:
    """Make every rank's ``object_list`` global rank ``src``'s (or ``group_src``'s), item by
    item. ``device`` is accepted for torch's sake.

    Raises:
        InvalidArgumentError: on a receiving rank, ``object_list`` has not as many items as
            ``src``'s.
    """
    del device
    comm = member(group, "broadcast_object_list")
    if comm is None:
        return
    sender = root(comm, src, group_src, "src", 0)
    received = comm.broadcast_object(list(object_list), sender)
    if comm.rank != sender:
        if len(received) != len(object_list):
            raise InvalidArgumentError(
                f"broadcast_object_list: this rank's object_list has {len(object_list)} items, "
                f"src's {len(received)}. HINT: every rank passes a list of the same length "
                f"([None] * {len(received)} on the receivers)."
            )
        object_list[:] = received


def gather_object(
    obj: Any,
    object_gather_list: list[Any] | None = None,
    dst: int | None = None,
    group: Any = None,
    group_dst: int | None = None,
) -> None:
    """Fill ``object_gather_list`` on global rank ``dst`` (or ``group_dst``) with every rank's
    ``obj``; the other ranks pass None.

    Raises:
        InvalidArgumentError: on ``dst``, ``object_gather_list`` is not a list of the group's
            size; elsewhere, it is not None (torch's rule).
    """
    comm = member(group, "gather_object")
    if comm is None:
        return
    receiver = root(comm, dst, group_dst, "dst", 0)
    gathered = comm.gather_object(obj, receiver)
    if gathered is not None:
        _fill("gather_object", "object_gather_list", object_gather_list, gathered)
    elif object_gather_list is not None:
        raise InvalidArgumentError(
            "gather_object: object_gather_list must be None on the ranks other than dst "
            f"(this is global rank {comm.global_ranks[comm.rank]}, dst global rank "
            f"{comm.global_ranks[receiver]}). HINT: pass object_gather_list on dst only, as "
            "torch requires."
        )


def scatter_object_list(
    scatter_object_output_list: list[Any],
    scatter_object_input_list: Sequence[Any] | None = None,
    src: int | None = None,
    group: Any = None,
    group_src: int | None = None,
) -> None:
    """Put ``scatter_object_input_list[r]`` of global rank ``src`` (or ``group_src``) into rank
    r's ``scatter_object_output_list[0]``.

    Raises:
        InvalidArgumentError: on ``src``, the input list is not one object per rank; an
            output list that is not a list of at least one item.
    """
    comm = member(group, "scatter_object_list")
    if comm is None:
        return
    sender = root(comm, src, group_src, "src", 0)
    mine = comm.scatter_object(scatter_object_input_list if comm.rank == sender else None, sender)
    _fill("scatter_object_list", "scatter_object_output_list", scatter_object_output_list, [mine])


def _fill(function: str, name: str, target: Any, values: list[Any]) -> None:
    """``target[:len(values)] = values``, once ``target`` is known to be a list that long."""
    if not isinstance(target, list) or len(target) < len(values):
        size = f"{len(target)} items" if isinstance(target, list) else type(target).__name__
        raise InvalidArgumentError(
            f"{function}: {name} must be a list of at least {len(values)} items, not {size}. "
            f"HINT: {name} = [None] * {len(values)}."
        )
    target[: len(values)] = values
