"""What ``init()`` was asked: its arguments parsed once into a typed, frozen :class:`InitRequest`.

Parsing normalises each value (the backend name's one spelling, a timeout in seconds, a device
string) and rejects bad ones with the valid choices; :func:`apply_overrides` applies the rank,
world size and master address and port to the detected launch.
"""

from __future__ import annotations

import dataclasses
import datetime
from typing import Any

from distcomm import _settings
from distcomm._plugins.names import normalise_backend
from distcomm._runtime import torch_group as torch_groups
from distcomm.environment.info import LaunchInfo
from distcomm.errors import InvalidArgumentError

__all__ = ["DEFAULT_TIMEOUT", "InitRequest", "apply_overrides", "resolve_timeout"]

DEFAULT_TIMEOUT = _settings.DEFAULT_TIMEOUT


@dataclasses.dataclass(frozen=True)
class InitRequest:
    """The arguments of one ``init()`` call, parsed; None where not given.

    Attributes:
        backend: the backend name, normalised (``" GLOO"`` -> ``"gloo"``).
        method: the launch method as given.
        rank, world_size, master_addr, master_port: overrides of what the launch says.
        timeout: seconds.
        device: ``"cpu"``, ``"cuda"`` or ``"cuda:N"``.
        debug: the mismatch check policy (``"sample"``, ``"check"`` or ``"off"``).
        torch_group: whether to make torch's default process group beside a non-torch
            backend (``"auto"``, True or False), or over distcomm (``"distcomm"``;
            :mod:`~distcomm._runtime.torch_group`).
        objects: how a peer's objects are unpickled (``"restricted"`` or ``"pickle"``;
            :mod:`~distcomm._unpickling`).
        options: the backend factory's own options.
    """

    backend: str | None = None
    method: str | None = None
    rank: int | None = None
    world_size: int | None = None
    master_addr: str | None = None
    master_port: int | None = None
    timeout: float | None = None
    device: str | None = None
    debug: str | None = None
    torch_group: str | bool | None = None
    objects: str | None = None
    options: dict[str, Any] = dataclasses.field(default_factory=dict)

    @classmethod
    def parse(
        cls,
        backend: Any = None,
        method: str | None = None,
        *,
        rank: int | None = None,
        world_size: int | None = None,
        master_addr: str | None = None,
        master_port: int | None = None,
        timeout: float | datetime.timedelta | None = None,
        device: Any = None,
        debug: str | None = None,
        torch_group: str | bool | None = None,
        objects: str | None = None,
        options: dict[str, Any] | None = None,
    ) -> InitRequest:
        """Parse ``init``'s arguments.

        Raises:
            InvalidArgumentError: a timeout, a device, a check policy, a torch group choice or
                an object policy that is not one.
        """
        return cls(
            backend=None if backend is None else normalise_backend(str(backend)),
            method=method,
            rank=rank,
            world_size=world_size,
            master_addr=master_addr,
            master_port=master_port,
            timeout=None if timeout is None else resolve_timeout(timeout),
            device=None if device is None else _check_device(device),
            debug=None if debug is None else _settings.convert("DISTCOMM_DEBUG", debug, "debug"),
            torch_group=None if torch_group is None else torch_groups.policy(torch_group),
            objects=None
            if objects is None
            else _settings.convert("DISTCOMM_OBJECTS", objects, "objects"),
            options=dict(options or {}),
        )

    def given(self) -> dict[str, Any]:
        """The arguments that were given, by name (options flattened in), to compare with the
        running world's."""
        fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        del fields["options"]
        return {k: v for k, v in {**fields, **self.options}.items() if v is not None}


def resolve_timeout(timeout: float | datetime.timedelta | None) -> float:
    """Seconds from a number, a timedelta, or (None) ``DISTCOMM_TIMEOUT`` / the default 1800."""
    if timeout is None:
        seconds = _settings.read("DISTCOMM_TIMEOUT")
        return DEFAULT_TIMEOUT if seconds is None else float(seconds)
    return float(_settings.convert("DISTCOMM_TIMEOUT", timeout, "timeout"))


def _check_device(device: Any) -> str:
    if type(device).__name__ == "device" and hasattr(device, "type"):
        device = str(device)
    if isinstance(device, str):
        text = device.strip().lower()
        kind, colon, index = text.partition(":")
        if (kind == "cpu" and not colon) or (kind == "cuda" and (not colon or index.isdigit())):
            return text
    raise InvalidArgumentError(
        f"device={device!r} is not a device; valid: 'cpu', 'cuda', 'cuda:N' or a torch.device. "
        "HINT: omit it to use the local rank's GPU on GPU backends."
    )


def apply_overrides(launch: LaunchInfo, request: InitRequest) -> LaunchInfo:
    """Return ``launch`` with the request's rank, world_size, master_addr and master_port.

    With no launcher (``single_node``), rank and world_size come together and define the
    world. Under a launcher they may only repeat what the launcher says: a value that differs
    would make the rendezvous wait for ranks that never start.

    Raises:
        InvalidArgumentError: a value that is not an int or out of range, rank or world_size
            alone on one node, or a rank or world_size that differs from the launcher's.
    """
    changes = _changes(request)
    if not changes:
        return launch
    _check_ranges(launch, changes)
    _check_agrees(launch, changes)
    if launch.agent_store and ("master_addr" in changes or "master_port" in changes):
        changes["agent_store"] = False  # the launcher's store is not at the address given
    updated = launch.replace(**changes)
    if launch.method == "single_node" and "world_size" in changes:
        updated = updated.replace(
            "derived: init arguments on one node",
            local_rank=updated.rank,
            local_world_size=updated.world_size,
        )
    return updated


def _changes(request: InitRequest) -> dict[str, Any]:
    """The launch fields the request sets; the ints checked to be ints."""
    changes: dict[str, Any] = {}
    examples = {"rank": 0, "world_size": 2, "master_port": 29500}
    for name in ("rank", "world_size", "master_port"):
        value = getattr(request, name)
        if value is not None:
            if not isinstance(value, int) or isinstance(value, bool):
                raise InvalidArgumentError(
                    f"{name}={value!r} must be an int, not {type(value).__name__}. "
                    f"HINT: pass an int, e.g. init({name}={examples[name]})."
                )
            changes[name] = value
    if request.master_addr is not None:
        changes["master_addr"] = str(request.master_addr)
    return changes


def _check_ranges(launch: LaunchInfo, changes: dict[str, Any]) -> None:
    """Rank and world_size together on one node, each in range; a port that is one."""
    if ("rank" in changes) != ("world_size" in changes) and launch.method == "single_node":
        raise InvalidArgumentError(
            f"init got {'rank' if 'rank' in changes else 'world_size'} without the other, and no "
            "launcher says it. HINT: pass both rank= and world_size=."
        )
    size = changes.get("world_size", launch.world_size)
    if size < 1:
        raise InvalidArgumentError(
            f"world_size={size!r} must be at least 1. HINT: pass the number of processes."
        )
    if "rank" in changes and not 0 <= changes["rank"] < size:
        where = "the argument" if "world_size" in changes else launch.sources.get("world_size", "?")
        raise InvalidArgumentError(
            f"rank={changes['rank']!r} is not a rank of a world of {size} (world_size={size} "
            f"from {where}): valid ranks are 0..{size - 1}. HINT: ranks count from 0; pass "
            "0 <= rank < world_size."
        )
    port = changes.get("master_port")
    if port is not None and not 0 <= port <= 65535:
        raise InvalidArgumentError(
            f"master_port={port!r} is not a TCP port: valid ports are 0..65535. "
            "HINT: pass a free port on the master's host, e.g. init(master_port=29500)."
        )


def _check_agrees(launch: LaunchInfo, changes: dict[str, Any]) -> None:
    """Under a launcher, rank and world_size may only repeat the launcher's."""
    differs = [
        (name, changes[name], getattr(launch, name))
        for name in ("rank", "world_size")
        if name in changes and changes[name] != getattr(launch, name)
    ]
    if not differs or launch.method == "single_node":
        return
    size = changes.get("world_size", launch.world_size)
    given = ", ".join(f"{name}={mine!r}" for name, mine, _ in differs)
    said = ", ".join(
        f"{name}={theirs!r} (from {launch.sources.get(name, 'the launcher')})"
        for name, _, theirs in differs
    )
    omit = " and ".join(f"{name}=" for name, _, _ in differs)
    hint = f"omit {omit} to use the launcher's {'values' if len(differs) > 1 else 'value'}"
    if size != launch.world_size:
        hint += f", or start {size} processes with the launcher"
    raise InvalidArgumentError(
        f"init({given}) disagrees with the {launch.method} launch, which says {said}; the "
        f"rendezvous would wait for ranks that never start. HINT: {hint}."
    )
