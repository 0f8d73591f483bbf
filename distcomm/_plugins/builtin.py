"""The built-in launch environments, registered through the same hook a plugin uses.

Priorities give the automatic order of docs/launch.md#precedence: ``env`` (400) > ``slurm``
(300) > ``mpi`` (200) > plugin environments (100 unless they say otherwise) > ``single_node``,
the fallback that always matches and so always comes last.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from distcomm.backend.hooks import hookimpl
from distcomm.backend.specs import EnvironmentSpec
from distcomm.environment import env, mpi, single_node, slurm

if TYPE_CHECKING:
    from distcomm.backend.registry import Registry

__all__ = ["FALLBACK_PRIORITY", "distcomm_register_environments"]

#: single_node's priority: below any priority a plugin would choose.
FALLBACK_PRIORITY = -(10**9)


@hookimpl
def distcomm_register_environments(registry: Registry) -> None:
    """Register ``env``, ``slurm``, ``mpi`` and ``single_node``."""
    registry.add_environment(EnvironmentSpec("env", env.detect, priority=400))
    registry.add_environment(EnvironmentSpec("slurm", slurm.detect, priority=300))
    registry.add_environment(EnvironmentSpec("mpi", mpi.detect, priority=200))
    registry.add_environment(
        EnvironmentSpec("single_node", single_node.detect, priority=FALLBACK_PRIORITY)
    )
