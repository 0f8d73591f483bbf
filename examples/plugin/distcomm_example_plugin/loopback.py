"""``loopback``: the smallest complete distcomm backend, for a world of 1.

It shows what a backend author writes: an engine, an object of the author's own class with the
six methods distcomm requires (:mod:`distcomm.backend.engine` lists them), which the factory
returns; distcomm makes the communicator around it. In a world of 1 that communicator answers
every collective itself, so only point-to-point messages (to oneself) and group creation reach
this engine. It passes distcomm's conformance suite at world size 1.
"""

from __future__ import annotations

import collections
from typing import Any

import distcomm
from distcomm.backend import CompletedWork, adapter_for


class LoopbackEngine:
    """A world of 1 whose sends wait in a queue until this rank receives them."""

    def __init__(self) -> None:
        self._queue: collections.deque[tuple[int, Any]] = collections.deque()

    # Collectives of one rank: the tensor is already the result.
    def all_reduce(self, tensor: Any, op: distcomm.ReduceOp, async_op: bool) -> None:
        return None

    def broadcast(self, tensor: Any, src: int, async_op: bool) -> None:
        return None

    def all_gather_into(self, output: Any, tensor: Any, async_op: bool) -> None:
        adapter_for(output).copy_(output, tensor)

    def isend(self, tensor: Any, dst: int, tag: int) -> distcomm.Work:
        self._queue.append((tag, adapter_for(tensor).clone(tensor)))
        return CompletedWork()

    def irecv(self, tensor: Any, src: int | None, tag: int) -> distcomm.Work:
        for i, (queued_tag, data) in enumerate(self._queue):
            if queued_tag == tag:
                del self._queue[i]
                adapter_for(tensor).copy_(tensor, data)
                return CompletedWork(source=0)
        raise distcomm.InvalidArgumentError(
            f"loopback: no message with tag {tag!r} was sent to this rank. HINT: send before recv."
        )

    def split(self, groups: list[tuple[int, ...]], index: int | None) -> LoopbackEngine | None:
        return None if index is None else LoopbackEngine()


def is_available(launch: distcomm.LaunchInfo) -> tuple[bool, str]:
    """loopback runs worlds of 1 only."""
    if launch.world_size == 1:
        return True, "a world of 1"
    return False, f"a world of 1 only, but the launch says world_size={launch.world_size}"


def create(
    launch: distcomm.LaunchInfo,
    *,
    timeout: float = 1800.0,
    device: str | None = None,
    **options: Any,
) -> LoopbackEngine:
    """Factory: the ``loopback`` engine for ``launch`` (CPU only, no options)."""
    if options or device not in (None, "cpu"):
        raise distcomm.InvalidArgumentError(
            f"loopback takes no options and runs on the CPU only, got device={device!r}, "
            f"options {sorted(options)!r}"
        )
    available, reason = is_available(launch)
    if not available:
        raise distcomm.BackendUnavailableError(
            f"loopback: {reason}", backend="loopback", reason=reason
        )
    return LoopbackEngine()
