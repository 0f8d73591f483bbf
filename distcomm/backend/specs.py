"""What plugins register: :class:`BackendSpec`, :class:`EnvironmentSpec`, and (defined beside the
protocol, :mod:`distcomm.protocol`) :class:`Capabilities`."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from distcomm.errors import NotSupportedError
from distcomm.protocol import ALL_DTYPES, ALL_OPS, DTYPE_NAMES, FLOAT_DTYPES, Capabilities

if TYPE_CHECKING:
    from distcomm.environment import LaunchInfo

__all__ = [
    "ALL_DTYPES",
    "ALL_OPS",
    "DTYPE_NAMES",
    "FLOAT_DTYPES",
    "KIT_API",
    "KIT_APIS",
    "BackendSpec",
    "Capabilities",
    "EnvironmentSpec",
]

#: The version of the contract between distcomm and a backend (what a backend defines and
#: calls: docs/plugins.md, "The engine contract") that this distcomm provides. A backend declares
#: the version it was written for (``BackendSpec(kit_api=...)``); a change that breaks a backend
#: written for the old contract comes with a new version. 1: a subclass of the kit's
#: communicator overriding ``_``-named primitives; 2: an engine object the kit's communicator
#: holds (:mod:`distcomm.backend.engine`).
KIT_API = 2
#: The versions this distcomm runs backends of.
KIT_APIS = frozenset({KIT_API})


@dataclasses.dataclass(frozen=True)
class BackendSpec:
    """A backend, as a plugin registers it with ``registry.add_backend(spec)``.

    Attributes:
        name: what users pass as ``backend=``, lower case.
        factory: ``factory(launch_info, *, timeout, device, **options) -> engine`` (the
            engine of the world: :mod:`distcomm.backend.engine`); import heavy engines here.
        is_available: ``is_available(launch_info) -> (bool, reason)``; cheap, never initialises.
        priority: place in the automatic order (higher first); 0 means only when asked for.
        devices: the tensor devices the engine moves natively, e.g. ``{"cpu"}``.
        capabilities: what the engine does natively.
        description: one line for ``distcomm info``.
        kit_api: the version of the kit's contract the backend was written for
            (:data:`KIT_API` when written for this distcomm); one this distcomm does not run
            (:data:`KIT_APIS`), or none, raises NotSupportedError naming both and the fix.
        makes_torch_group: the engine's group is torch's default process group (gloo, nccl):
            with ``init(torch_group="distcomm")`` its factory is passed
            ``torch_group="distcomm"`` and makes its group beside torch's default group,
            which then runs over distcomm (docs/interop.md).
    """

    name: str
    factory: Callable[..., Any]
    is_available: Callable[[LaunchInfo], tuple[bool, str]]
    priority: int = 0
    devices: frozenset[str] = frozenset({"cpu"})
    capabilities: Capabilities = Capabilities()  # noqa: RUF009 (frozen: one shared default)
    description: str = ""
    kit_api: int | None = None
    makes_torch_group: bool = False

    def __post_init__(self) -> None:
        _check_name("backend", self.name)
        object.__setattr__(self, "devices", frozenset(self.devices))
        if self.kit_api not in KIT_APIS:
            raise NotSupportedError(_other_kit_api(self.name, self.kit_api))


@dataclasses.dataclass(frozen=True)
class EnvironmentSpec:
    """A launch environment, as a plugin registers it with ``registry.add_environment(spec)``.

    Attributes:
        name: the method name users pass as ``method=``.
        detect: ``detect(environ) -> LaunchInfo | None``; pure: reads the mapping, writes nothing.
            Returns None when this launcher did not start the process, raises
            EnvironmentDetectionError when it did but a value is malformed.
        priority: place in the automatic order (higher first). Built-ins: env 400, slurm 300,
            mpi 200; single_node is the fallback after every other.
    """

    name: str
    detect: Callable[[Mapping[str, str]], LaunchInfo | None]
    priority: int = 100

    def __post_init__(self) -> None:
        _check_name("environment", self.name)


@dataclasses.dataclass(frozen=True)
class AdapterSpec:
    """A framework's process groups over distcomm's communicators, as a plugin registers it
    with ``registry.add_adapter(spec)`` (distcomm-torch's ``"torch"``: torch.distributed's
    backend ``"distcomm"``).

    Attributes:
        name: the framework, lower case (``init(torch_group="distcomm")`` asks for ``"torch"``).
        install: ``install()``: make the adapter reachable from the framework (register torch's
            backend name); ``init()`` calls it when the program has imported the framework.
        make: ``make(comm, host, share, timeout) -> handle``: make the framework's default
            group over ``comm``. Rank 0 serves its store at ``host`` (None for a world of 1, or
            where the backend made one) and tells the others its port with ``share(value)``,
            which returns rank 0's value on every rank (init's own call over ``comm``).
            ``handle.group`` is the group, ``handle.address`` where its store is (or None), and
            ``handle.finalize()`` destroys it.
        description: one line for ``distcomm info``.
    """

    name: str
    install: Callable[[], None]
    make: Callable[..., Any]
    description: str = ""

    def __post_init__(self) -> None:
        _check_name("adapter", self.name)


def _other_kit_api(name: str, declared: Any) -> str:
    """The error of backend ``name`` written for kit API ``declared`` (None: none declared)."""
    runs = " and ".join(str(v) for v in sorted(KIT_APIS))
    written = (
        "declares no kit API version"
        if declared is None
        else f"was written for distcomm's kit API {declared!r}"
    )
    other = "" if declared is None else f", or a distcomm release that runs kit API {declared!r}"
    return (
        f"backend {name!r} {written}, and this distcomm runs backends of kit API {runs} only. "
        f"HINT: install a release of the plugin written for kit API {KIT_API} (pip install -U "
        f'<the plugin>){other}; if you wrote the backend, check it against docs/plugins.md ("The '
        f'kit API version") and declare BackendSpec(kit_api=distcomm.backend.KIT_API).'
    )


def _check_name(kind: str, name: Any) -> None:
    if not isinstance(name, str) or not name or name != name.strip().lower():
        raise ValueError(f"{kind} name {name!r} must be a non-empty lower-case string")
