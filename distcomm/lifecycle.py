"""Starting and stopping distcomm, and the rank getters.

``init`` resolves the launch method (argument, ``DISTCOMM_INIT_METHOD``, detection), the backend
(argument, ``DISTCOMM_BACKEND``, automatic) and creates the default communicator; the trace of
why is kept for ``distcomm info --explain``. Before ``init`` the getters answer from the detected
launch, so ``is_main_process()`` is right on every rank from the first line of a script.
"""

from __future__ import annotations

import datetime
import functools
import os
import sys
import threading
from collections.abc import Callable
from types import TracebackType
from typing import Any, TypeVar, cast

from distcomm import aborts, state
from distcomm.environment import LaunchInfo, detect_environment
from distcomm.errors import AlreadyInitializedError, InvalidArgumentError, NotInitializedError
from distcomm.logs import logger
from distcomm.protocol import Communicator
from distcomm.registry import get_registry
from distcomm.selection import select_backend

__all__ = [
    "DistContext",
    "dist_finalize",
    "dist_init",
    "dist_mode",
    "finalize",
    "get_backend",
    "get_communicator",
    "get_local_rank",
    "get_local_world_size",
    "get_node_rank",
    "get_rank",
    "get_world_size",
    "init",
    "is_distributed",
    "is_initialized",
    "is_local_main_process",
    "is_main_process",
    "resolve_timeout",
]

DEFAULT_TIMEOUT = 1800.0
EXPORTED_VARIABLES = (
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
)
_lock = threading.RLock()
F = TypeVar("F", bound=Callable[..., Any])


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
    **options: Any,
) -> Communicator:
    """Initialise distcomm and return the default communicator.

    Args:
        backend: a backend name; default ``DISTCOMM_BACKEND``, else chosen automatically.
        method: a launch method (``env``, ``slurm``, ``mpi``, ``single_node`` or a plugin's);
            default ``DISTCOMM_INIT_METHOD``, else detected.
        rank, world_size, master_addr, master_port: override what the launch says.
        timeout: seconds (or a timedelta) an operation may block; default ``DISTCOMM_TIMEOUT``
            or 1800.
        device: ``"cpu"``, ``"cuda"``, ``"cuda:N"`` or a torch.device, for GPU backends.
        export_env: set RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR and
            MASTER_PORT where absent, so env-reading code agrees; ``finalize`` removes them.
        **options: passed to the backend's factory.

    Calling ``init`` again returns the running communicator; arguments that are given and
    differ from it raise AlreadyInitializedError. After ``finalize()`` it may be called again.

    Raises:
        BackendNotFoundError: no such backend, or none available for this launch.
        BackendUnavailableError: the backend cannot run here (the reason says why).
        EnvironmentDetectionError: a launcher variable is malformed.
    """
    requested: dict[str, Any] = {
        "backend": None if backend is None else str(backend).strip().lower(),
        "method": method,
        "rank": rank,
        "world_size": world_size,
        "master_addr": master_addr,
        "master_port": master_port,
        "timeout": None if timeout is None else resolve_timeout(timeout),
        "device": None if device is None else _check_device(device),
        **options,
    }
    requested = {k: v for k, v in requested.items() if v is not None}
    with _lock:
        ctx = state.current()
        if ctx is not None:
            _check_same(ctx, requested)
            return ctx.comm
        timeout_s = requested.get("timeout") or resolve_timeout(None)
        aborts.on_timeout()  # a malformed policy is an error now, not at the first timeout
        aborts.abort_on_exception()
        launch = _apply_overrides(
            detect_environment(method), rank, world_size, master_addr, master_port
        )
        trace = [f"method {launch.method}: {launch.sources.get('method', 'chosen')}"]
        selection = select_backend(get_registry(), launch, requested.get("backend"))
        trace += selection.trace
        if selection.error is not None:
            raise selection.error
        assert selection.spec is not None
        comm = selection.spec.factory(
            launch, timeout=timeout_s, device=requested.get("device"), **options
        )
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
        ctx = state.Context(comm, launch, trace, effective)
        if export_env:
            ctx.exported = _export_env(launch)
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
            ctx.comm.finalize()
        finally:
            for key, value in ctx.exported.items():
                if os.environ.get(key) == value:
                    del os.environ[key]


def is_initialized() -> bool:
    """Whether ``init`` has run (in this thread-rank, inside run_threads)."""
    return state.current() is not None


def get_communicator() -> Communicator:
    """The default communicator.

    Raises:
        NotInitializedError: before ``init()``.
    """
    ctx = state.current()
    if ctx is None:
        raise NotInitializedError("distcomm is not initialised. HINT: call distcomm.init() first.")
    return ctx.comm


def _launch() -> LaunchInfo:
    ctx = state.current()
    return ctx.launch if ctx is not None else detect_environment()


def get_rank() -> int:
    """This process's global rank (before init: the detected launch's)."""
    ctx = state.current()
    return ctx.comm.rank if ctx is not None else detect_environment().rank


def get_world_size() -> int:
    """The number of ranks (before init: the detected launch's)."""
    ctx = state.current()
    return ctx.comm.world_size if ctx is not None else detect_environment().world_size


def get_local_rank() -> int:
    """This process's rank on its node."""
    return _launch().local_rank


def get_local_world_size() -> int:
    """The number of ranks on this node."""
    return _launch().local_world_size


def get_node_rank() -> int:
    """The index of this node in the job."""
    return _launch().node_rank


def get_backend() -> str | None:
    """The running backend's name, or None before init."""
    ctx = state.current()
    return ctx.comm.backend if ctx is not None else None


def is_distributed() -> bool:
    """Whether distcomm is initialised with more than one rank."""
    ctx = state.current()
    return ctx is not None and ctx.comm.world_size > 1


def is_main_process() -> bool:
    """Whether this is global rank 0 (right before init too)."""
    return get_rank() == 0


def is_local_main_process() -> bool:
    """Whether this is local rank 0 on its node."""
    return get_local_rank() == 0


def dist_init(
    method: str | None = None, device_id: int | None = None, *, backend: str | None = None
) -> tuple[int, int]:
    """Initialise (method first) and return ``(rank, world_size)``.

    When torch is imported and CUDA is available, also sets the current CUDA device:
    ``device_id`` if given, else the local rank modulo the visible devices.
    """
    if device_id is not None and (
        not isinstance(device_id, int) or isinstance(device_id, bool) or device_id < 0
    ):
        raise InvalidArgumentError(f"device_id={device_id!r} must be a non-negative int or None")
    comm = init(backend=backend, method=method)
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available():
        count = torch.cuda.device_count()
        torch.cuda.set_device(device_id if device_id is not None else get_local_rank() % count)
    return comm.rank, comm.world_size


def dist_finalize() -> None:
    """The same as :func:`finalize`."""
    finalize()


class DistContext:
    """``with DistContext() as ctx:`` runs the block initialised (``ctx.rank``, ``ctx.world_size``).

    It finalizes on exit, even when the block raises, but only if it was the one that
    initialised.
    """

    def __init__(self, method: str | None = None, backend: str | None = None) -> None:
        self.method = method
        self.backend = backend
        self.rank = 0
        self.world_size = 1
        self._owner = False

    def __enter__(self) -> DistContext:
        self._owner = not is_initialized()
        self.rank, self.world_size = dist_init(self.method, backend=self.backend)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._owner:
            dist_finalize()


def dist_mode(func: F) -> F:
    """Decorator: run ``func`` inside a :class:`DistContext` and return its value."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        with DistContext():
            return func(*args, **kwargs)

    return wrapper  # type: ignore[return-value]


def resolve_timeout(timeout: float | datetime.timedelta | None) -> float:
    """Seconds from a number, a timedelta, or (None) ``DISTCOMM_TIMEOUT`` / the default 1800."""
    source, given = "timeout", cast(object, timeout)
    if given is None:
        raw = os.environ.get("DISTCOMM_TIMEOUT", "").strip()
        if not raw:
            return DEFAULT_TIMEOUT
        source, given = "DISTCOMM_TIMEOUT", raw
    if isinstance(given, datetime.timedelta):
        value = given.total_seconds()
    elif isinstance(given, (int, float, str)) and not isinstance(given, bool):
        try:
            value = float(given)
        except ValueError:
            value = -1.0
    else:
        value = -1.0
    if not value > 0 or value == float("inf"):
        raise InvalidArgumentError(
            f"{source}={given!r} must be a positive number of seconds or a timedelta. "
            "HINT: e.g. init(timeout=600) or DISTCOMM_TIMEOUT=600."
        )
    return value


def _check_device(device: Any) -> str:
    if type(device).__name__ == "device" and hasattr(device, "type"):
        device = str(device)
    if isinstance(device, str):
        text = device.strip().lower()
        kind, colon, index = text.partition(":")
        if (kind == "cpu" and not colon) or (kind == "cuda" and (not colon or index.isdigit())):
            return text
    raise InvalidArgumentError(
        f"device={device!r} is not a device; valid: 'cpu', 'cuda', 'cuda:N' or a torch.device. "
        "HINT: omit it to use the local rank's GPU on GPU backends."
    )


def _apply_overrides(
    launch: LaunchInfo,
    rank: int | None,
    world_size: int | None,
    master_addr: str | None,
    master_port: int | None,
) -> LaunchInfo:
    """Return ``launch`` with ``init``'s rank, world_size, master_addr and master_port applied.

    With no launcher (``single_node``), rank and world_size come together and define the
    world. Under a launcher they may only repeat what the launcher says: a value that differs
    would make the rendezvous wait for ranks that never start.

    Raises:
        InvalidArgumentError: a value that is not an int or out of range, rank or world_size
            alone on one node, or a rank or world_size that differs from the launcher's.
    """
    changes: dict[str, Any] = {}
    examples = {"rank": 0, "world_size": 2, "master_port": 29500}
    for name, value in (("rank", rank), ("world_size", world_size), ("master_port", master_port)):
        if value is not None:
            if not isinstance(value, int) or isinstance(value, bool):
                raise InvalidArgumentError(
                    f"{name}={value!r} must be an int, not {type(value).__name__}. "
                    f"HINT: pass an int, e.g. init({name}={examples[name]})."
                )
            changes[name] = value
    if master_addr is not None:
        changes["master_addr"] = str(master_addr)
    if not changes:
        return launch
    if ("rank" in changes) != ("world_size" in changes) and launch.method == "single_node":
        raise InvalidArgumentError(
            f"init got {'rank' if 'rank' in changes else 'world_size'} without the other, and no "
            "launcher says it. HINT: pass both rank= and world_size=."
        )
    size = changes.get("world_size", launch.world_size)
    if size < 1:
        raise InvalidArgumentError(
            f"world_size={size!r} must be at least 1. HINT: pass the number of processes."
        )
    if "rank" in changes and not 0 <= changes["rank"] < size:
        where = "the argument" if "world_size" in changes else launch.sources.get("world_size", "?")
        raise InvalidArgumentError(
            f"rank={changes['rank']!r} is not a rank of a world of {size} (world_size={size} "
            f"from {where}): valid ranks are 0..{size - 1}. HINT: ranks count from 0; pass "
            "0 <= rank < world_size."
        )
    port = changes.get("master_port")
    if port is not None and not 0 <= port <= 65535:
        raise InvalidArgumentError(
            f"master_port={port!r} is not a TCP port: valid ports are 0..65535. "
            "HINT: pass a free port on the master's host, e.g. init(master_port=29500)."
        )
    differs = [
        (name, changes[name], getattr(launch, name))
        for name in ("rank", "world_size")
        if name in changes and changes[name] != getattr(launch, name)
    ]
    if differs and launch.method != "single_node":
        given = ", ".join(f"{name}={mine!r}" for name, mine, _ in differs)
        said = ", ".join(
            f"{name}={theirs!r} (from {launch.sources.get(name, 'the launcher')})"
            for name, _, theirs in differs
        )
        omit = " and ".join(f"{name}=" for name, _, _ in differs)
        hint = f"omit {omit} to use the launcher's {'values' if len(differs) > 1 else 'value'}"
        if size != launch.world_size:
            hint += f", or start {size} processes with the launcher"
        raise InvalidArgumentError(
            f"init({given}) disagrees with the {launch.method} launch, which says {said}; the "
            f"rendezvous would wait for ranks that never start. HINT: {hint}."
        )
    updated = launch.replace(**changes)
    if launch.method == "single_node" and "world_size" in changes:
        updated = updated.replace(
            "derived: init arguments on one node",
            local_rank=updated.rank,
            local_world_size=updated.world_size,
        )
    return updated


def _export_env(launch: LaunchInfo) -> dict[str, str]:
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
