"""The names a backend's classes may define, checked when the class is made.

``BaseCommunicator`` and ``BaseWork`` keep their own state and helpers under names that start
with ``_kit_``: a backend is free to call its helpers ``_rank``, ``_call`` or ``_start``. What a
backend's communicator or Work defines is checked once, when its class statement runs: a name
that starts with ``_kit_``, or a name of the kit that a backend does not provide (a public method
such as ``describe`` or ``all_reduce``, which are the user's API), raises ``TypeError`` there,
naming it, instead of silently replacing the kit's. What a backend provides: the primitives of
:mod:`distcomm.backend.primitives` and the names in :data:`COMMUNICATOR` and :data:`WORK`.
"""

from __future__ import annotations

__all__ = ["COMMUNICATOR", "PREFIX", "WORK", "check"]

#: The start of every name the kit keeps on a communicator or a Work.
PREFIX = "_kit_"
#: What a backend's communicator may define besides the primitives: what describes the engine,
#: and the hooks the kit calls (docs/plugins.md).
COMMUNICATOR = frozenset(
    {
        "backend_name",
        "capabilities",
        "devices",
        "bound_device",
        "cpu_only_reason",
        "engine_errors",
        "native",
        "_timeout_of",
        "_peer_progress",
        "_peer_stacks",
        "_object_channel",
        "_check_tag",
        "_abort_job",
    }
)
#: What a backend's Work may define.
WORK = frozenset({"_test", "_block", "_waiting_for", "source"})


def check(cls: type, base: type, allowed: frozenset[str], listed: frozenset[str]) -> None:
    """Refuse a class of a backend that defines a name of ``base`` (the kit's) outside
    ``allowed``, or any name that starts with :data:`PREFIX`; the error lists ``listed``.

    Raises:
        TypeError: naming the class, the name, and what a backend provides.
    """
    if cls.__module__.startswith("distcomm.backend."):  # the kit's own classes
        return
    taken = _names(base)
    for name in vars(cls):
        if name.startswith("__") or name in allowed:
            continue
        if name.startswith(PREFIX) or name in taken:
            raise TypeError(
                f"{cls.__module__}.{cls.__qualname__} defines {name!r}, a name of distcomm's "
                f"{base.__name__} that a backend cannot replace (the kit keeps its own state "
                f"and helpers under names that start with {PREFIX!r}; its public methods are the "
                "user's API). HINT: give it another name; what a backend defines: "
                f"{', '.join(sorted(listed))} (docs/plugins.md)."
            )


_TAKEN: dict[type, frozenset[str]] = {}


def _names(base: type) -> frozenset[str]:
    """Every name ``base`` and its bases define or annotate (object's left out)."""
    names = _TAKEN.get(base)
    if names is None:
        found: set[str] = set()
        for klass in base.__mro__[:-1]:
            found.update(vars(klass), getattr(klass, "__annotations__", {}))
        names = _TAKEN[base] = frozenset(found)
    return names
