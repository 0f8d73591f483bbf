"""The pluggy hooks a distcomm plugin implements (project name ``"distcomm"``).

A plugin is a module (or object) with functions marked ``@distcomm.backend.hookimpl``, found
through the ``distcomm`` entry-point group or the ``DISTCOMM_PLUGINS`` variable. Both hooks are
*historic*: a plugin registered at any time is called once, right after it is registered, with the
registry.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pluggy

if TYPE_CHECKING:
    from distcomm.backend.registry import Registry

__all__ = ["hookimpl", "hookspec"]

hookspec = pluggy.HookspecMarker("distcomm")
hookimpl = pluggy.HookimplMarker("distcomm")


@hookspec(historic=True)
def distcomm_register_backends(registry: Registry) -> None:
    """Register backends with ``registry.add_backend(BackendSpec(...))``.

    Called once per plugin, when distcomm first loads its plugins (the first ``init()``,
    ``distcomm info`` or ``detect_environment()``), never at ``import distcomm``. Import no
    engine here: torch or mpi4py belong inside the spec's ``factory`` and ``is_available``.
    """


@hookspec(historic=True)
def distcomm_register_environments(registry: Registry) -> None:
    """Register launch environments with ``registry.add_environment(EnvironmentSpec(...))``.

    Called at the same time as :func:`distcomm_register_backends`.
    """
