"""What plugins register: :class:`BackendSpec`, :class:`EnvironmentSpec`, :class:`Capabilities`."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from distcomm._operations import OPERATIONS

if TYPE_CHECKING:
    from distcomm.environment import LaunchInfo
    from distcomm.protocol import Communicator

__all__ = [
    "ALL_DTYPES",
    "ALL_OPS",
    "DTYPE_NAMES",
    "FLOAT_DTYPES",
    "BackendSpec",
    "Capabilities",
    "EnvironmentSpec",
]

#: Every dtype name distcomm accepts, on every backend (some engines bridge through wider types),
#: narrowest first.
DTYPE_NAMES: tuple[str, ...] = (
    "bool",
    "uint8",
    "int8",
    "int16",
    "int32",
    "int64",
    "float16",
    "bfloat16",
    "float32",
    "float64",
)
ALL_DTYPES = frozenset(DTYPE_NAMES)
FLOAT_DTYPES = frozenset({"float16", "bfloat16", "float32", "float64"})
#: Every collective a Communicator offers.
ALL_OPS = frozenset(op.capability for op in OPERATIONS if op.capability)


@dataclasses.dataclass(frozen=True)
class Capabilities:
    """What a backend does natively; the rest distcomm emulates or refuses.

    Attributes:
        ops: collectives the engine runs (see :data:`ALL_OPS`).
        dtypes: dtype names the engine reduces natively; others are bridged through wider types.
        reduce_ops: ReduceOp names the engine has; AVG is emulated with SUM where missing.
        async_ops: whether ``async_op=True`` overlaps with the caller (else it completes eagerly).
        timeouts: whether a blocked operation ends with DistTimeoutError.
        cancellable: whether a blocking call past its timeout can be given up (it raises
            DistTimeoutError); False for engines that cannot (MPI), where distcomm ends the
            job with the same diagnostic instead. ``Work.wait(timeout)`` raises either way.
        any_source: whether ``recv(src=None)`` is supported.
        p2p: whether point-to-point messages (send, recv, isend, irecv) exist at all.
        p2p_tags: whether the engine matches point-to-point messages by tag. Where it does not
            (NCCL ignores tags: a receive takes the next message from its sender, whatever its
            tag), a non-zero tag is refused with InvalidArgumentError instead of two messages
            being silently swapped; tag 0 works, messages matching in the order they are sent.
        subgroup_split: whether a sub-communicator can itself be split (``new_group(...,
            group=g)``, ``g.split``); engines whose groups are made by the whole world cannot.
    """

    ops: frozenset[str] = ALL_OPS
    dtypes: frozenset[str] = ALL_DTYPES
    reduce_ops: frozenset[str] = frozenset(
        {"SUM", "PRODUCT", "MIN", "MAX", "AVG", "BAND", "BOR", "BXOR"}
    )
    async_ops: bool = True
    timeouts: bool = True
    cancellable: bool = True
    any_source: bool = True
    p2p: bool = True
    p2p_tags: bool = True
    subgroup_split: bool = True


@dataclasses.dataclass(frozen=True)
class BackendSpec:
    """A backend, as a plugin registers it with ``registry.add_backend(spec)``.

    Attributes:
        name: what users pass as ``backend=``, lower case.
        factory: ``factory(launch_info, **options) -> Communicator``; import heavy engines here.
        is_available: ``is_available(launch_info) -> (bool, reason)``; cheap, never initialises.
        priority: place in the automatic order (higher first); 0 means only when asked for.
        devices: the tensor devices the engine moves natively, e.g. ``{"cpu"}``.
        capabilities: what the engine does natively.
        description: one line for ``distcomm info``.
    """

    name: str
    factory: Callable[..., Communicator]
    is_available: Callable[[LaunchInfo], tuple[bool, str]]
    priority: int = 0
    devices: frozenset[str] = frozenset({"cpu"})
    capabilities: Capabilities = Capabilities()
    description: str = ""

    def __post_init__(self) -> None:
        _check_name("backend", self.name)
        object.__setattr__(self, "devices", frozenset(self.devices))


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


def _check_name(kind: str, name: Any) -> None:
    if not isinstance(name, str) or not name or name != name.strip().lower():
        raise ValueError(f"{kind} name {name!r} must be a non-empty lower-case string")
