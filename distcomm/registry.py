"""The plugin registry: pluggy, entry-point loading, and the backends and environments plugins add.

Nothing here runs at ``import distcomm``. The first call that needs plugins (``init()``,
``distcomm info``, ``detect_environment()``) calls :func:`get_registry`, which loads, in order:
the core's own plugins (fakelink and the built-in launch environments, through the same hooks a
third party uses), every entry point of the ``distcomm`` group that ``DISTCOMM_DISABLE_PLUGINS``
does not block, and the modules named in ``DISTCOMM_PLUGINS``. A plugin that fails to import or
to register is recorded with its error (``distcomm info`` shows it); it never stops the others.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.metadata
import os
import threading
import traceback
from collections.abc import Iterable, Mapping
from typing import Any

import pluggy

from distcomm import hookspecs
from distcomm.errors import PluginConflictError
from distcomm.logs import configure_from_env, logger
from distcomm.specs import BackendSpec, EnvironmentSpec

__all__ = [
    "ENTRY_POINT_GROUP",
    "FIRST_PARTY_BACKENDS",
    "FIRST_PARTY_PRIORITIES",
    "PluginRecord",
    "Registry",
    "get_registry",
    "install_hint",
    "reload_registry",
    "set_registry",
]

ENTRY_POINT_GROUP = "distcomm"
CORE_DISTRIBUTION = "distcomm"
#: First-party backends and the distributions that provide them, to say what to install.
FIRST_PARTY_BACKENDS: dict[str, str] = {
    "nccl": "distcomm-torch",
    "gloo": "distcomm-torch",
    "mpi": "distcomm-mpi",
    "linklink": "distcomm-linklink",
}
#: Their places in the automatic order (DESIGN section 4), shown even when not installed.
FIRST_PARTY_PRIORITIES: dict[str, int] = {"nccl": 300, "mpi": 200, "gloo": 100, "linklink": 0}
_CORE_PLUGINS = ("distcomm.fakelink", "distcomm.environment.builtin")


def install_hint(distribution: str) -> str:
    """Return how to install a first-party distribution from a distcomm checkout."""
    return f"pip install ./backends/{distribution}"


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
        self._pm = pluggy.PluginManager(ENTRY_POINT_GROUP)
        self._pm.add_hookspecs(hookspecs)
        self._backends: dict[str, BackendSpec] = {}
        self._environments: dict[str, EnvironmentSpec] = {}
        self._owners: dict[tuple[str, str], str] = {}
        self.conflicts: dict[tuple[str, str], str] = {}
        self.plugins: list[PluginRecord] = []
        self.notes: list[str] = []
        self._current: PluginRecord | None = None
        self._pm.hook.distcomm_register_backends.call_historic(kwargs={"registry": self})
        self._pm.hook.distcomm_register_environments.call_historic(kwargs={"registry": self})

    # -- what plugins call -------------------------------------------------------------------
    def add_backend(self, spec: BackendSpec) -> None:
        """Register a backend. Call from ``distcomm_register_backends``."""
        if not isinstance(spec, BackendSpec):
            raise TypeError(f"add_backend() takes a distcomm.BackendSpec, not {spec!r}")
        self._add("backend", spec.name, spec, self._backends)

    def add_environment(self, spec: EnvironmentSpec) -> None:
        """Register a launch environment. Call from ``distcomm_register_environments``."""
        if not isinstance(spec, EnvironmentSpec):
            raise TypeError(f"add_environment() takes a distcomm.EnvironmentSpec, not {spec!r}")
        self._add("environment", spec.name, spec, self._environments)

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
        if record is not None:
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

    def distribution_of(self, backend: str) -> str | None:
        """Return the distribution that registered ``backend``, or None."""
        return self._owners.get(("backend", backend))

    # -- loading -----------------------------------------------------------------------------
    def register(
        self, plugin: object, name: str, distribution: str, version: str | None = None
    ) -> PluginRecord:
        """Register one plugin object (usually a module) and run its hooks at once.

        Failures are recorded on the returned record, never raised: whatever the plugin had
        registered before failing is taken back out.
        """
        record = PluginRecord(name=name, distribution=distribution, version=version)
        self.plugins.append(record)
        self._current = record
        try:
            self._pm.register(plugin, name=name)
            self._pm.check_pending()
        except Exception as exc:  # a plugin's own bug must not stop distcomm
            record.error = _describe(exc)
            self._unregister(plugin, record)
            logger.warning("distcomm plugin %r (%s) failed: %s", name, distribution, record.error)
        finally:
            self._current = None
        return record

    def _unregister(self, plugin: object, record: PluginRecord) -> None:
        if self._pm.is_registered(plugin):
            self._pm.unregister(plugin)
        for kind, names, table in (
            ("backend", record.backends, self._backends),
            ("environment", record.environments, self._environments),
        ):
            for added in names:
                table.pop(added, None)
                self._owners.pop((kind, added), None)
            names.clear()

    def record_failure(self, name: str, distribution: str, version: str | None, error: str) -> None:
        """Record a plugin that could not even be imported."""
        self.plugins.append(PluginRecord(name, distribution, version, error=error))
        logger.warning("distcomm plugin %r (%s) failed to load: %s", name, distribution, error)

    @classmethod
    def load(
        cls,
        entry_points: Iterable[importlib.metadata.EntryPoint] | None = None,
        environ: Mapping[str, str] | None = None,
    ) -> Registry:
        """Build a registry: core plugins, entry points, then ``DISTCOMM_PLUGINS`` modules.

        Args:
            entry_points: the entry points to load (default: the installed ``distcomm`` group).
            environ: where to read ``DISTCOMM_DISABLE_PLUGINS`` / ``DISTCOMM_PLUGINS``
                (default: ``os.environ``).
        """
        environ = os.environ if environ is None else environ
        configure_from_env(environ)
        registry = cls()
        from distcomm import __version__

        for module_name in _CORE_PLUGINS:
            registry.register(
                importlib.import_module(module_name), module_name, CORE_DISTRIBUTION, __version__
            )
        if entry_points is None:
            entry_points = importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)
        blocked = set(_split_names(environ.get("DISTCOMM_DISABLE_PLUGINS", "")))
        for name in sorted(blocked & {"fakelink", *_CORE_PLUGINS}):
            registry.notes.append(f"DISTCOMM_DISABLE_PLUGINS: {name!r} is part of core and stays")
        for ep in entry_points:
            registry._load_entry_point(ep, blocked)
        for module_name in _split_names(environ.get("DISTCOMM_PLUGINS", "")):
            registry._load_module(module_name)
        logger.debug(
            "plugins: %s", ", ".join(f"{p.name} ({p.distribution})" for p in registry.plugins)
        )
        return registry

    def _load_entry_point(self, ep: importlib.metadata.EntryPoint, blocked: set[str]) -> None:
        dist = getattr(ep, "dist", None)
        distribution = dist.metadata["Name"] if dist is not None else f"<entry point {ep.value}>"
        version = dist.version if dist is not None else None
        if ep.name in blocked:
            self.plugins.append(PluginRecord(ep.name, distribution, version, blocked=True))
            return
        try:
            plugin = ep.load()
        except Exception as exc:
            self.record_failure(ep.name, distribution, version, _describe(exc))
            return
        self.register(plugin, ep.name, distribution, version)

    def _load_module(self, module_name: str) -> None:
        distribution = "DISTCOMM_PLUGINS"
        try:
            plugin = importlib.import_module(module_name)
        except Exception as exc:
            self.record_failure(module_name, distribution, None, _describe(exc))
            return
        self.register(plugin, module_name, distribution)


def _split_names(value: str) -> list[str]:
    """The comma-separated names in ``value``, in order, without blanks or repeats."""
    return list(dict.fromkeys(part.strip() for part in value.split(",") if part.strip()))


def _describe(exc: BaseException) -> str:
    last = traceback.extract_tb(exc.__traceback__)[-1:] if exc.__traceback__ else []
    where = f" (at {last[0].filename}:{last[0].lineno})" if last else ""
    return f"{type(exc).__name__}: {exc}{where}"


_registry: Registry | None = None
_lock = threading.Lock()


def get_registry() -> Registry:
    """Return the process's registry, loading plugins on the first call."""
    global _registry
    with _lock:
        if _registry is None:
            _registry = Registry.load()
        return _registry


def reload_registry() -> Registry:
    """Forget the loaded plugins and load them again (after installing one at run time)."""
    global _registry
    with _lock:
        _registry = Registry.load()
        return _registry


def set_registry(registry: Registry | None) -> Registry | None:
    """Install ``registry`` as the process's (None: load again on next use); return the old one.

    For tests and for programs that build their own registry, e.g.
    ``Registry.load(entry_points=[])`` for the core's plugins alone.
    """
    global _registry
    with _lock:
        previous, _registry = _registry, registry
        return previous
