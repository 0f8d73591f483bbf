"""``loopback``: the smallest complete distcomm backend, for a world of 1.

It shows what a backend author writes: a BaseCommunicator subclass overriding the engine primitives
(distcomm.backend.primitives lists them). BaseCommunicator already answers every collective of a
world of 1 locally, so only point-to-point messages (to oneself) and group creation reach the
primitives here. It passes distcomm's conformance suite at world size 1.
"""

from __future__ import annotations

import collections
from typing import Any

import distcomm
from distcomm.backend import BaseCommunicator, CompletedWork, adapter_for


class LoopbackCommunicator(BaseCommunicator):
    """A world of 1 whose sends wait in a queue until this rank receives them."""

    backend_name = "loopback"

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._queue: collections.deque[tuple[int, Any]] = collections.deque()

    def _isend(self, tensor: Any, dst: int, tag: int) -> distcomm.Work:
        self._queue.append((tag, adapter_for(tensor).clone(tensor)))
        return CompletedWork()

    def _irecv(self, tensor: Any, src: int | None, tag: int) -> distcomm.Work:
        for i, (queued_tag, data) in enumerate(self._queue):
            if queued_tag == tag:
                del self._queue[i]
                adapter_for(tensor).copy_(tensor, data)
                return CompletedWork(source=0)
        raise distcomm.InvalidArgumentError(
            f"loopback: no message with tag {tag!r} was sent to this rank. HINT: send before recv."
        )

    def _split(self, groups: list[tuple[int, ...]], index: int | None) -> Any:
        if index is None:
            return distcomm.NON_MEMBER
        return LoopbackCommunicator(
            rank=0,
            world_size=1,
            launch=self.launch,
            timeout=self.timeout,
            name=f"{self.name}/group",
        )


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
) -> LoopbackCommunicator:
    """Factory: the ``loopback`` communicator for ``launch`` (CPU only, no options)."""
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
    return LoopbackCommunicator(rank=0, world_size=1, launch=launch, timeout=timeout)
