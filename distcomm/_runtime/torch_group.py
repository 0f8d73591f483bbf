"""torch's default process group after ``init()``: beside the backend, or over distcomm.

torch-native code (DDP, FSDP, Accelerate, Ignite) reaches for torch's default process group.
The torch backends make it; after any other backend, ``init(torch_group=...)`` (or
``DISTCOMM_TORCH_GROUP``) makes one too, through the ``gloo`` backend (``nccl`` when the device
is a GPU) of the torch plugin, so the same code runs under mpirun as under torchrun (beside):

- ``"auto"`` (the default): only when the program has imported torch before ``init()`` (a
  numpy-only MPI program pays nothing), the world is larger than 1 and no default group exists;
- ``True``: whenever the world is larger than 1 and no default group exists (torch is imported;
  an error names what to install when it cannot be);
- ``False``: never.

``"distcomm"`` makes it *over* distcomm instead (under): torch's backend ``"distcomm"`` (the
torch plugin's adapter, :class:`~distcomm.backend.AdapterSpec` ``"torch"``) runs every torch
collective, DDP's and FSDP's included, on the world communicator. When the program has imported
torch, ``init()`` registers that backend whatever the choice, so the program may call
``torch.distributed.init_process_group("distcomm")`` itself where no default group exists.

Its rendezvous travels over the communicator just made: rank 0 takes a free port on its address
(the launch's master address, loopback for a one-node job, else its host's address) and
broadcasts both, so no launcher variable is needed. The torch backend makes it as a companion
(``companion=True``: distcomm's operations never run on it, so it neither publishes progress nor
reads the store while idle). ``finalize()`` destroys it (distcomm made it).
"""

from __future__ import annotations

import contextlib
import socket
import sys
from collections.abc import Mapping
from typing import Any

from distcomm import _settings
from distcomm._logs import logger
from distcomm._plugins.names import install_hint
from distcomm.backend.communicator import BaseCommunicator, world_over
from distcomm.backend.ports import free_port
from distcomm.backend.registry import Registry
from distcomm.backend.specs import AdapterSpec
from distcomm.environment.info import LaunchInfo
from distcomm.errors import BackendUnavailableError, InvalidArgumentError
from distcomm.protocol import Communicator

__all__ = ["CHOICES", "make", "policy"]

#: What ``init(torch_group=...)`` takes.
CHOICES = ("auto", True, False, "distcomm")


def policy(given: Any = None, environ: Mapping[str, str] | None = None) -> str | bool:
    """``init``'s ``torch_group``, else ``DISTCOMM_TORCH_GROUP``, else ``"auto"``.

    Raises:
        InvalidArgumentError: a value that is none of :data:`CHOICES`.
    """
    if given is not None:
        if given in CHOICES and not (isinstance(given, int) and not isinstance(given, bool)):
            return str(given) if isinstance(given, str) else bool(given)
        raise InvalidArgumentError(
            f"torch_group={given!r} is not a choice; valid: 'auto', True, False, 'distcomm'. "
            "HINT: 'auto' makes torch's default process group beside the backend when the "
            "program imported torch; 'distcomm' runs it over distcomm (docs/interop.md)."
        )
    value: str | bool = _settings.read("DISTCOMM_TORCH_GROUP", environ)
    return value


def make(
    choice: str | bool,
    comm: Communicator,
    launch: LaunchInfo,
    registry: Registry,
    timeout: float,
    device: str | None,
) -> tuple[Any, Any, str]:
    """Make torch's default process group beside ``comm`` (or over it: ``"distcomm"``) where
    ``choice`` says so; register torch's backend ``"distcomm"`` when torch is imported.

    Returns:
        What ``finalize()`` ends (the torch backend's communicator over the new group, or the
        group over ``comm``; None if none was made), torch's default group (the new one, or one
        the program had made; None if there is none), and a sentence for the trace saying why.

    Raises:
        BackendUnavailableError: ``choice`` is True or "distcomm" and torch or distcomm-torch
            is missing.
        InvalidArgumentError: ``choice`` is "distcomm" where a torch default group exists.
    """
    adapter = registry.adapters.get("torch")
    if choice == "distcomm":
        return _over(comm, launch, adapter, timeout)
    installed = adapter is not None and "torch" in sys.modules
    if installed:
        adapter.install()  # type: ignore[union-attr]
    if getattr(comm, "torch_group", None) is not None:
        return None, None, "torch group: the backend's own"
    found = _default_group()
    if found is not None:
        return None, found, "torch group: the program's own (left as it is)"
    if choice is False:
        if installed and launch.master_addr is None:
            # the program may make the group itself (init_process_group("distcomm"), env://)
            return _Made(None, _agreed(comm, launch)), None, "torch group: off (rendezvous agreed)"
        return None, None, "torch group: off"
    if comm.world_size == 1:
        return None, None, "torch group: none needed (a world of 1)"
    if choice == "auto" and "torch" not in sys.modules:
        return None, None, "torch group: none (the program had not imported torch)"
    name = "nccl" if device is not None and device.startswith("cuda") else "gloo"
    spec = registry.backends.get(name)
    try:
        import torch.distributed as dist
    except ImportError as exc:
        return _missing(choice, f"torch is not installed ({exc})")
    if not dist.is_available():
        return _missing(choice, "this torch build has no torch.distributed")
    if spec is None:
        return _missing(choice, "distcomm-torch is not installed")
    beside = _agreed(comm, launch)
    addr, port = beside.master_addr, beside.master_port
    engine = spec.factory(beside, timeout=timeout, device=device, companion=True)
    made = world_over(spec, engine, beside, timeout)
    logger.info("made torch's default process group (%s) at %s:%s", name, addr, port)
    why = f"torch group: {name}, made beside {comm.backend} (rendezvous {addr}:{port})"
    return made, dist.group.WORLD, why


def _shared(comm: Communicator, value: Any) -> Any:
    """Rank 0's ``value`` on every rank of ``comm``: init's own call, not the program's."""
    with _setting_up(comm):  # not the program's operation #1
        return comm.broadcast_object(value if comm.rank == 0 else None, src=0)


def _agreed(comm: Communicator, launch: LaunchInfo) -> LaunchInfo:
    """``launch`` with rank 0's address and a free port on it, agreed over ``comm``."""
    addr, port = _shared(comm, _address(launch) if comm.rank == 0 else None)
    return launch.replace(
        f"derived: rank 0's, over the {comm.backend} communicator",
        master_addr=addr,
        master_port=port,
    )


class _Made:
    """What ``init`` made for torch (the adapter's group over distcomm, or nothing) and the
    launch with its rendezvous, which ``init`` exports; ``finalize`` ends it."""

    def __init__(self, handle: Any, launch: LaunchInfo) -> None:
        self.handle = handle
        self.launch = launch

    def finalize(self) -> None:
        if self.handle is not None:
            self.handle.finalize()


def _over(
    comm: Communicator, launch: LaunchInfo, adapter: AdapterSpec | None, timeout: float
) -> tuple[_Made, Any, str]:
    """``torch_group="distcomm"``: torch's default group over ``comm`` (the torch adapter)."""
    if adapter is None:
        why = "distcomm-torch is not installed"
        try:
            import torch.distributed  # noqa: F401
        except ImportError as exc:
            why = f"torch is not installed ({exc})"
        raise BackendUnavailableError(
            f"init(torch_group='distcomm') runs torch's default process group over distcomm, "
            f"but {why}. HINT: {install_hint('distcomm-torch')} (it brings torch).",
            reason=why,
        )
    launch = getattr(comm, "launch", launch)  # a torch engine's has its rendezvous
    host = None
    if comm.world_size > 1 and _default_group() is None:  # else the engine's store is its
        host = _host(launch)
    handle = adapter.make(comm, host, lambda value: _shared(comm, value), timeout)
    address = handle.address
    if address is not None:
        launch = launch.replace(
            f"derived: rank 0's store, over the {comm.backend} communicator",
            master_addr=address[0],
            master_port=address[1],
        )
    where = f" (store {address[0]}:{address[1]})" if address is not None else ""
    why = f"torch group: distcomm, over {comm.backend}{where}"
    return _Made(handle, launch), handle.group, why


def _default_group() -> Any:
    """torch's default process group if the program imported torch and has one, else None."""
    if "torch" not in sys.modules:
        return None
    import torch.distributed as dist

    return dist.group.WORLD if dist.is_available() and dist.is_initialized() else None


def _address(launch: LaunchInfo) -> tuple[str, int]:
    """Rank 0's rendezvous address and a free port on it."""
    host = _host(launch)
    return host, free_port("127.0.0.1" if _one_node(launch) else host)


def _host(launch: LaunchInfo) -> str:
    """Rank 0's rendezvous address: the launch's master address, loopback for a one-node job,
    else its host's address."""
    if launch.master_addr:
        return launch.master_addr
    return "127.0.0.1" if _one_node(launch) else socket.gethostbyname(socket.gethostname())


def _one_node(launch: LaunchInfo) -> bool:
    return launch.num_nodes == 1 and launch.local_world_size == launch.world_size


def _missing(choice: str | bool, why: str) -> tuple[None, None, str]:
    if choice is True:
        raise BackendUnavailableError(
            f"init(torch_group=True) cannot make torch's default process group: {why}. HINT: "
            f"{install_hint('distcomm-torch')} (it brings torch), or torch_group='auto'.",
            reason=why,
        )
    return None, None, f"torch group: none ({why})"


def _setting_up(comm: Communicator) -> contextlib.AbstractContextManager[None]:
    """Calls that are init's, not the program's (``BaseCommunicator._setting_up``); a
    communicator of another kind counts them as it does."""
    if isinstance(comm, BaseCommunicator):
        return comm._setting_up()
    return contextlib.nullcontext()
