"""Module-level point-to-point messages: the default communicator's, or ``group=``'s.

Tensors one at a time (``send``, ``recv``, ``isend``, ``irecv``), in batches
(``batch_isend_irecv``, whose receives start before its sends: neighbours that send to each
other in a pipeline schedule never wait on one another), and Python objects (``send_object``,
``recv_object``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from distcomm._runtime.collectives import resolve_group
from distcomm.errors import InvalidArgumentError
from distcomm.protocol import P2POp, Work

__all__ = [
    "batch_isend_irecv",
    "irecv",
    "isend",
    "recv",
    "recv_object",
    "send",
    "send_object",
]


def send(tensor: Any, dst: int, group: Any = None, tag: int = 0) -> None:
    """Send ``tensor`` to ``dst``. When it returns, ``tensor`` may be reused.

    Args:
        tensor: the message.
        dst: the receiving rank, a rank of the communicator in use.
        group: the communicator (one from ``new_group`` or ``split``); None: the default one.
        tag: an int in ``[0, 2**30)``; the receive must name the same tag.
    """
    resolve_group(group).send(tensor, dst, tag)


def recv(tensor: Any, src: int | None = None, group: Any = None, tag: int = 0) -> int:
    """Receive into ``tensor`` from ``src`` (None: any); return the sender's rank.

    Args:
        tensor: the buffer: as many elements as the message (the dtype of the sent tensor).
        src: the sending rank, a rank of the communicator in use; None: any rank (where the
            backend's ``capabilities.any_source`` allows it).
        group: the communicator (one from ``new_group`` or ``split``); None: the default one.
        tag: an int in ``[0, 2**30)``, the sender's.

    Returns:
        The sender's rank.
    """
    return resolve_group(group).recv(tensor, src, tag)


def isend(tensor: Any, dst: int, group: Any = None, tag: int = 0) -> Work:
    """Start sending ``tensor`` to ``dst``; do not modify ``tensor`` until the Work completes.

    Args:
        tensor: the message.
        dst: the receiving rank, a rank of the communicator in use.
        group: the communicator (one from ``new_group`` or ``split``); None: the default one.
        tag: an int in ``[0, 2**30)``; the receive must name the same tag.

    Returns:
        A Work; it owns ``tensor`` until the send completes.
    """
    return resolve_group(group).isend(tensor, dst, tag)


def irecv(tensor: Any, src: int | None = None, group: Any = None, tag: int = 0) -> Work:
    """Start receiving into ``tensor``; the Work's ``source`` names the sender.

    Args:
        tensor: the buffer: as many elements as the message.
        src: the sending rank, a rank of the communicator in use; None: any rank (where the
            backend's ``capabilities.any_source`` allows it).
        group: the communicator (one from ``new_group`` or ``split``); None: the default one.
        tag: an int in ``[0, 2**30)``, the sender's.

    Returns:
        A Work; once it completes, its ``source`` attribute holds the sender's rank.
    """
    return resolve_group(group).irecv(tensor, src, tag)


def batch_isend_irecv(p2p_op_list: Sequence[P2POp]) -> list[Work]:
    """Start every message of ``p2p_op_list`` at once (as torch's ``batch_isend_irecv``).

    The receives are posted before the sends, so that ranks exchanging with their neighbours
    (a pipeline schedule's activations forward and gradients back) never wait on each other.
    Every op is checked before any message starts.

    Args:
        p2p_op_list: :class:`P2POp` items, all on one communicator (their ``group``; None:
            the default one).

    Returns:
        One Work per op, in the order of ``p2p_op_list``; wait for each before reading a
        received buffer or reusing a sent one.

    Raises:
        InvalidArgumentError: an item that is not a P2POp, an ``op`` that is neither isend
            nor irecv, a peer that is not a rank, a bad tag, or ops on different groups.
        NotSupportedError: the backend has no point-to-point messages.
    """
    ops = p2p_op_list
    if isinstance(ops, Sequence) and ops and all(isinstance(op, P2POp) for op in ops):
        comm = resolve_group(ops[0].group)
        for index, op in enumerate(ops):
            if op.group is not None and resolve_group(op.group) is not comm:
                raise InvalidArgumentError(
                    f"batch_isend_irecv: op {index} is on another group than op 0: one batch is "
                    "on one communicator. HINT: one batch_isend_irecv per group."
                )
        ops = [dataclasses.replace(op, group=comm) for op in ops]
    else:  # the communicator says what is wrong with the list (or that it is empty)
        comm = resolve_group(None)
    return comm.batch_isend_irecv(ops)


def send_object(obj: Any, dst: int, group: Any = None, tag: int = 0) -> None:
    """Send a picklable ``obj`` to ``dst`` (torch's ``send_object_list`` of one object).

    It is pickled once (protocol 5; large buffers such as numpy arrays beside the pickle
    stream) and sent as two messages on ``tag``: its size, then its bytes.

    Args:
        obj: any picklable object.
        dst: the receiving rank, a rank of the communicator in use.
        group: the communicator (one from ``new_group`` or ``split``); None: the default one.
        tag: an int in ``[0, 2**30)``; ``recv_object`` must name the same tag.
    """
    resolve_group(group).send_object(obj, dst, tag)


def recv_object(src: int | None = None, group: Any = None, tag: int = 0) -> Any:
    """Receive the object ``src`` sent with :func:`send_object`; return it.

    Args:
        src: the sending rank, a rank of the communicator in use; None: any rank (where the
            backend's ``capabilities.any_source`` allows it).
        group: the communicator (one from ``new_group`` or ``split``); None: the default one.
        tag: an int in ``[0, 2**30)``, the sender's.

    Returns:
        The object, unpickled (its large buffers as views of the received memory).
    """
    return resolve_group(group).recv_object(src, tag)
