"""Choosing a backend for a launch, and recording why every candidate was taken or not.

Order (docs/backends.md, "How a backend is chosen"): the ``backend`` argument, else
``DISTCOMM_BACKEND``, else automatic: adopt an existing torch default process group; a world of 1
with no launcher runs on fakelink; otherwise the available backend of highest priority (nccl 300,
mpi 200, gloo 100, plugins by their own; 0 means only when asked for).
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Mapping

from distcomm import _settings
from distcomm._plugins.names import (
    FIRST_PARTY_BACKENDS,
    FIRST_PARTY_PRIORITIES,
    LIBRARIES,
    backend_hint,
    install_hint,
    normalise_backend,
)
from distcomm.backend.registry import Registry
from distcomm.backend.specs import BackendSpec
from distcomm.environment.info import LaunchInfo
from distcomm.errors import BackendNotFoundError, BackendUnavailableError, did_you_mean

__all__ = ["Candidate", "Selection", "select_backend"]


@dataclasses.dataclass
class Candidate:
    """One backend as the selection saw it (``distcomm info``'s "backends" entries)."""

    name: str
    distribution: str
    available: bool
    reason: str
    selected: bool = False
    priority: int = 0
    description: str = ""
    #: For a first-party backend that is not registered: what to do about it (install it, take
    #: it out of DISTCOMM_DISABLE_PLUGINS, fix its import error).
    hint: str = ""


@dataclasses.dataclass
class Selection:
    """The outcome: the chosen backend (or the error) and the trace of why."""

    backend: str | None
    spec: BackendSpec | None
    candidates: list[Candidate]
    trace: list[str]
    error: Exception | None = None


def select_backend(
    registry: Registry,
    launch: LaunchInfo,
    requested: str | None = None,
    environ: Mapping[str, str] | None = None,
) -> Selection:
    """Choose a backend for ``launch``; never raises: a failure is ``Selection.error``."""
    trace: list[str] = []
    origin = "argument"
    if requested is not None:
        trace.append(f"backend {requested!r} requested by the backend argument")
    elif _settings.is_set("DISTCOMM_BACKEND", environ):
        requested, origin = _settings.read("DISTCOMM_BACKEND", environ), "DISTCOMM_BACKEND"
        trace.append(f"backend {requested!r} requested by DISTCOMM_BACKEND")
    candidates = _candidates(registry, launch)
    by_name = {c.name: c for c in candidates}
    specs = registry.backends
    if requested is not None:
        name = normalise_backend(str(requested))
        choice = by_name.get(name) if name in specs else None
        if choice is None:
            broken = _broken_plugins(registry)
            return _fail(candidates, trace, _not_found(name, specs, by_name, origin, broken))
        if not choice.available:
            return _fail(candidates, trace, _unavailable(choice, specs, candidates, origin))
        return _chosen(choice, specs, candidates, trace, "was requested")
    adopted = _torch_default_backend()
    if adopted is not None:
        trace.append(f"a torch default process group exists (backend {adopted!r}): adopting it")
        choice = by_name.get(adopted)
        if choice is None or adopted not in specs:
            broken = _broken_plugins(registry)
            return _fail(candidates, trace, _not_found(adopted, specs, by_name, None, broken))
        return _chosen(choice, specs, candidates, trace, "adopts the existing torch process group")
    return _automatic(launch, specs, candidates, trace)


def _automatic(
    launch: LaunchInfo,
    specs: dict[str, BackendSpec],
    candidates: list[Candidate],
    trace: list[str],
) -> Selection:
    """Nothing named a backend: fakelink for a world of 1 with no launcher, else the
    highest-priority available one."""
    if launch.method == "single_node" and launch.world_size == 1:
        fakelink = next(c for c in candidates if c.name == "fakelink")
        why = "because a world of 1 with no launcher runs in-process"
        return _chosen(fakelink, specs, candidates, trace, why)
    ranked = sorted(
        (c for c in candidates if c.name in specs and c.priority > 0),
        key=lambda c: (-c.priority, c.name),
    )
    for choice in ranked:
        if choice.available:
            why = f"is the highest-priority available backend (priority {choice.priority})"
            return _chosen(choice, specs, candidates, trace, why)
    reasons = "; ".join(f"{c.name}: {c.reason}" for c in candidates if not c.selected)
    return _fail(
        candidates,
        trace,
        BackendNotFoundError(
            f"no backend can run a world of {launch.world_size} launched by {launch.method!r}: "
            f"{reasons}. HINT: install one ({install_hint('distcomm-torch')} or "
            f"{install_hint('distcomm-mpi')}), or name one "
            "with init(backend=...) / DISTCOMM_BACKEND."
        ),
    )


def _candidates(registry: Registry, launch: LaunchInfo) -> list[Candidate]:
    out = []
    failed = {p.distribution: p.error for p in registry.plugins if p.error}
    blocked = {p.distribution: p.name for p in registry.plugins if p.blocked}
    for name, spec in sorted(registry.backends.items()):
        distribution = registry.distribution_of(name) or "?"
        if ("backend", name) in registry.conflicts:
            available, reason = False, registry.conflicts[("backend", name)]
        else:
            try:
                available, reason = spec.is_available(launch)
            except Exception as exc:
                available, reason = False, f"is_available() raised {type(exc).__name__}: {exc}"
        first_party = FIRST_PARTY_BACKENDS.get(name) == distribution
        if not available and first_party and name in LIBRARIES and "HINT:" not in reason:
            reason = f"{reason.strip().rstrip('.')}. HINT: {backend_hint(name)}"
        out.append(
            Candidate(
                name,
                distribution,
                bool(available),
                reason,
                priority=spec.priority,
                description=spec.description,
            )
        )
    for name, distribution in FIRST_PARTY_BACKENDS.items():
        if name in registry.backends:
            continue
        reason, hint = _missing(name, failed, blocked)
        out.append(
            Candidate(
                name, distribution, False, reason, priority=FIRST_PARTY_PRIORITIES[name], hint=hint
            )
        )
    return out


def _missing(name: str, failed: dict[str, str], blocked: dict[str, str]) -> tuple[str, str]:
    """Why a first-party backend's distribution registered no backend, and the fix: installing
    it helps only when it is not installed."""
    distribution = FIRST_PARTY_BACKENDS[name]
    install = install_hint(distribution)
    if distribution in failed:
        return (
            f"{distribution} is installed but failed to load: {failed[distribution]}",
            f"fix what importing it raised, or reinstall it ({install})",
        )
    if distribution in blocked:
        plugin = blocked[distribution]
        return (
            f"{distribution} is blocked by DISTCOMM_DISABLE_PLUGINS",
            f"take {plugin!r} out of DISTCOMM_DISABLE_PLUGINS (or unset it)",
        )
    return f"not installed ({install})", backend_hint(name)


def _chosen(
    choice: Candidate,
    specs: dict[str, BackendSpec],
    candidates: list[Candidate],
    trace: list[str],
    why: str,
) -> Selection:
    choice.selected = True
    trace.append(f"{choice.name}: selected: {why}")
    for c in candidates:
        if c.selected:
            continue
        if c.available:
            trace.append(
                f"{c.name}: available, not chosen (priority {c.priority}; {choice.name} {why})"
            )
        else:
            trace.append(f"{c.name}: not available: {c.reason}")
    return Selection(choice.name, specs[choice.name], candidates, trace)


def _fail(candidates: list[Candidate], trace: list[str], error: Exception) -> Selection:
    trace.extend(
        f"{c.name}: {'available' if c.available else 'not available: ' + c.reason}"
        for c in candidates
    )
    trace.append(f"no backend selected: {error}")
    return Selection(None, None, candidates, trace, error)


def _named(name: str, origin: str | None) -> str:
    """``'name'``, followed by where the name came from unless it is the ``backend`` argument."""
    return f"{name!r}" if origin in (None, "argument") else f"{name!r} (from {origin})"


def _unavailable(
    choice: Candidate,
    specs: Mapping[str, BackendSpec],
    candidates: list[Candidate],
    origin: str,
) -> BackendUnavailableError:
    """The error for a requested backend that is registered but cannot run this launch.

    The message gives the backend's reason and, unless the reason carries its own HINT, one
    naming the backends that can run here (for a GPU-only backend: those that move CPU memory).
    """
    name, reason = choice.name, choice.reason.strip().rstrip(".")
    message = f"backend {_named(name, origin)} cannot run here: {reason}."
    if "HINT:" not in reason:
        message += " " + _unavailable_hint(name, specs, candidates, origin)
    return BackendUnavailableError(message, backend=name, reason=choice.reason)


def _unavailable_hint(
    name: str, specs: Mapping[str, BackendSpec], candidates: list[Candidate], origin: str
) -> str:
    """``HINT: ...`` naming the backends that can run this launch instead of ``name``."""
    usable = sorted(
        (c for c in candidates if c.available and c.name in specs and c.name != name),
        key=lambda c: (-c.priority, c.name),
    )
    if not usable:
        return "HINT: run `distcomm info --explain` to see why each backend is (not) available."
    if origin == "DISTCOMM_BACKEND":
        fix = "set DISTCOMM_BACKEND={}, or unset DISTCOMM_BACKEND to choose automatically."
    else:
        fix = "pass init(backend={!r}), or omit backend to choose automatically."
    devices = specs[name].devices
    if "cpu" not in devices:
        cpu = [c.name for c in usable if c.priority > 0 and "cpu" in specs[c.name].devices]
        if cpu:
            moves = "/".join(sorted(d.upper() for d in devices))
            return (
                f"HINT: {name} moves {moves} tensors only; for CPU tensors use "
                f"{' or '.join(cpu)}: {fix.format(cpu[0])}"
            )
    names = ", ".join(c.name for c in usable)
    return f"HINT: backends that can run here: {names}; {fix.format(usable[0].name)}"


def _broken_plugins(registry: Registry) -> list[str]:
    """The plugins that failed to load or register, with why: one of them may be the backend
    a user asks for."""
    return [f"{p.name!r} ({p.distribution}): {p.error}" for p in registry.plugins if p.error]


def _not_found(
    name: str,
    specs: Mapping[str, BackendSpec],
    by_name: dict[str, Candidate],
    origin: str | None = None,
    broken: list[str] | None = None,
) -> BackendNotFoundError:
    available = ", ".join(sorted(specs)) or "none"
    hint = did_you_mean(name, [*specs, *FIRST_PARTY_BACKENDS])
    guess = hint.split("'")[1] if hint else name
    # _candidates gave every first-party backend that is not registered its reason and fix.
    absent = {b: by_name[b] for b in FIRST_PARTY_BACKENDS if b not in specs}
    if name in absent:
        missing = absent[name]
        return BackendNotFoundError(
            f"backend {_named(name, origin)} is provided by {missing.distribution}: "
            f"{missing.reason}; available: {available}. HINT: {missing.hint}"
        )
    # Installed but blocked or broken is told apart from not installed (installing would not help).
    uninstalled = [b for b, c in absent.items() if c.hint == backend_hint(b)]
    grouped = "; ".join(
        f"{', '.join(sorted(b for b in uninstalled if FIRST_PARTY_BACKENDS[b] == dist))} ({dist})"
        for dist in sorted({FIRST_PARTY_BACKENDS[b] for b in uninstalled})
    )
    parts = [f"unknown backend {_named(name, origin)}; available: {available}."]
    if grouped:
        parts.append(f"Not installed: {grouped}.")
    if broken:
        failed = "; ".join(broken)
        parts.append(f"Plugins that failed to load or register (one may provide it): {failed}.")
    if guess in absent:
        missing = absent[guess]
        lead = f"HINT: {hint} It" if hint and guess != name else "HINT: it"
        if guess in uninstalled:
            parts.append(
                f"{lead} is provided by {missing.distribution}, which is not installed "
                f"({missing.hint})."
            )
        else:
            parts.append(
                f"{lead} is provided by {missing.distribution}: {missing.reason}; {missing.hint}."
            )
    elif hint:
        parts.append(f"HINT: {hint}")
    else:
        parts.append(
            "HINT: run `distcomm info` to see every backend and why it is (not) available."
        )
    return BackendNotFoundError(" ".join(parts))


def _torch_default_backend() -> str | None:
    dist = sys.modules.get("torch.distributed")
    if dist is None or not dist.is_available() or not dist.is_initialized():
        return None
    raw = str(dist.get_backend()).lower()
    names = [part.split(":")[-1] for part in raw.split(",")]
    return "nccl" if "nccl" in names else names[0]
