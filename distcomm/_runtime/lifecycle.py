"""Starting and stopping distcomm: ``init`` and ``finalize``.

``init`` parses its arguments (:class:`~distcomm._runtime.request.InitRequest`), resolves the
launch method (argument, ``DISTCOMM_INIT_METHOD``, detection) and the backend (argument,
``DISTCOMM_BACKEND``, automatic), and creates the default communicator; the trace of why is kept
for ``distcomm info --explain``.
"""

from __future__ import annotations

import dataclasses
import datetime
import threading
from typing import Any

from distcomm import _settings, _unpickling
from distcomm._logs import logger
from distcomm._plugins.loader import get_registry
from distcomm._runtime import (
    exports,
    failure_reports,
    flight_recorder,
    launcher_watch,
    profiling,
    state,
)
from distcomm._runtime import torch_group as torch_groups
from distcomm._runtime.detection import detect_environment
from distcomm._runtime.request import InitRequest, apply_overrides, resolve_timeout
from distcomm._runtime.selection import select_backend
from distcomm.backend import BaseCommunicator, _uncaught
from distcomm.backend.communicator import world_over
from distcomm.backend.specs import BackendSpec
from distcomm.environment.info import LaunchInfo
from distcomm.errors import AlreadyInitializedError
from distcomm.protocol import Communicator

__all__ = ["finalize", "init"]

_lock = threading.RLock()


def init(
    backend: str | None = None,
    method: str | None = None,
    *,
    rank: int | None = None,
    world_size: int | None = None,
    master_addr: str | None = None,
    master_port: int | None = None,
    timeout: float | datetime.timedelta | None = None,
    device: Any = None,
    export_env: bool = True,
    debug: str | None = None,
    torch_group: str | bool | None = None,
    objects: str | None = None,
    **options: Any,
) -> Communicator:
    """Initialise distcomm and return the default communicator (also ``get_communicator()``).

    It detects the launch, picks a backend and creates the communicator (``distcomm info
    --explain`` says why). Called again, it returns the running one; an argument that differs
    from the running one's raises AlreadyInitializedError ("Starting and stopping").

    Args:
        backend: a backend name; default ``DISTCOMM_BACKEND``, else chosen (docs/backends.md).
        method: ``env``, ``slurm``, ``mpi``, ``single_node`` or a plugin's launch method;
            default ``DISTCOMM_INIT_METHOD``, else detected (docs/launch.md).
        rank: this rank without a launcher; under one, it must equal the launcher's.
        world_size: the number of ranks, likewise.
        master_addr: the rendezvous host, instead of the detected one.
        master_port: the rendezvous port, instead of the detected one.
        timeout: seconds or a ``timedelta`` an operation may block (``DISTCOMM_TIMEOUT``, 1800).
        device: ``"cpu"``, ``"cuda"``, ``"cuda:N"`` or a ``torch.device``, for the backend.
        export_env: set ``RANK``, ``WORLD_SIZE``, ... where missing; ``finalize()`` unsets.
        debug: the mismatch check, ``"sample"``, ``"check"`` or ``"off"`` (``DISTCOMM_DEBUG``,
            else ``"sample"``; docs/debugging.md).
        torch_group: make torch's default group beside a non-torch backend (``"auto"``,
            True, False), or over distcomm on any backend (``"distcomm"``); default
            ``DISTCOMM_TORCH_GROUP``, else ``"auto"`` (docs/interop.md).
        objects: a peer's objects, ``"restricted"`` to the allow-list or ``"pickle"`` (any:
            every rank trusted); default ``DISTCOMM_OBJECTS``, else restricted (security.md).
        **options: the backend factory's keyword arguments.

    Raises:
        BackendNotFoundError: no backend of that name, or none available for this launch.
        BackendUnavailableError: the backend cannot run here (the reason says why).
        EnvironmentDetectionError: a malformed launcher variable, or a ``method`` not used.
        InvalidArgumentError: a malformed argument or ``DISTCOMM_*`` variable.
        AlreadyInitializedError: called again with arguments that differ.
        DistTimeoutError: the rendezvous did not complete within the timeout.
    """
    arguments = dict(locals())  # init's arguments by name, as InitRequest.parse takes them
    export = arguments.pop("export_env")
    request = InitRequest.parse(**arguments)
    with _lock:
        ctx = state.current()
        if ctx is not None:
            _check_same(ctx, request.given())
            return ctx.comm
        return _start(request, export)


@dataclasses.dataclass
class _Start:
    """What ``init`` settles on its way, phase by phase."""

    request: InitRequest
    timeout: float
    debug: str
    beside: str | bool
    launch: LaunchInfo
    trace: list[str]


def _start(request: InitRequest, export: bool) -> Communicator:
    """The phases of ``init``: parse the settings, detect the launch, select the backend,
    create the communicator (and torch's group beside it), attach it to the process."""
    _uncaught.install(None)  # an error before the launch is known ends at the user's line too
    try:
        timeout, debug, beside = _parse(request)
        launch = _detect(request)
        trace = [f"method {launch.method}: {launch.sources.get('method', 'chosen')}"]
        start = _Start(request, timeout, debug, beside, launch, trace)
        spec = _select(start)
        comm, beside_comm = _create(start, spec)
    except BaseException:
        _unpickling.reset_policy()  # a failed init fixes nothing for later
        raise
    return _attach(start, comm, beside_comm, export)


def _parse(request: InitRequest) -> tuple[float, str, str | bool]:
    """The timeout, the check policy and the torch group choice; every ``DISTCOMM_*`` variable
    is checked now, before any communication."""
    _settings.check_all()
    _unpickling.set_policy(request.objects)
    timeout = request.timeout or resolve_timeout(None)
    debug = request.debug or str(_settings.read("DISTCOMM_DEBUG"))
    return timeout, debug, torch_groups.policy(request.torch_group)


def _detect(request: InitRequest) -> LaunchInfo:
    """The launch (argument, ``DISTCOMM_INIT_METHOD``, detection, then ``init``'s overrides);
    the handlers that report this rank's failures are installed for it."""
    launch = apply_overrides(detect_environment(request.method), request)
    _uncaught.install(launch.rank if launch.world_size > 1 else None)
    failure_reports.install(launch.rank)  # under distcomm run: the launcher reads it
    flight_recorder.start_from_environment(launch, launch.rank, launch.world_size)
    launcher_watch.watch(launch)  # the rank ends with its launcher
    return launch


def _select(start: _Start) -> BackendSpec:
    """The backend (argument, ``DISTCOMM_BACKEND``, automatic), with the trace of why."""
    selection = select_backend(get_registry(), start.launch, start.request.backend)
    start.trace += selection.trace
    if selection.error is not None:
        raise selection.error
    assert selection.spec is not None
    return selection.spec


def _create(start: _Start, spec: BackendSpec) -> tuple[Communicator, Any]:
    """The default communicator, and torch's default group beside it where that is asked."""
    launch, request = start.launch, start.request
    options = dict(request.options)
    if start.beside == "distcomm" and spec.makes_torch_group:
        options["torch_group"] = "distcomm"  # its group beside torch's, which runs over it
    engine = spec.factory(launch, timeout=start.timeout, device=request.device, **options)
    comm = world_over(spec, engine, launch, start.timeout)
    if hasattr(comm, "debug"):
        comm.debug = start.debug
    flight_recorder.attach(comm)
    try:
        beside, group, why = torch_groups.make(
            start.beside, comm, launch, get_registry(), start.timeout, request.device
        )
    except BaseException:
        comm.finalize()
        raise
    start.trace.append(why)
    over = start.beside == "distcomm"  # torch's default group, whatever the engine's group
    if group is not None and isinstance(comm, BaseCommunicator) and (over or not comm.torch_group):
        comm.torch_group = group
    return comm, beside


def _attach(start: _Start, comm: Communicator, beside: Any, export: bool) -> Communicator:
    """Make ``comm`` the process's default communicator: what ``init`` was asked and settled
    on (for a later call), the exported variables, the profiler."""
    launch = start.launch
    effective = {
        "backend": comm.backend,
        "method": launch.method,
        "rank": comm.rank,
        "world_size": comm.world_size,
        "master_addr": launch.master_addr,
        "master_port": launch.master_port,
        "timeout": start.timeout,
        **start.request.given(),
    }
    _uncaught.install(comm.rank if comm.world_size > 1 else None)  # back above torch's
    ctx = state.Context(comm, launch, start.trace, effective, torch_made=beside)
    if export:
        made = beside if beside is not None else comm
        ctx.exported = exports.export_env(getattr(made, "launch", launch))
    ctx.recorder = profiling.start(comm)
    state.set_process(ctx)
    logger.info("initialised %r: %s", comm, "; ".join(start.trace))
    return comm


def finalize() -> None:
    """Shut down the default communicator and remove the variables ``init`` exported.

    Each exported variable is removed only if it still holds the value ``init`` set. The torch
    group made beside the backend (``torch_group``) is destroyed. Before the communicator is
    freed, ``finalize`` waits for the Works it handed out that have not completed, up to its
    timeout; if one still has not, the communicator is not freed under it (a DistcommWarning
    says so). Under the mismatch check (a vote) and ``DISTCOMM_PROFILE=1`` (the summary,
    printed by rank 0) it is collective: every rank calls it.

    A no-op when not initialised, and inside ``run_threads`` (which owns its world). Afterwards
    the old communicator raises DistcommError ("can no longer be used"), and ``init()`` starts
    afresh.
    """
    with _lock:
        ctx = state.current()
        if ctx is None or ctx.thread_owned:
            return
        state.set_process(None)
        try:
            try:
                if ctx.recorder is not None and getattr(ctx.comm, "unusable", None) is None:
                    profiling.report(ctx.comm, ctx.recorder)
            finally:
                if ctx.recorder is not None:
                    ctx.recorder.stop()
                if ctx.torch_made is not None:
                    ctx.torch_made.finalize()
                ctx.comm.finalize()
        finally:
            exports.unexport_env(ctx.exported)
            _unpickling.reset_policy()


def _check_same(ctx: state.Context, requested: dict[str, Any]) -> None:
    differs = {
        k: (v, ctx.requested.get(k)) for k, v in requested.items() if ctx.requested.get(k) != v
    }
    if differs:
        detail = ", ".join(f"{k}={new!r} (running: {old!r})" for k, (new, old) in differs.items())
        raise AlreadyInitializedError(
            f"distcomm is already initialised with other arguments: {detail}. HINT: call "
            "distcomm.finalize() first, or omit the arguments to get the running communicator."
        )
