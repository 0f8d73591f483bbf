"""The entry point: registers backend ``zmq`` with distcomm. Imports neither zmq nor numpy."""

from __future__ import annotations

import importlib.util
from typing import Any

from distcomm.backend import KIT_API, BackendSpec, LaunchInfo, Registry, hookimpl
from distcomm.errors import InvalidArgumentError

__all__ = ["distcomm_register_backends", "is_available"]


def is_available(launch: LaunchInfo) -> tuple[bool, str]:
    """zmq needs pyzmq and numpy, and a master address and port when there are several ranks."""
    for module, package in (("zmq", "pyzmq"), ("numpy", "numpy")):
        if importlib.util.find_spec(module) is None:
            return False, f"{package} is not installed (pip install {package})"
    if launch.world_size == 1:
        return True, "a world of 1"
    if launch.master_addr is None or launch.master_port is None:
        return False, (
            f"the {launch.method!r} launch gives no master address and port to meet at. HINT: "
            "start the job with distcomm run, torchrun or srun, or set MASTER_ADDR and MASTER_PORT"
        )
    return True, f"rendezvous at {launch.master_addr}:{launch.master_port}"


def create(
    launch: LaunchInfo, *, timeout: float = 1800.0, device: str | None = None, **options: Any
) -> Any:
    """Factory of ``zmq``: bind this rank's inbox, meet the others, return the world's engine
    (a :class:`~distcomm_zmq.communicator.ZmqEngine`: distcomm makes the communicator).

    Raises:
        InvalidArgumentError: an option (zmq takes none) or a device other than the CPU.
        DistTimeoutError: a rank did not reach the rendezvous within ``timeout``.
    """
    if options or device not in (None, "cpu"):
        raise InvalidArgumentError(
            f"backend 'zmq' moves CPU memory and takes no options, got device={device!r}, "
            f"options {sorted(options)!r}. HINT: omit them (CUDA tensors are staged through "
            "host memory)."
        )
    from distcomm_zmq.communicator import connect

    return connect(launch, timeout)


@hookimpl
def distcomm_register_backends(registry: Registry) -> None:
    """Register zmq (priority 0: used only when asked for by name)."""
    from distcomm_zmq.capabilities import ZMQ_CAPABILITIES

    registry.add_backend(
        BackendSpec(
            name="zmq",
            factory=create,
            is_available=is_available,
            priority=0,
            devices=frozenset({"cpu"}),
            capabilities=ZMQ_CAPABILITIES,
            description="ZeroMQ sockets (pyzmq): an example third-party backend, CPU memory",
            kit_api=KIT_API,
        )
    )
