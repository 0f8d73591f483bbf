"""Plugin loading: pluggy, entry points, ``DISTCOMM_PLUGINS``, and the process's registry.

Nothing here runs at ``import distcomm``. The first call that needs plugins (``init()``,
``distcomm info``, ``detect_environment()``) calls :func:`get_registry`, which loads, in order:
the core's own plugins (fakelink and the built-in launch environments, through the same hooks a
third party uses), every entry point of the ``distcomm`` group that ``DISTCOMM_DISABLE_PLUGINS``
does not block, and the modules named in ``DISTCOMM_PLUGINS``. A plugin that fails to import or
to register is recorded with its error (``distcomm info`` shows it); it never stops the others.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import os
import threading
import traceback
from collections.abc import Iterable, Mapping

import pluggy

from distcomm import _settings
from distcomm._logs import configure_from_env, logger
from distcomm._plugins.names import FIRST_PARTY_BACKENDS, normalise_backend
from distcomm.backend import hooks
from distcomm.backend.registry import CORE_DISTRIBUTION, PluginRecord, Registry
from distcomm.errors import BackendNotFoundError, did_you_mean

__all__ = [
    "ENTRY_POINT_GROUP",
    "PluginRegistry",
    "check_backend",
    "get_registry",
    "set_registry",
]

ENTRY_POINT_GROUP = "distcomm"
#: The core's own plugins: the name ``distcomm info`` shows, and the module.
_CORE_PLUGINS = {
    "distcomm.fakelink": "distcomm.fakelink.plugin",
    "distcomm.environment": "distcomm._plugins.builtin",
}


class PluginRegistry(Registry):
    """A :class:`~distcomm.backend.registry.Registry` that loads plugins into itself."""

    def __init__(self) -> None:
        super().__init__()
        self._pm = pluggy.PluginManager(ENTRY_POINT_GROUP)
        self._pm.add_hookspecs(hooks)
        self._pm.hook.distcomm_register_backends.call_historic(kwargs={"registry": self})
        self._pm.hook.distcomm_register_environments.call_historic(kwargs={"registry": self})

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
    ) -> PluginRegistry:
        """Build a registry: core plugins, entry points, then ``DISTCOMM_PLUGINS`` modules.

        Args:
            entry_points: the entry points to load (default: the installed ``distcomm`` group).
            environ: where to read ``DISTCOMM_DISABLE_PLUGINS`` / ``DISTCOMM_PLUGINS``
                (default: ``os.environ``).
        """
        environ = os.environ if environ is None else environ
        configure_from_env(environ)
        registry = cls()
        from distcomm._version import __version__

        for name, module_name in _CORE_PLUGINS.items():
            registry.register(
                importlib.import_module(module_name), name, CORE_DISTRIBUTION, __version__
            )
        if entry_points is None:
            entry_points = importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)
        blocked = set(_settings.read("DISTCOMM_DISABLE_PLUGINS", environ))
        for name in sorted(blocked & {"fakelink", *_CORE_PLUGINS}):
            registry.notes.append(f"DISTCOMM_DISABLE_PLUGINS: {name!r} is part of core and stays")
        for ep in entry_points:
            registry._load_entry_point(ep, blocked)
        for module_name in _settings.read("DISTCOMM_PLUGINS", environ):
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


def check_backend(name: str) -> str:
    """Return ``name`` normalised if it names a backend: registered, or a first-party one.

    First-party names (``gloo``, ``nccl``, ``mpi``, ``linklink``) are accepted even when their
    distribution is not installed: the ranks' ``init()`` then says what to install.

    Raises:
        BackendNotFoundError: no backend has that name; the message lists the valid names.
    """

    normalised = normalise_backend(str(name))
    valid = sorted({*get_registry().backends, *FIRST_PARTY_BACKENDS})
    if normalised in valid:
        return normalised
    hint = did_you_mean(normalised, valid) or "run `distcomm info` to see every backend."
    raise BackendNotFoundError(f"unknown backend {name!r}; valid: {', '.join(valid)}. HINT: {hint}")


def _describe(exc: BaseException) -> str:
    last = traceback.extract_tb(exc.__traceback__)[-1:] if exc.__traceback__ else []
    where = f" (at {last[0].filename}:{last[0].lineno})" if last else ""
    return f"{type(exc).__name__}: {exc}{where}"


_registry: PluginRegistry | None = None
_lock = threading.Lock()


def get_registry() -> PluginRegistry:
    """Return the process's registry, loading plugins on the first call."""
    global _registry
    with _lock:
        if _registry is None:
            _registry = PluginRegistry.load()
        return _registry


def set_registry(registry: PluginRegistry | None) -> PluginRegistry | None:
    """Install ``registry`` as the process's (None: load again on next use); return the old one.

    For tests and for programs that build their own registry, e.g.
    ``PluginRegistry.load(entry_points=[])`` for the core's plugins alone.
    """
    global _registry
    with _lock:
        previous, _registry = _registry, registry
        return previous
