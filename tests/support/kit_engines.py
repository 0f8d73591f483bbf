"""Small engines for the kit's tests (:mod:`distcomm.backend.engine`), and communicators over them.

:class:`Idle` moves nothing (each required method raises NotImplementedError: a test subclasses
it and defines what it needs); :class:`Minimal` is fakelink's engine reduced to the methods every
engine must define, so that the kit's defaults of the optional operations run over it.
"""

from __future__ import annotations

from typing import Any

from distcomm.backend import BaseCommunicator, Capabilities, LaunchInfo
from distcomm.backend.engine import OPTIONAL, REQUIRED
from distcomm.fakelink import FakeLinkEngine

__all__ = ["OPERATIONS", "Idle", "Minimal", "over"]

#: Rank 0 of 2, launched by ``env``: the default launch of :func:`over`.
PAIR = LaunchInfo("env", 0, 2, 0, 2, 0, 1)
#: The optional operations (the kit has a default of each, built on the required methods).
OPERATIONS = OPTIONAL[: OPTIONAL.index("plan")]


class Idle:
    """An engine that moves nothing: each required method raises NotImplementedError."""

    def _never(self, *args: Any) -> Any:
        raise NotImplementedError(f"{type(self).__qualname__} moves nothing")

    all_reduce = broadcast = all_gather_into = isend = irecv = split = _never


#: fakelink's engine without its optional operations (:data:`OPERATIONS`): the kit's defaults
#: run over its required methods; its life and failure methods (``bind``, ``peer_progress``,
#: ...) are fakelink's.
Minimal: type = type(
    "Minimal",
    (),
    {
        name: value
        for name, value in vars(FakeLinkEngine).items()
        if name not in OPERATIONS and name not in ("__dict__", "__weakref__")
    }
    | {
        "__doc__": "fakelink's engine reduced to the required methods (and its life and "
        "failure ones): the kit's defaults of the optional operations run over it.",
        "__module__": __name__,
        "__qualname__": "Minimal",
    },
)
assert all(callable(getattr(Minimal, name, None)) for name in REQUIRED)
assert not any(hasattr(Minimal, name) for name in OPERATIONS)


def over(
    engine: Any,
    *,
    backend: str = "standin",
    rank: int = 0,
    world_size: int = 2,
    launch: LaunchInfo = PAIR,
    timeout: float = 1800.0,
    capabilities: Capabilities | None = None,
) -> BaseCommunicator:
    """The communicator of ``rank`` of ``world_size`` over ``engine`` (the kit binds it), with
    ``capabilities`` (default: every one, as fakelink's, but node memory: its proof is a
    collective that a stand-in engine in one process cannot make)."""
    return BaseCommunicator(
        engine,
        backend=backend,
        capabilities=Capabilities(node_memory=False) if capabilities is None else capabilities,
        rank=rank,
        world_size=world_size,
        launch=launch,
        timeout=timeout,
    )
