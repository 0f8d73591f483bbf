"""The entry point: registers ``linklink`` with distcomm. Imports neither linklink nor torch."""

from __future__ import annotations

import importlib.util
import sys
from typing import Any

from distcomm import LaunchInfo
from distcomm.backend import KIT_API, BackendSpec, Capabilities, Registry, hookimpl

__all__ = ["LINKLINK_CAPABILITIES", "distcomm_register_backends", "find_module", "is_available"]

#: What linklink's API offers: SUM/MAX/MIN all-reduce, broadcast, all-gather, world-made groups.
#: No point-to-point messages, no timeouts; its async allreduce waits with ``synchronize()``.
LINKLINK_CAPABILITIES = Capabilities(
    dtypes=frozenset({"uint8", "int8", "int32", "int64", "float16", "float32", "float64"}),
    reduce_ops=frozenset({"SUM", "MAX", "MIN"}),
    async_ops=False,
    timeouts=False,
    any_source=False,
    p2p=False,
    subgroup_split=False,
    node_memory=False,  # linklink moves GPU memory; node memory carries CPU tensors only
)
_NAMES = ("linklink", "spring.linklink")


def find_module() -> tuple[str | None, str]:
    """(the importable linklink module's name or None, why). The reasons carry no HINT: distcomm
    adds its one hint for the linklink backend (what to install, what to use instead) wherever
    it says that linklink cannot run."""
    for name in _NAMES:
        loaded = sys.modules.get(name)
        if getattr(loaded, "__distcomm_shim__", False):
            return None, (
                f"`{name}` is distcomm.compat.linklink (install() was called), not the linklink "
                "library: the backend cannot run on distcomm itself"
            )
        try:
            found = loaded is not None or importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):
            found = False
        if found:
            return name, f"`import {name}` works"
    return None, "neither `linklink` nor `spring.linklink` can be imported"


def is_available(launch: LaunchInfo) -> tuple[bool, str]:
    name, why = find_module()
    return name is not None, why


def _create(launch: LaunchInfo, **options: Any) -> Any:
    from distcomm_linklink.communicator import create

    return create(launch, **options)


@hookimpl
def distcomm_register_backends(registry: Registry) -> None:
    """Register linklink (priority 0: only when asked for)."""
    registry.add_backend(
        BackendSpec(
            name="linklink",
            factory=_create,
            is_available=is_available,
            priority=0,
            devices=frozenset({"cpu", "cuda"}),
            capabilities=LINKLINK_CAPABILITIES,
            description="SenseTime linklink (linklink or spring.linklink), when installed",
            kit_api=KIT_API,
        )
    )
