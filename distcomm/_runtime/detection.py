"""Launch detection over the registered environments (built-in and plugins').

:mod:`distcomm.environment` detects from the environments it is given; these two functions give
it what the plugins registered, loading them on first use.
"""

from __future__ import annotations

from collections.abc import Mapping

from distcomm._plugins.loader import get_registry
from distcomm.environment.detect import detect_launch, explain_launch
from distcomm.environment.info import LaunchInfo

__all__ = ["detect_environment", "explain_detection"]


def detect_environment(
    method: str | None = None, environ: Mapping[str, str] | None = None
) -> LaunchInfo:
    """Detect how this process was launched.

    Args:
        method: the launch method to use (``"env"``, ``"slurm"``, ``"mpi"``, ``"single_node"``
            or a plugin's); None means ``DISTCOMM_INIT_METHOD`` from ``environ`` if set, else
            every registered method by descending priority (ties by name), the first that
            matches. ``single_node`` always matches, last.
        environ: the environment to read; defaults to ``os.environ``. It is only read.

    Returns:
        The detected launch; ``sources`` says where each field came from, and
        ``sources["method"]`` why this method matched.

    Raises:
        InvalidArgumentError: ``method`` names no registered environment.
        EnvironmentDetectionError: ``method`` was given but its launcher did not start this
            process, or a launcher variable is present but malformed.
    """
    return detect_launch(get_registry().environments, method, environ)


def explain_detection(environ: Mapping[str, str] | None = None) -> list[str]:
    """Say, one line per registered environment in detection order, what detection finds.

    Lines read ``"env: not detected"``, ``"slurm: detected (<why>)"`` or
    ``"mpi: error: <message>"``; the list stops where detection stops.

    Args:
        environ: the environment to read; defaults to ``os.environ``. It is only read.
    """
    return explain_launch(get_registry().environments, environ)
