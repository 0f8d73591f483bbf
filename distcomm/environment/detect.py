"""Launch detection: which launcher started this process, and what it says about the job.

:func:`detect_launch` asks each given environment (built-in or from a plugin) in priority order
and returns the first :class:`~distcomm.environment.info.LaunchInfo` one gives;
:func:`explain_launch` says in words what each was asked and answered. Detection is pure: it
reads a snapshot of the environment and writes nothing, and it is given the environments to ask
(``distcomm.detect_environment`` passes the registered ones).
"""

from __future__ import annotations

import os
import types
from collections.abc import Callable, Mapping
from typing import Protocol

from distcomm import _settings
from distcomm.environment.info import LaunchInfo
from distcomm.errors import EnvironmentDetectionError, InvalidArgumentError, did_you_mean

__all__ = ["REQUIRED_VARIABLES", "detect_launch", "explain_launch"]


class _Spec(Protocol):
    """What detection reads of an environment a plugin registered
    (:class:`distcomm.backend.EnvironmentSpec`, a layer above)."""

    @property
    def name(self) -> str: ...
    @property
    def detect(self) -> Callable[[Mapping[str, str]], LaunchInfo | None]: ...
    @property
    def priority(self) -> int: ...


#: The environments to ask, by name (what plugins registered).
Specs = Mapping[str, _Spec]

#: What each built-in method needs to find, for the error when it was asked for but not found.
REQUIRED_VARIABLES = {
    "env": "RANK and WORLD_SIZE",
    "slurm": "an srun task step (SLURM_STEP_ID, SLURM_PROCID)",
    "mpi": "an MPI launcher's rank/size variables (OMPI_COMM_WORLD_*, PMI_RANK/PMI_SIZE, ...)",
}


def detect_launch(
    specs: Specs, method: str | None = None, environ: Mapping[str, str] | None = None
) -> LaunchInfo:
    """Detect how this process was launched, asking ``specs`` (environments by name).

    ``distcomm.detect_environment(method, environ)`` is this over the registered environments;
    its docstring says what ``method`` and ``environ`` mean, what is returned and raised.
    """
    snapshot = _snapshot(environ)
    origin = "method"
    if method is None:
        method = _settings.read("DISTCOMM_INIT_METHOD", snapshot)
        origin = "DISTCOMM_INIT_METHOD"
    if method is not None:
        spec = _spec(specs, method, origin)
        info = spec.detect(snapshot)
        if info is None:
            needs = REQUIRED_VARIABLES.get(spec.name, "the variables its plugin documents")
            raise EnvironmentDetectionError(
                f"{origin}={method!r} was requested, but this process was not launched that way: "
                f"{spec.name!r} needs {needs}. HINT: launch with that launcher, or leave "
                "method unset (and DISTCOMM_INIT_METHOD unset) to detect the launcher.",
                variable=None if origin == "method" else origin,
                value=method,
            )
        return info
    for spec in _ordered(specs):
        info = spec.detect(snapshot)
        if info is not None:
            return info
    raise EnvironmentDetectionError(
        "no registered launch environment matched. HINT: the built-in 'single_node' fallback "
        "is missing; reinstall distcomm.",
    )


def explain_launch(specs: Specs, environ: Mapping[str, str] | None = None) -> list[str]:
    """Say, one line per environment in detection order, what automatic detection finds.

    Lines read ``"env: not detected"``, ``"slurm: detected (<why>)"`` or
    ``"mpi: error: <message>"``; the list stops where detection stops: at the first environment
    that is detected or raises.

    Args:
        specs: the environments to ask, by name.
        environ: the environment to read; defaults to ``os.environ``. It is only read.
    """
    snapshot = _snapshot(environ)
    lines: list[str] = []
    for spec in _ordered(specs):
        try:
            info = spec.detect(snapshot)
        except EnvironmentDetectionError as exc:
            lines.append(f"{spec.name}: error: {exc}")
            break
        if info is not None:
            lines.append(f"{spec.name}: detected ({info.sources.get('method', info.method)})")
            break
        lines.append(f"{spec.name}: not detected")
    return lines


def _snapshot(environ: Mapping[str, str] | None) -> Mapping[str, str]:
    """Return a read-only copy of ``environ`` (default ``os.environ``) for the detectors."""
    return types.MappingProxyType(dict(os.environ if environ is None else environ))


def _ordered(specs: Specs) -> list[_Spec]:
    """Return the environments by descending priority, ties by name."""
    return sorted(specs.values(), key=lambda spec: (-spec.priority, spec.name))


def _spec(specs: Specs, method: str, origin: str = "method") -> _Spec:
    """Return the environment registered as ``method`` (case-insensitive).

    Args:
        specs: the environments, by name.
        method: the method's name.
        origin: where the name came from (``"method"``, the argument, or
            ``"DISTCOMM_INIT_METHOD"``), for the message.
    """
    if not isinstance(method, str):
        raise InvalidArgumentError(
            f"method must be a string, not {method!r}. HINT: use one of {', '.join(sorted(specs))}."
        )
    spec = specs.get(method.strip().lower())
    if spec is None:
        where = "" if origin == "method" else f" (from {origin})"
        suggestion = did_you_mean(method.strip(), specs)
        hint = suggestion or f"use one of {', '.join(sorted(specs))}."
        raise InvalidArgumentError(
            f"unknown launch method {method!r}{where}; available: {', '.join(sorted(specs))}. "
            f"HINT: {hint}"
        )
    return spec
