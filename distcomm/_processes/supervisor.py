"""Starting N ranks on this node: the process management behind ``distcomm run``.

:func:`run` starts one child process per rank with the launcher variables that distcomm's ``env``
detection reads (:mod:`distcomm._processes.variables`), copies each child's output to the
launcher's, prefixed ``[rank N] ``, and stops the whole job as soon as one rank fails or the
launcher is interrupted (after a Ctrl-C it says so in one line, without the ranks'
``KeyboardInterrupt`` tracebacks: :mod:`distcomm._processes.tracebacks`). Every child runs in
its own session (process group), so that signals reach a rank only through the launcher, and so
that a rank's own children are stopped with it.

This module imports neither torch nor any backend; ``distcomm.testing.spawn`` shares its variables.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from typing import IO, Any, TextIO

from distcomm import _settings
from distcomm._plugins.loader import check_backend
from distcomm._processes import failure_summary, tracebacks
from distcomm._processes.arguments import checked_argv, open_logs
from distcomm._processes.signals import FORWARDED, caught_signals
from distcomm._processes.variables import (
    exit_status,
    launch_variables,
    new_run_id,
    stderr_copy,
    torchrun_defaults,
)
from distcomm._traces import traces_folder
from distcomm.backend.ports import free_port
from distcomm.errors import DistcommError

__all__ = ["run"]

#: Seconds between two looks at the ranks.
_POLL = 0.05
#: Where a rank's uncaught exception is reported (distcomm._runtime.failure_reports.VARIABLE).
_REPORTS = "DISTCOMM_RUN_REPORTS"
#: A traceback on a rank's stderr is held back until the rank exits, or this many seconds (no
#: limit once the rank has written its failure report: it is exiting with that error).
_HOLD = 2.0
#: Seconds after a Ctrl-C before the launcher says which ranks it still waits for.
_PATIENCE = 2.0


def run(
    cmd_argv: Sequence[str],
    nprocs: int,
    backend: str | None = None,
    grace: float = 5.0,
    stdout: TextIO | None = None,
    stderr: TextIO | None = None,
    log_dir: str | os.PathLike[str] | None = None,
    max_restarts: int = 0,
) -> int:
    """Run ``cmd_argv`` as ``nprocs`` ranks on this node and return the job's exit status.

    Each rank gets this process's environment plus ``launch_variables`` (one free MASTER_PORT
    for all), runs in its own process group, and has each line of its stdout and
    stderr written to ``stdout`` / ``stderr`` prefixed ``[rank N] `` (torch's own ``[rankN]: ``
    prefix, which it puts on tracebacks, is taken off: one prefix per line).

    The first rank to fail (a non-zero exit, or killed by a signal) stops the others: SIGTERM to
    their process groups, SIGKILL to whatever is left ``grace`` seconds later. A traceback on a
    rank's stderr is held back until the rank exits (or for 2 s, if it goes on); when the job
    failed, the root cause's traceback (the earliest uncaught exception that is not a
    communication error, from the ranks' reports: :mod:`distcomm._processes.failure_summary`) is
    shown once, at the end, under a heading, and each other rank gets one line. SIGINT and
    SIGTERM received by this process (when called from the main thread) are forwarded to every
    rank's process group in the same way; a second one kills at once. After SIGINT (Ctrl-C),
    the ranks' ``KeyboardInterrupt`` tracebacks are dropped (their other output is kept) and
    one line says that the job was interrupted and how many ranks were stopped (another, if
    they take more than 2 s, names those still running). Whatever happens,
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
        log_dir: also keep each rank's whole output (every attempt's), unprefixed, in
            ``log_dir/rank-N.log`` (the folder is made if missing, private; the files 0600).
        max_restarts: when a rank fails, start a fresh world (new run id and port;
            ``TORCHELASTIC_RESTART_COUNT`` says which restart, as under torchrun), up to this
            many times, after each failure's summary; never after a signal.

    Returns:
        0 when every rank exited 0; else the first failing rank's exit status (128 + N for
        signal N); else, after a forwarded signal N, 128 + N (130 for SIGINT, 143 for SIGTERM);
        with restarts, the last attempt's.

    Raises:
        InvalidArgumentError: ``cmd_argv`` is empty, ``nprocs`` or ``grace`` is invalid, or
            ``log_dir`` cannot be made or written.
        BackendNotFoundError: ``backend`` names no backend.
    """
    argv = checked_argv(cmd_argv, nprocs, grace, max_restarts)
    backend = None if backend is None else check_backend(backend)
    logs = None if log_dir is None else open_logs(log_dir, nprocs)
    out, err = stdout or sys.stdout, stderr or sys.stderr
    return _run_attempts(argv, nprocs, backend, float(grace), out, err, logs, max_restarts)


def _run_attempts(
    argv: list[str],
    nprocs: int,
    backend: str | None,
    grace: float,
    out: TextIO,
    err: TextIO,
    logs: list[IO[bytes]] | None,
    max_restarts: int,
) -> int:
    """Run the job, and again in a fresh world after each failure (not after a signal), at most
    ``max_restarts`` more times; return the last attempt's exit status. ``logs`` are closed at
    the end, whatever happens. SIGINT and SIGTERM are caught (:func:`caught_signals`) from
    before the run's folder is made until it is removed."""
    defaults = torchrun_defaults(nprocs, os.environ, err)  # says so, as torchrun does
    try:
        with caught_signals() as signals:
            restart = 0
            while True:
                job = _Job(argv, nprocs, backend, grace, out, err, restart)
                job.logs, job.signals = logs, signals
                job.defaults = {**defaults, "TORCHELASTIC_MAX_RESTARTS": str(max_restarts)}
                try:
                    job.reports = tempfile.mkdtemp(prefix="distcomm-run-")  # 0700
                    status = job.run()
                finally:
                    if job.reports:
                        shutil.rmtree(job.reports, ignore_errors=True)
                if status == 0 or job.signals or restart == max_restarts:
                    return status
                restart += 1
                how = failure_summary.ended(status, launcher=True)
                job._say(
                    f"attempt {restart} of {max_restarts + 1} failed ({how}); starting every rank "
                    f"again (restart {restart} of {max_restarts})"
                )
    finally:
        for log in logs or ():
            log.close()


def _traces(run: str) -> str | None:
    """Where the ranks' flight recorders write (the folder of run ``run``), if DISTCOMM_TRACE is
    on; None otherwise, or when it is malformed (each rank says so)."""
    try:
        return traces_folder(run) if _settings.read("DISTCOMM_TRACE") else None
    except DistcommError:
        return None


def _catches(pid: int, signum: int) -> bool:
    """Whether process ``pid`` has a handler for ``signum`` (Linux's /proc; False where it
    cannot be read)."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as status:
            caught = next(line for line in status if line.startswith("SigCgt:"))
    except (OSError, StopIteration):
        return False
    return bool(int(caught.split()[1], 16) >> (signum - 1) & 1)


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
        restart: int = 0,
    ) -> None:
        self.argv = argv
        self.restart = restart  # how many times the job was started again before this run
        self.nprocs = nprocs
        self.backend = backend
        self.grace = grace
        self.stdout = stdout
        self.stderr = stderr
        self.procs: list[subprocess.Popen[bytes]] = []
        self.readers: list[threading.Thread] = []
        self.signals: list[int] = []  # appended by the signal handler, read by the main loop
        self.failed: tuple[int, int] | None = None  # (rank, return code) of the first failure
        self.write_lock = threading.Lock()
        self.logs: list[IO[bytes]] | None = None  # rank-N.log files (--log-dir)
        self.reports = ""  # the folder of the ranks' failure reports
        self.defaults: dict[str, str] = {}  # what torchrun also sets (torchrun_defaults)
        self.held: dict[int, tuple[float, list[str]]] = {}  # rank -> (since, traceback lines)
        self.shown: set[int] = set()  # ranks whose traceback was written as it came
        self.interrupted: list[int] = []  # the ranks that were running at a Ctrl-C
        self.traces: str | None = None  # where the flight recorder writes (DISTCOMM_TRACE)

    def run(self) -> int:
        passed_on = self._pass_on_the_trace_signal()
        try:
            self._start()
            self._watch()
            self._stop_leftovers()
        finally:
            if passed_on is not None:
                signal.signal(*passed_on)
            self._kill(signal.SIGKILL)
            for proc in self.procs:
                proc.wait()
            for reader in self.readers:
                reader.join(timeout=1.0)
        if self.failed is not None:
            return self._report_failure(*self.failed)
        self._release(list(self.held))
        if self.signals and self.signals[0] == signal.SIGINT:
            self._say(self._interrupt_line())
        if self.signals:
            return 128 + self.signals[0]
        return 0

    def _pass_on_the_trace_signal(self) -> tuple[signal.Signals, Any] | None:
        """With DISTCOMM_TRACE on, the flight recorder's signal (SIGUSR2) to this process is
        passed to every rank running that handles it (its own process: the rank dumps and goes
        on; a rank before init, which would die of it, is left out); return the signal and the
        handler to put back. Nothing from a thread that is not the main one."""
        if threading.current_thread() is not threading.main_thread():
            return None
        try:
            if not _settings.read("DISTCOMM_TRACE"):
                return None
            sig = _settings.read("DISTCOMM_TRACE_SIGNAL")
        except DistcommError:  # each rank says what is wrong with it
            return None
        if sig in FORWARDED:
            return None

        def pass_on(signum: int, frame: object) -> None:
            for proc in self.procs:
                # a rank before init has no handler: the signal's default would end it
                if proc.poll() is not None or not _catches(proc.pid, signum):
                    continue
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, signum)

        return sig, signal.signal(sig, pass_on)

    def _interrupt_line(self) -> str:
        """``interrupted (Ctrl-C); stopped 4 ranks`` (and how many had to be killed)."""
        stopped = len(self.interrupted)
        if not stopped:
            return "interrupted (Ctrl-C)"
        killed = sum(self.procs[rank].poll() == -signal.SIGKILL for rank in self.interrupted)
        line = f"interrupted (Ctrl-C); stopped {stopped} rank{'s' if stopped > 1 else ''}"
        return line + (f" ({killed} with SIGKILL)" if killed else "")

    def _report_failure(self, first: int, first_code: int) -> int:
        """The root cause's traceback under a heading, a line per other rank, the verdict."""
        reports = failure_summary.read_reports(self.reports)
        root = failure_summary.root_cause(reports, first)
        codes = [proc.poll() for proc in self.procs]
        code = codes[root]
        stopped = root != first and code is not None and -code in (signal.SIGTERM, signal.SIGKILL)
        code = first_code if stopped or not code else code
        report = reports.get(root)
        where = f" on {report['host']}" if report and report.get("host") else ""
        how = "then stopped by distcomm run" if stopped else failure_summary.ended(code)
        with self.write_lock:
            held = self.held.pop(root, (0.0, []))[1]
            self.held.clear()  # the other ranks' tracebacks: one line each below
        if not held and report and root not in self.shown:
            held = [f"[rank {root}] {line}\n" for line in report["traceback"].splitlines()]
        if root in self.shown and not held:
            self._say(f"the first error: rank {root}{where} ({how}); its traceback is above")
        elif held or report:
            self._say(f"the first error: rank {root}{where} ({how}):")
            for line in held:
                self._write(self.stderr, line)
        for rank, other in enumerate(codes):
            if rank != root:
                self._say(failure_summary.summary_line(rank, other, reports.get(rank), report))
        self._say(f"rank {root} {failure_summary.failed(code)}; stopped the other ranks")
        if self.traces is not None:
            self._say(f"the ranks' last calls: distcomm trace {self.traces}")
        return exit_status(code)

    # -- steps --------------------------------------------------------------------------------
    def _start(self) -> None:
        """Start every rank; each keeps a copy of this process's stderr (``DISTCOMM_RUN_STDERR``)
        for its last line should this process die (:mod:`distcomm._runtime.launcher_watch`)."""
        port, run, copy = free_port(), new_run_id(), stderr_copy(self.stderr)
        self.traces = _traces(run)
        if self.traces is not None:
            self._say(f"DISTCOMM_TRACE: the ranks' last calls go to {self.traces}")
        for rank in range(self.nprocs):
            if self.signals:
                break
            variables = launch_variables(rank, self.nprocs, port, self.backend, run, self.restart)
            env = {**os.environ, **variables, **self.defaults, _REPORTS: self.reports}
            env["DISTCOMM_RUN_PID"] = str(os.getpid())  # a rank ends when this process does
            env["DISTCOMM_RUN_STDERR"] = "" if copy is None else str(copy)
            proc = subprocess.Popen(
                self.argv,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,
                pass_fds=() if copy is None else (copy,),
            )
            self.procs.append(proc)
            for pipe, out in ((proc.stdout, self.stdout), (proc.stderr, self.stderr)):
                assert pipe is not None
                reader = threading.Thread(
                    target=self._copy,
                    args=(pipe, rank, out, out is self.stderr and pipe is proc.stderr),
                    name=f"distcomm-run-rank-{rank}",
                    daemon=True,
                )
                reader.start()
                self.readers.append(reader)
        if copy is not None:
            os.close(copy)

    def _watch(self) -> None:
        """Wait until every rank has exited; start stopping them at the first failure or signal."""
        handled = 0  # signals acted on
        deadline: float | None = None  # when to SIGKILL what is left; None: not stopping
        notice: float | None = None  # when to name the ranks that a Ctrl-C has not stopped yet
        stopping = False
        while True:
            codes = [proc.poll() for proc in self.procs]
            if not stopping and not self.signals:
                self.failed = next(((rank, c) for rank, c in enumerate(codes) if c), None)
                if self.failed is not None:
                    stopping, deadline = True, time.monotonic() + self.grace
                    self._kill(signal.SIGTERM)
            if len(self.signals) > handled:
                if stopping:  # a second signal, or one during a failure's stop: no more waiting
                    self._kill(signal.SIGKILL)
                else:
                    stopping, deadline = True, time.monotonic() + self.grace
                    notice = self._forward(codes)
                handled = len(self.signals)
            if all(code is not None for code in codes):
                return
            if notice is not None and time.monotonic() >= notice and handled == 1:
                left = [str(rank) for rank, code in enumerate(codes) if code is None]
                which = f"rank {left[0]}" if len(left) == 1 else f"ranks {', '.join(left)}"
                self._say(f"waiting for {which} to stop (Ctrl-C again to kill them now)")
                notice = None
            if deadline is not None and time.monotonic() >= deadline:
                self._kill(signal.SIGKILL)
                deadline = None
            with self.write_lock:
                held = list(self.held.items())
            self._release([rank for rank, (since, _) in held if self._stale(rank, since)])
            time.sleep(_POLL)

    def _forward(self, codes: list[int | None]) -> float | None:
        """Forward the first signal to every rank; return when to name the ranks still running
        after a Ctrl-C (None: not a Ctrl-C, whose line comes at the end)."""
        self._kill(self.signals[0])
        if self.signals[0] == signal.SIGINT:
            self.interrupted = [rank for rank, code in enumerate(codes) if code is None]
            return time.monotonic() + _PATIENCE
        name = signal.Signals(self.signals[0]).name
        self._say(f"got {name}; forwarded it to every rank (again to kill them now)")
        return None

    def _stale(self, rank: int, since: float) -> bool:
        """A held traceback of a rank that goes on, or ended well (it was logged, not fatal):
        write it. Not while the job is being stopped: the end sorts them out; nor while a rank
        that wrote its failure report is exiting (its exit, however slow, will be the error)."""
        if self.failed is not None or self.signals:
            return False
        code = self.procs[rank].poll()
        reported = os.path.join(self.reports, f"rank-{rank}.json")
        if code is None and self.reports and os.path.exists(reported):
            return False
        return code == 0 or (code is None and time.monotonic() - since > _HOLD)

    def _release(self, ranks: list[int]) -> None:
        """Write the held tracebacks of ``ranks`` as they came (after a Ctrl-C, without the
        ``KeyboardInterrupt`` ones)."""
        for rank in sorted(ranks):
            with self.write_lock:
                _, lines = self.held.pop(rank, (0.0, []))
            if self.signals and self.signals[0] == signal.SIGINT:
                lines = tracebacks.without_interrupts(lines, f"[rank {rank}] ")
            if lines:
                self.shown.add(rank)
            for line in lines:
                self._write(self.stderr, line)

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

    def _copy(self, pipe: IO[bytes], rank: int, out: TextIO, errors: bool) -> None:
        """Copy ``pipe`` to ``out`` line by line, prefixed ``[rank N] `` (torch's ``[rankN]: ``
        and the rank's own ``[rank N] `` taken off), holding a traceback back on stderr
        (``errors``); keep draining if ``out`` fails. Also to the rank's log, unchanged."""
        prefix, torch_prefix = f"[rank {rank}] ", f"[rank{rank}]: "
        own = (torch_prefix, prefix)  # torch's, and the one a rank's own report carries
        log = None if self.logs is None else self.logs[rank]
        with pipe:
            for raw in iter(pipe.readline, b""):
                if log is not None:
                    with self.write_lock, contextlib.suppress(OSError, ValueError):
                        log.write(raw)
                        log.flush()
                text = raw.decode("utf-8", errors="replace")
                for lead in own:
                    text = text.removeprefix(lead)
                line = prefix + (text if text.endswith("\n") else text + "\n")
                if errors and self._hold(rank, text, line):
                    continue
                self._write(out, line)

    def _hold(self, rank: int, text: str, line: str) -> bool:
        """Keep ``line`` back if it is (or follows) the start of a traceback on stderr
        (:func:`distcomm._processes.tracebacks.starts`)."""
        with self.write_lock:
            held = self.held.get(rank)
            if held is None and not tracebacks.starts(text):
                return False
            if held is None:
                held = self.held[rank] = (time.monotonic(), [])
            held[1].append(line)
            return True

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
