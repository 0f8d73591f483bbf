"""Starting and stopping distcomm: ``init`` and ``finalize``.

``init`` parses its arguments (:class:`~distcomm._runtime.request.InitRequest`), resolves the
launch method (argument, ``DISTCOMM_INIT_METHOD``, detection) and the backend (argument,
``DISTCOMM_BACKEND``, automatic), and creates the default communicator; the trace of why is kept
for ``distcomm info --explain``.
"""

from __future__ import annotations

import datetime
import threading
from typing import Any

from distcomm._logs import logger
from distcomm._plugins.loader import get_registry
from distcomm._runtime import exports, failure_reports, flight_recorder, profiling, state
from distcomm._runtime import torch_group as torch_groups
from distcomm._runtime.detection import detect_environment
from distcomm._runtime.request import InitRequest, apply_overrides, resolve_timeout
from distcomm._runtime.selection import select_backend
from distcomm.backend import BaseCommunicator, _uncaught, aborts
from distcomm.backend._pipeline import agreement
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
    **options: Any,
) -> Communicator:
    """Initialise distcomm and return the default communicator.

    Args:
        backend: a backend name; default ``DISTCOMM_BACKEND``, else chosen automatically.
        method: a launch method (``env``, ``slurm``, ``mpi``, ``single_node`` or a plugin's);
            default ``DISTCOMM_INIT_METHOD``, else detected.
        rank: this process's rank, where no launcher says it (with ``world_size``); under a
            launcher it may only repeat the launcher's.
        world_size: the number of ranks, likewise.
        master_addr: the rendezvous host, instead of the launch's.
        master_port: the rendezvous port, instead of the launch's.
        timeout: seconds (or a timedelta) an operation may block; default ``DISTCOMM_TIMEOUT``
            or 1800.
        device: ``"cpu"``, ``"cuda"``, ``"cuda:N"`` or a torch.device, for GPU backends.
        export_env: set RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR and
            MASTER_PORT where absent, so env-reading code agrees (the master address and port
            of the torch rendezvous, where there is one); ``finalize`` removes them.
        debug: the mismatch check (docs/debugging.md): ``"sample"`` (the first 64
            collectives of each communicator, then every 1024th), ``"check"`` (every one) or
            ``"off"``; default ``DISTCOMM_DEBUG``, else ``"sample"``.
        torch_group: beside a backend that makes no torch default process group (mpi,
            linklink, plugins), make one (gloo; nccl for a GPU device) so that torch-native
            code (DDP, Accelerate) works: ``"auto"`` when the program has imported torch,
            True, or False; default ``DISTCOMM_TORCH_GROUP``, else ``"auto"``
            (docs/interop.md). It is ``comm.torch_group``.
        **options: passed to the backend's factory.

    Calling ``init`` again returns the running communicator; arguments that are given and
    differ from it raise AlreadyInitializedError. After ``finalize()`` it may be called again.

    Raises:
        BackendNotFoundError: no such backend, or none available for this launch.
        BackendUnavailableError: the backend cannot run here (the reason says why).
        EnvironmentDetectionError: a launcher variable is malformed.
    """
    request = InitRequest.parse(
        backend,
        method,
        rank=rank,
        world_size=world_size,
        master_addr=master_addr,
        master_port=master_port,
        timeout=timeout,
        device=device,
        debug=debug,
        torch_group=torch_group,
        options=options,
    )
    requested = request.given()
    with _lock:
        ctx = state.current()
        if ctx is not None:
            _check_same(ctx, requested)
            return ctx.comm
        timeout_s = request.timeout or resolve_timeout(None)
        aborts.on_timeout()  # a malformed policy is an error now, not at the first timeout
        aborts.abort_on_exception()
        debug_policy = request.debug or agreement.policy()  # DISTCOMM_DEBUG checked now too
        profiling.enabled_by_environment()  # a malformed DISTCOMM_PROFILE is an error now
        beside_choice = torch_groups.policy(request.torch_group)
        launch = apply_overrides(detect_environment(method), request)
        trace = [f"method {launch.method}: {launch.sources.get('method', 'chosen')}"]
        _uncaught.install(launch.rank if launch.world_size > 1 else None)
        failure_reports.install(launch.rank)  # under distcomm run: the launcher reads it
        flight_recorder.start_from_environment(launch, launch.rank, launch.world_size)
        selection = select_backend(get_registry(), launch, request.backend)
        trace += selection.trace
        if selection.error is not None:
            raise selection.error
        assert selection.spec is not None
        comm = selection.spec.factory(
            launch, timeout=timeout_s, device=request.device, **request.options
        )
        if hasattr(comm, "debug"):
            comm.debug = debug_policy
        try:
            beside, group, why = torch_groups.make(
                beside_choice, comm, launch, get_registry(), timeout_s, request.device
            )
        except BaseException:
            comm.finalize()
            raise
        trace.append(why)
        if group is not None and isinstance(comm, BaseCommunicator) and comm.torch_group is None:
            comm.torch_group = group
        effective = {
            "backend": comm.backend,
            "method": launch.method,
            "rank": comm.rank,
            "world_size": comm.world_size,
            "master_addr": launch.master_addr,
            "master_port": launch.master_port,
            "timeout": timeout_s,
            **requested,
        }
        _uncaught.install(comm.rank if comm.world_size > 1 else None)  # back above torch's
        ctx = state.Context(comm, launch, trace, effective, torch_beside=beside)
        if export_env:
            made = beside if beside is not None else comm
            ctx.exported = exports.export_env(getattr(made, "launch", launch))
        ctx.recorder = profiling.start(comm)
        state.set_process(ctx)
        logger.info("initialised %r: %s", comm, "; ".join(trace))
        return comm


def finalize() -> None:
    """Shut down the default communicator and remove the variables ``init`` exported.

    A no-op when not initialised, and inside ``run_threads`` (which owns its world).
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
                if ctx.torch_beside is not None:
                    ctx.torch_beside.finalize()
                ctx.comm.finalize()
        finally:
            exports.unexport_env(ctx.exported)


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
