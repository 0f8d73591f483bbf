"""The ``fakelink`` backend's plugin: its factory, availability and registration.

The core registers this module as a plugin, through the same hook a third party uses.
"""

from __future__ import annotations

from typing import Any

from distcomm.backend import KIT_API, BackendSpec, LaunchInfo, Registry, hookimpl
from distcomm.errors import BackendUnavailableError, InvalidArgumentError
from distcomm.fakelink import communicator
from distcomm.fakelink.fabric import Fabric

__all__ = ["create", "distcomm_register_backends", "is_available"]


def create(
    launch: LaunchInfo, *, timeout: float = 1800.0, device: str | None = None, **options: Any
) -> communicator.FakeLinkEngine:
    """Factory of the ``fakelink`` backend: a world of 1 in this process.

    ``device`` is accepted and needs nothing: fakelink moves CPU and CUDA tensors alike.
    """
    if options:
        raise InvalidArgumentError(
            f"backend 'fakelink' takes no options, got {sorted(options)!r}. HINT: remove them from "
            "init(); options are passed to the backend's factory."
        )
    available, reason = is_available(launch)
    if not available:
        raise BackendUnavailableError(f"fakelink: {reason}", backend="fakelink", reason=reason)
    return communicator.FakeLinkEngine(Fabric(1), 0)


def is_available(launch: LaunchInfo) -> tuple[bool, str]:
    """fakelink runs a world of 1 in a process; thread-worlds come from run_threads."""
    if launch.world_size == 1:
        return True, "in-process world of 1"
    return False, (
        f"in-process only: it runs a world of 1, or thread-ranks in distcomm.testing.run_threads, "
        f"but the {launch.method} launch says world_size={launch.world_size}"
    )


@hookimpl
def distcomm_register_backends(registry: Registry) -> None:
    """Register ``fakelink`` (priority 0: when asked, or for a world of 1 with no launcher)."""
    registry.add_backend(
        BackendSpec(
            name="fakelink",
            factory=create,
            is_available=is_available,
            priority=0,
            devices=communicator.FakeLinkEngine.devices,
            capabilities=communicator.CAPABILITIES,
            description="in-process: a world of 1, or N thread-ranks (testing.run_threads)",
            kit_api=KIT_API,
        )
    )
