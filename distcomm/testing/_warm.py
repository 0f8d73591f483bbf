"""`WarmWorld`: rank processes started once and reused, call after call, for a fast test suite.

``spawn`` starts its processes for every call; each imports torch (about a second of CPU) and
meets the others. A warm world starts its N ranks once, under the launcher the test is about,
and then runs each call as ``spawn`` would (``init``, ``fn``, ``finalize``, the results back),
in the same processes. A call that fails or hangs fails alone, naming its rank (and the pytest
test running it); the processes are then replaced before the next call. The machinery is
:mod:`distcomm._processes.warm`.
"""

from __future__ import annotations

import os
import weakref
from collections.abc import Callable, Sequence
from types import TracebackType
from typing import Any, TypeVar

from distcomm import _settings
from distcomm._plugins.loader import check_backend
from distcomm._processes.warm import LAUNCHERS, RankProcesses
from distcomm._processes.workers import check_call
from distcomm.errors import InvalidArgumentError, did_you_mean

__all__ = ["WarmWorld"]

T = TypeVar("T")
#: Seconds a rank's operations outlive the call's timeout, so that the call's own timeout
#: (with the ranks' stacks) fires first.
_OP_GRACE = 5.0


class WarmWorld:
    """``nprocs`` rank processes on this machine, started once, that run call after call.

    ``run(fn, *args)`` does what ``spawn(fn, nprocs, *args)`` does, in processes kept between
    calls: each rank calls ``distcomm.init(backend=backend)`` (a fresh rendezvous each call),
    runs ``fn(*args)``, calls ``distcomm.finalize()`` and sends the result back. The processes
    start at the first call, under ``launcher``, and stay until :meth:`close` (or the end of a
    ``with`` block). For each call a rank takes this process's working directory, ``sys.path``
    and the changes made to ``os.environ`` since the world started, as a spawned process would
    inherit them. What a call prints is shown on this process's stdout, each line prefixed
    ``[rank N] ``, after the call.

    A call that fails raises at once, as ``spawn`` does: :class:`~distcomm.RankFailedError` for
    a rank that raised (its traceback) or died, :class:`~distcomm.DistTimeoutError` for ranks
    that had not finished within ``timeout`` (their stacks); under pytest the message names the
    test. Its processes are then stopped, and the next call starts new ones: one failure never
    leaks into the next call.

    A call must leave the process as it found it, apart from what ``finalize()`` resets: a hook
    it added, a setting it changed in a module or a thread it started stays for the next call.

    Args:
        nprocs: the number of ranks (at least 1).
        backend: the backend each call initialises (``None``: none, ``fn`` does it).
        launcher: how the ranks start: ``"spawn"`` (multiprocessing, with the variables
            ``distcomm run`` sets, as ``spawn``), ``"distcomm run"``, ``"mpirun"``, ``"srun"``
            or ``"torchrun"``.
        launcher_args: more arguments for the launcher, e.g. ``["--overcommit"]`` for srun.
        start_timeout: seconds for every rank to start and connect.

    Raises:
        InvalidArgumentError: a value above is not valid; nothing was started.
        BackendNotFoundError: ``backend`` names no backend; nothing was started.
    """

    def __init__(
        self,
        nprocs: int,
        *,
        backend: str | None = "gloo",
        launcher: str = "spawn",
        launcher_args: Sequence[str] = (),
        start_timeout: float = 120.0,
    ) -> None:
        if not isinstance(nprocs, int) or isinstance(nprocs, bool) or nprocs < 1:
            raise InvalidArgumentError(
                f"nprocs={nprocs!r} must be a positive int. HINT: e.g. 2 for two ranks."
            )
        if launcher not in LAUNCHERS:
            hint = did_you_mean(str(launcher), LAUNCHERS) or "pick one of them."
            raise InvalidArgumentError(
                f"launcher={launcher!r} is not a launcher a warm world can start; valid: "
                f"{', '.join(LAUNCHERS)}. HINT: {hint}"
            )
        _check_seconds("start_timeout", start_timeout)
        if isinstance(launcher_args, str):
            raise InvalidArgumentError(
                f"launcher_args={launcher_args!r} must be a list of arguments, not a string. "
                f"HINT: e.g. {launcher_args.split()!r}."
            )
        self.nprocs = nprocs
        self.backend = None if backend is None else check_backend(backend)
        self.launcher = launcher
        self.launcher_args = list(launcher_args)
        self.start_timeout = start_timeout
        #: How many times the ranks were started: 1 after the first call, one more after each
        #: call that failed or timed out.
        self.starts = 0
        self._ranks: RankProcesses | None = None
        self._closed = False
        self._finalizer: weakref.finalize[Any, Any] | None = None

    def __repr__(self) -> str:
        state = "closed" if self._closed else "running" if self._ranks else "not started"
        return f"WarmWorld({self._describe()}, {state}, started {self.starts} time(s))"

    def _describe(self) -> str:
        ranks = f"{self.nprocs} rank{'s' if self.nprocs > 1 else ''}"
        return f"{ranks} of {self.backend or 'no backend'} under {self.launcher}"

    @property
    def pids(self) -> list[int]:
        """The process ids of the ranks now (empty before the first call and after a failure)."""
        return [] if self._ranks is None else [self._ranks.pid(r) for r in range(self.nprocs)]

    def run(self, fn: Callable[..., T], *args: Any, timeout: float = 120.0) -> list[T]:
        """Run ``fn(*args)`` on every rank, as ``spawn`` does; return the results in rank order.

        ``fn``, ``args`` and the results are pickled: ``fn`` must be importable by name
        (defined at the top level of a module).

        Args:
            fn: the function every rank runs.
            *args: passed to ``fn``.
            timeout: seconds for the call. Operations inside time out after
                ``DISTCOMM_TIMEOUT`` seconds when it is set, else a few seconds after the call.

        Raises:
            InvalidArgumentError: ``fn`` or ``args`` cannot be sent, or ``timeout`` is not a
                positive number, or the world is closed; nothing ran.
            RankFailedError: a rank raised (its traceback) or died; the processes are replaced
                before the next call.
            DistTimeoutError: ranks had not finished within ``timeout`` (their stacks); the
                processes are replaced before the next call.
        """
        if self._closed:
            raise InvalidArgumentError(
                f"{self!r} is closed. HINT: make a new WarmWorld, or call run() before close()."
            )
        _check_seconds("timeout", timeout)
        payload = check_call(fn, self.nprocs, args, timeout)
        user_set = _settings.is_set("DISTCOMM_TIMEOUT")
        op_timeout = None if user_set else float(timeout) + _OP_GRACE
        ranks = self._started()
        try:
            return ranks.call(payload, self.backend, timeout, op_timeout, _current_test())
        except BaseException:
            self._stop(kill=True)
            raise

    def close(self) -> None:
        """Stop the ranks (told to end, then terminated, then killed); idempotent."""
        self._closed = True
        self._stop(kill=False)

    def __enter__(self) -> WarmWorld:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def _started(self) -> RankProcesses:
        if self._ranks is None:
            ranks = RankProcesses(
                self.nprocs, self.launcher, self.launcher_args, self.start_timeout, self._describe()
            )
            self._ranks, self.starts = ranks, self.starts + 1
            # Whatever happens to this object, its processes end with the interpreter
            self._finalizer = weakref.finalize(self, ranks.stop, kill=True)
        return self._ranks

    def _stop(self, *, kill: bool) -> None:
        ranks, self._ranks = self._ranks, None
        if self._finalizer is not None:
            self._finalizer.detach()
            self._finalizer = None
        if ranks is not None:
            ranks.stop(kill=kill)


def _check_seconds(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise InvalidArgumentError(
            f"{name}={value!r} must be a positive number of seconds. HINT: e.g. 120."
        )


def _current_test() -> str:
    """The pytest test running now (``PYTEST_CURRENT_TEST`` without its phase), or ``""``."""
    return os.environ.get("PYTEST_CURRENT_TEST", "").rpartition(" (")[0]
