"""The launcher variables ``init(export_env=True)`` sets for env-reading code, and takes back.

Set only where absent (never overwriting); ``finalize()`` removes exactly what was set, unless
someone changed it since.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from distcomm.environment.info import LaunchInfo

__all__ = ["EXPORTED_VARIABLES", "export_env", "unexport_env"]

EXPORTED_VARIABLES = (
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
)


def export_env(launch: LaunchInfo) -> dict[str, str]:
    """Set the variables of ``launch`` that are absent; return what was set."""
    values = (
        launch.rank,
        launch.world_size,
        launch.local_rank,
        launch.local_world_size,
        launch.master_addr,
        launch.master_port,
    )
    exported = {}
    for key, value in zip(EXPORTED_VARIABLES, values, strict=True):
        if value is not None and key not in os.environ:
            os.environ[key] = exported[key] = str(value)
    return exported


def unexport_env(exported: Mapping[str, str]) -> None:
    """Remove what :func:`export_env` set, where it still has the value it set."""
    for key, value in exported.items():
        if os.environ.get(key) == value:
            del os.environ[key]
