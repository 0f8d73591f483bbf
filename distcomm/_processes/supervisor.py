"""Starting N ranks on this node: the process management behind ``distcomm run``.

:func:`run` starts one child process per rank with the launcher variables that distcomm's ``env``
detection reads (:mod:`distcomm._processes.variables`), copies each child's output to the
launcher's, prefixed ``[rank N] ``, and stops the whole job as soon as one rank fails or the
launcher is interrupted. Every child runs in its own session (process group), so that signals reach
a rank only through the launcher, and so that a rank's own children are stopped with it.

This module imports neither torch nor any backend; ``distcomm.testing.spawn`` shares its variables.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from types import FrameType
from typing import IO, Any, TextIO

from distcomm._plugins.loader import check_backend
from distcomm._processes.variables import exit_status, launch_variables
from distcomm.backend.ports import free_port
from distcomm.errors import InvalidArgumentError

__all__ = ["run"]

#: Seconds between two looks at the ranks.
_POLL = 0.05
#: What ``signal.signal`` takes and returns.
_Handler = Callable[[int, FrameType | None], Any] | int | None
#: Signals the launcher forwards to every rank.
_FORWARDED = (signal.SIGINT, signal.SIGTERM)


def run(
    cmd_argv: Sequence[str],
    nprocs: int,
    backend: str | None = None,
    grace: float = 5.0,
    stdout: TextIO | None = None,
    stderr: TextIO | None = None,
) -> int:
    """Run ``cmd_argv`` as ``nprocs`` ranks on this node and return the job's exit status.

    Each rank gets this process's environment plus ``launch_variables`` (one free MASTER_PORT
    for all), runs in its own process group, and has each line of its stdout and
    stderr written to ``stdout`` / ``stderr`` prefixed ``[rank N] ``.

    The first rank to fail (a non-zero exit, or killed by a signal) stops the others: SIGTERM to
    their process groups, SIGKILL to whatever is left ``grace`` seconds later. SIGINT and
    SIGTERM received by this process (when called from the main thread) are forwarded to every
    rank's process group in the same way; a second one kills at once. Whatever happens,
    including an exception here, no rank (nor any process in a rank's group) is left running.

    Args:
        cmd_argv: the command every rank runs, program first, e.g.
            ``[sys.executable, "train.py", "--lr", "0.1"]``.
        nprocs: the number of ranks (at least 1).
        backend: sets ``DISTCOMM_BACKEND`` in the ranks; checked with :func:`check_backend`.
        grace: seconds between SIGTERM and SIGKILL (at least 0).
        stdout: where the ranks' stdout goes; default ``sys.stdout`` at the time of the call.
        stderr: where the ranks' stderr and the launcher's own messages go; default
            ``sys.stderr``.

    Returns:
        0 when every rank exited 0; else the first failing rank's exit status (128 + N for
        signal N); else, after a forwarded signal N, 128 + N (130 for SIGINT, 143 for SIGTERM).

    Raises:
        InvalidArgumentError: ``cmd_argv`` is empty, or ``nprocs`` or ``grace`` is invalid.
        BackendNotFoundError: ``backend`` names no backend.
    """
    argv = [str(arg) for arg in cmd_argv]
    if not argv:
        raise InvalidArgumentError(
            "cmd_argv=[] has nothing to run. HINT: e.g. [sys.executable, 'train.py']."
        )
    if not isinstance(nprocs, int) or isinstance(nprocs, bool) or nprocs < 1:
        raise InvalidArgumentError(
            f"nprocs={nprocs!r} must be a positive int. HINT: e.g. 2 for two ranks."
        )
    if isinstance(grace, bool) or not isinstance(grace, (int, float)) or not grace >= 0:
        raise InvalidArgumentError(
            f"grace={grace!r} must be a number of seconds >= 0. HINT: the default is 5."
        )
    if backend is not None:
        backend = check_backend(backend)
    job = _Job(argv, nprocs, backend, float(grace), stdout or sys.stdout, stderr or sys.stderr)
    return job.run()


class _Job:
    """One run of N ranks: start, copy output, watch, stop, report."""

    def __init__(
        self,
        argv: list[str],
        nprocs: int,
        backend: str | None,
        grace: float,
        stdout: TextIO,
        stderr: TextIO,
    ) -> None:
        self.argv = argv
        self.nprocs = nprocs
        self.backend = backend
        self.grace = grace
        self.stdout = stdout
        self.stderr = stderr
        self.procs: list[subprocess.Popen[bytes]] = []
        self.readers: list[threading.Thread] = []
        self.signals: list[int] = []  # appended by the signal handler, read by the main loop
        self.failed: tuple[int, int] | None = None  # (rank, exit status) of the first failure
        self.write_lock = threading.Lock()

    def run(self) -> int:
        previous = self._install_handlers()
        try:
            self._start()
            self._watch()
            self._stop_leftovers()
        finally:
            self._kill(signal.SIGKILL)
            for proc in self.procs:
                proc.wait()
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            for reader in self.readers:
                reader.join(timeout=1.0)
        if self.failed is not None:
            rank, status = self.failed
            self._say(f"rank {rank} failed with exit code {status}; stopped the other ranks")
            return status
        if self.signals:
            return 128 + self.signals[0]
        return 0

    # -- steps --------------------------------------------------------------------------------
    def _install_handlers(self) -> dict[int, _Handler]:
        if threading.current_thread() is not threading.main_thread():
            return {}
        return {sig: signal.signal(sig, self._on_signal) for sig in _FORWARDED}

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self.signals.append(signum)

    def _start(self) -> None:
        port = free_port()
        for rank in range(self.nprocs):
            if self.signals:
                return
            env = {**os.environ, **launch_variables(rank, self.nprocs, port, self.backend)}
            proc = subprocess.Popen(
                self.argv,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,
            )
            self.procs.append(proc)
            for pipe, out in ((proc.stdout, self.stdout), (proc.stderr, self.stderr)):
                assert pipe is not None
                reader = threading.Thread(
                    target=self._copy,
                    args=(pipe, f"[rank {rank}] ", out),
                    name=f"distcomm-run-rank-{rank}",
                    daemon=True,
                )
                reader.start()
                self.readers.append(reader)

    def _watch(self) -> None:
        """Wait until every rank has exited; start stopping them at the first failure or signal."""
        handled = 0  # signals acted on
        deadline: float | None = None  # when to SIGKILL what is left; None: not stopping
        stopping = False
        while True:
            codes = [proc.poll() for proc in self.procs]
            if not stopping and not self.signals:
                self.failed = next(
                    ((rank, exit_status(c)) for rank, c in enumerate(codes) if c), None
                )
                if self.failed is not None:
                    stopping, deadline = True, time.monotonic() + self.grace
                    self._kill(signal.SIGTERM)
            if len(self.signals) > handled:
                if stopping:  # a second signal, or one during a failure's stop: no more waiting
                    self._kill(signal.SIGKILL)
                else:
                    stopping, deadline = True, time.monotonic() + self.grace
                    name = signal.Signals(self.signals[0]).name
                    self._say(f"got {name}; forwarded it to every rank (again to kill them now)")
                    self._kill(self.signals[0])
                handled = len(self.signals)
            if all(code is not None for code in codes):
                return
            if deadline is not None and time.monotonic() >= deadline:
                self._kill(signal.SIGKILL)
                deadline = None
            time.sleep(_POLL)

    def _stop_leftovers(self) -> None:
        """Stop what the ranks left in their process groups: SIGTERM, then SIGKILL after grace."""
        groups = [proc.pid for proc in self.procs if _group_alive(proc.pid)]
        if not groups:
            return
        self._kill(signal.SIGTERM)
        deadline = time.monotonic() + self.grace
        while time.monotonic() < deadline and any(_group_alive(pgid) for pgid in groups):
            time.sleep(_POLL)

    # -- helpers ------------------------------------------------------------------------------
    def _kill(self, sig: int) -> None:
        """Send ``sig`` to every rank's process group (those that still exist)."""
        for proc in self.procs:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, sig)

    def _copy(self, pipe: IO[bytes], prefix: str, out: TextIO) -> None:
        """Copy ``pipe`` to ``out`` line by line, prefixed; keep draining if ``out`` fails."""
        with pipe:
            for raw in iter(pipe.readline, b""):
                text = raw.decode("utf-8", errors="replace")
                self._write(out, prefix + (text if text.endswith("\n") else text + "\n"))

    def _say(self, message: str) -> None:
        self._write(self.stderr, f"distcomm run: {message}\n")

    def _write(self, out: TextIO, text: str) -> None:
        with self.write_lock:
            try:
                try:
                    out.write(text)
                except UnicodeEncodeError:  # e.g. an ASCII terminal: escape what it cannot show
                    encoding = getattr(out, "encoding", None) or "ascii"
                    out.write(text.encode(encoding, "backslashreplace").decode(encoding))
                out.flush()
            except (OSError, ValueError):  # a closed or broken stream: the ranks still run
                pass


def _group_alive(pgid: int) -> bool:
    """Whether process group ``pgid`` has a member that is not a zombie.

    Zombies count as gone: a rank's orphaned children are reaped by init, which some containers'
    PID 1 never does. Without ``/proc``, any member counts.
    """
    try:
        os.killpg(pgid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    try:
        names = os.listdir("/proc")
    except OSError:
        return True
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as stat:
                fields = stat.read().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if len(fields) > 2 and int(fields[2]) == pgid and fields[0] not in (b"Z", b"X"):
            return True
    return False
