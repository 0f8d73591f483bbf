"""A torch default process group beside a backend that makes none (mpi, linklink, plugins).

torch-native code (DDP, FSDP, Accelerate, Ignite) reaches for torch's default process group.
The torch backends make it; after any other backend, ``init(torch_group=...)`` (or
``DISTCOMM_TORCH_GROUP``) makes one too, through the ``gloo`` backend (``nccl`` when the device
is a GPU) of the torch plugin, so the same code runs under mpirun as under torchrun:

- ``"auto"`` (the default): only when the program has imported torch before ``init()`` (a
  numpy-only MPI program pays nothing), the world is larger than 1 and no default group exists;
- ``True``: whenever the world is larger than 1 and no default group exists (torch is imported;
  an error names what to install when it cannot be);
- ``False``: never.

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
from distcomm.environment.info import LaunchInfo
from distcomm.errors import BackendUnavailableError, InvalidArgumentError
from distcomm.protocol import Communicator

__all__ = ["CHOICES", "make", "policy"]

#: What ``init(torch_group=...)`` takes.
CHOICES = ("auto", True, False)


def policy(given: Any = None, environ: Mapping[str, str] | None = None) -> str | bool:
    """``init``'s ``torch_group``, else ``DISTCOMM_TORCH_GROUP``, else ``"auto"``.

    Raises:
        InvalidArgumentError: a value that is none of :data:`CHOICES`.
    """
    if given is not None:
        if given in CHOICES and not (isinstance(given, int) and not isinstance(given, bool)):
            return str(given) if isinstance(given, str) else bool(given)
        raise InvalidArgumentError(
            f"torch_group={given!r} is not a choice; valid: 'auto', True, False. HINT: 'auto' "
            "makes torch's default process group when the program imported torch."
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
) -> tuple[Communicator | None, Any, str]:
    """Make torch's default process group beside ``comm`` where ``choice`` says so.

    Returns:
        The torch backend's communicator over the new group (None if none was made), torch's
        default group (the new one, or one the program had made; None if there is none), and a
        sentence for the trace saying why.

    Raises:
        BackendUnavailableError: ``choice`` is True and torch or distcomm-torch is missing.
    """
    if getattr(comm, "torch_group", None) is not None:
        return None, None, "torch group: the backend's own"
    found = _default_group()
    if found is not None:
        return None, found, "torch group: the program's own (left as it is)"
    if choice is False:
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
    with _setting_up(comm):  # not the program's operation #1
        addr, port = comm.broadcast_object(_address(launch) if comm.rank == 0 else None, src=0)
    beside = launch.replace(
        f"derived: rank 0's, over the {comm.backend} communicator",
        master_addr=addr,
        master_port=port,
    )
    engine = spec.factory(beside, timeout=timeout, device=device, companion=True)
    made = world_over(spec, engine, beside, timeout)
    logger.info("made torch's default process group (%s) at %s:%s", name, addr, port)
    why = f"torch group: {name}, made beside {comm.backend} (rendezvous {addr}:{port})"
    return made, dist.group.WORLD, why


def _default_group() -> Any:
    """torch's default process group if the program imported torch and has one, else None."""
    if "torch" not in sys.modules:
        return None
    import torch.distributed as dist

    return dist.group.WORLD if dist.is_available() and dist.is_initialized() else None


def _address(launch: LaunchInfo) -> tuple[str, int]:
    """Rank 0's rendezvous address and a free port on it."""
    one_node = launch.num_nodes == 1 and launch.local_world_size == launch.world_size
    if launch.master_addr:
        host = launch.master_addr
    else:
        host = "127.0.0.1" if one_node else socket.gethostbyname(socket.gethostname())
    return host, free_port("127.0.0.1" if one_node else host)


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
