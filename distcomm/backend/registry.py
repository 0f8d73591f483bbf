"""The registry plugins fill in: backends and launch environments by name, and who added each.

Plugins receive a :class:`Registry` in their hooks (:mod:`distcomm.backend.hooks`) and call
:meth:`Registry.add_backend` / :meth:`Registry.add_environment`. Loading the plugins (pluggy,
entry points) is the core's business, not the kit's.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from distcomm.backend.specs import AdapterSpec, BackendSpec, EnvironmentSpec
from distcomm.errors import PluginConflictError

__all__ = ["CORE_DISTRIBUTION", "PluginRecord", "Registry"]

#: The distribution name of distcomm's own plugins (fakelink, the built-in environments).
CORE_DISTRIBUTION = "distcomm"


@dataclasses.dataclass
class PluginRecord:
    """One plugin as loaded: where it came from, and the error if it failed.

    Attributes:
        name: the entry-point name (or module name for ``DISTCOMM_PLUGINS``).
        distribution: the distribution that provides it.
        version: that distribution's version, when known.
        error: why it failed to load or register, else None.
        blocked: True when ``DISTCOMM_DISABLE_PLUGINS`` named it (it was not loaded).
        backends: backend names it registered.
        environments: environment names it registered.
    """

    name: str
    distribution: str
    version: str | None = None
    error: str | None = None
    blocked: bool = False
    backends: list[str] = dataclasses.field(default_factory=list)
    environments: list[str] = dataclasses.field(default_factory=list)


class Registry:
    """Backends and launch environments registered by plugins, keyed by name.

    Plugins receive the registry in their hooks and call :meth:`add_backend` and
    :meth:`add_environment`. Two plugins registering one name is a
    :class:`~distcomm.errors.PluginConflictError` naming both distributions: the second plugin is
    rejected, and the name is marked conflicted so that nobody gets either silently.
    """

    def __init__(self) -> None:
        self._backends: dict[str, BackendSpec] = {}
        self._environments: dict[str, EnvironmentSpec] = {}
        self._adapters: dict[str, AdapterSpec] = {}
        self._owners: dict[tuple[str, str], str] = {}
        self.conflicts: dict[tuple[str, str], str] = {}
        self.plugins: list[PluginRecord] = []
        self.notes: list[str] = []
        #: The plugin whose hooks are running (whose additions are recorded on it).
        self._current: PluginRecord | None = None

    # -- what plugins call -------------------------------------------------------------------
    def add_backend(self, spec: BackendSpec) -> None:
        """Register a backend. Call from ``distcomm_register_backends``."""
        if not isinstance(spec, BackendSpec):
            raise TypeError(f"add_backend() takes a distcomm.backend.BackendSpec, not {spec!r}")
        self._add("backend", spec.name, spec, self._backends)

    def add_environment(self, spec: EnvironmentSpec) -> None:
        """Register a launch environment. Call from ``distcomm_register_environments``."""
        if not isinstance(spec, EnvironmentSpec):
            raise TypeError(
                f"add_environment() takes a distcomm.backend.EnvironmentSpec, not {spec!r}"
            )
        self._add("environment", spec.name, spec, self._environments)

    def add_adapter(self, spec: AdapterSpec) -> None:
        """Register a framework's adapter. Call from ``distcomm_register_backends``."""
        if not isinstance(spec, AdapterSpec):
            raise TypeError(f"add_adapter() takes a distcomm.backend.AdapterSpec, not {spec!r}")
        self._add("adapter", spec.name, spec, self._adapters)

    def _add(self, kind: str, name: str, spec: Any, table: dict[str, Any]) -> None:
        record = self._current
        distribution = record.distribution if record else "<unknown>"
        owner = self._owners.get((kind, name))
        if owner is not None:
            remedy = (
                f"remove {record.name!r} from DISTCOMM_PLUGINS"
                if record is not None and distribution == "DISTCOMM_PLUGINS"
                else f"uninstall one of them (pip uninstall {distribution}), or block one with "
                "DISTCOMM_DISABLE_PLUGINS"
            )
            message = (
                f"{kind} {name!r} is registered by both {owner} and {distribution}. HINT: {remedy}."
            )
            if owner != CORE_DISTRIBUTION:
                self.conflicts[(kind, name)] = message
            raise PluginConflictError(message)
        table[name] = spec
        self._owners[(kind, name)] = distribution
        if record is not None and kind != "adapter":
            (record.backends if kind == "backend" else record.environments).append(name)

    # -- what distcomm reads -----------------------------------------------------------------
    @property
    def backends(self) -> dict[str, BackendSpec]:
        """Registered backends by name (a copy)."""
        return dict(self._backends)

    @property
    def environments(self) -> dict[str, EnvironmentSpec]:
        """Registered environments by name (a copy)."""
        return dict(self._environments)

    @property
    def adapters(self) -> dict[str, AdapterSpec]:
        """Registered adapters by framework name (a copy)."""
        return dict(self._adapters)

    def distribution_of(self, backend: str) -> str | None:
        """Return the distribution that registered ``backend``, or None."""
        return self._owners.get(("backend", backend))
