"""The rank processes of a warm world: started once, under a launcher, and given call after call.

The machinery behind :class:`distcomm.testing.WarmWorld`. :class:`RankProcesses` starts N rank
processes (multiprocessing's ``spawn`` method, or a launcher's command: ``distcomm run``,
``mpirun``, ``srun``, ``torchrun``) whose body is :mod:`distcomm._processes.warm_rank`, accepts
their connections on a Unix socket (in the abstract namespace; its name and a random key in a
private folder, 0700), sends each call
to every rank and collects the reports. A call that fails or does not finish in time raises as
``spawn``'s would, naming the rank (and the test that ran it); the processes are then broken and
the caller stops them. Nothing outlives :meth:`RankProcesses.stop`: the ranks are told to end,
and whatever is left of them and their launcher is terminated, then killed.
"""

from __future__ import annotations

import contextlib
import glob
import multiprocessing
import multiprocessing.spawn
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from multiprocessing.connection import Connection, Listener, wait
from typing import Any, cast

from distcomm._processes import warm_rank
from distcomm._processes.failure_summary import ended
from distcomm._processes.rank_ends import ask_for_stacks, died, read_text, where_they_are
from distcomm._processes.variables import launch_variables, new_run_id
from distcomm.backend.ports import free_port
from distcomm.errors import DistTimeoutError, RankFailedError

__all__ = ["LAUNCHERS", "RankProcesses", "launcher_command"]

#: The launchers a warm world starts its ranks with.
LAUNCHERS = ("spawn", "distcomm run", "mpirun", "srun", "torchrun")
#: Seconds the processes have to end once told to (then SIGTERM), and after SIGTERM (SIGKILL).
_GRACE = 5.0
#: What every call's environment sets: a rank's init makes its own store even under torchrun.
_RUN_VARIABLES = {"TORCHELASTIC_USE_AGENT_STORE": "False"}
#: multiprocessing's name of a rank process.
_PROCESS_NAME = "distcomm-warm-rank"


def launcher_command(launcher: str, nprocs: int, args: Sequence[str], folder: str) -> list[str]:
    """The command that starts ``nprocs`` ranks of a warm world under ``launcher``."""
    body = ["-m", "distcomm._processes.warm_rank", folder]
    python, n = sys.executable, str(nprocs)
    if launcher == "distcomm run":
        return [python, "-m", "distcomm", "run", "-n", n, *args, *body]
    if launcher == "torchrun":
        return [python, "-m", "torch.distributed.run", "--nproc-per-node", n, *args, *body]
    if launcher == "mpirun":
        found = shutil.which("mpirun", path=os.path.dirname(python)) or shutil.which("mpirun")
        return [found or "mpirun", "-n", n, *args, python, *body]
    return ["srun", "-n", n, *args, python, *body]


class RankProcesses:
    """N rank processes started once; :meth:`call` runs a call on all of them.

    Args:
        nprocs: the number of ranks.
        launcher: one of :data:`LAUNCHERS`.
        launcher_args: more arguments for the launcher (``--overcommit`` for srun, ...).
        start_timeout: seconds for every rank to start and connect.
        describe: says which world this is, in messages (``"4 ranks of gloo under mpirun"``).
    """

    def __init__(
        self,
        nprocs: int,
        launcher: str,
        launcher_args: Sequence[str],
        start_timeout: float,
        describe: str,
    ) -> None:
        self.nprocs = nprocs
        self.describe = describe
        self.folder = tempfile.mkdtemp(prefix="distcomm-warm-")  # 0700
        self._environ = dict(os.environ)
        self._launcher: subprocess.Popen[bytes] | None = None
        self._spawned: list[multiprocessing.process.BaseProcess] = []
        self._conns: dict[int, Connection] = {}
        self._pids: dict[int, int] = {}
        #: The files in /dev/shm the ranks said they map (an MPI library's segments).
        self._mapped: set[str] = set()
        try:
            self._start(launcher, list(launcher_args), start_timeout)
        except BaseException:
            self.stop(kill=True)
            raise

    # -- starting ---------------------------------------------------------------------------
    def _start(self, launcher: str, args: list[str], start_timeout: float) -> None:
        key = secrets.token_bytes(32)
        key_path = os.path.join(self.folder, "key")
        with open(os.open(key_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb") as file:
            file.write(key)
        # In the abstract namespace: no file, and no limit from the folder's length (a socket's
        # path may have 107 bytes); the key keeps other processes out
        address = f"\0distcomm-warm-{secrets.token_hex(8)}"
        with open(os.path.join(self.folder, "address"), "w", encoding="utf-8") as file:
            file.write(address[1:])
        listener = Listener(address, family="AF_UNIX", authkey=key)
        try:
            if launcher == "spawn":
                self._spawn()
            else:
                command = launcher_command(launcher, self.nprocs, args, self.folder)
                with open(self.log_path, "wb") as log:
                    self._launcher = subprocess.Popen(
                        command,
                        stdin=subprocess.DEVNULL,
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        start_new_session=True,  # its process group is the world's to end
                    )
            self._accept(listener, start_timeout)
        finally:
            listener.close()

    def pid(self, rank: int) -> int:
        """The process id of rank ``rank``."""
        return self._pids[rank]

    @property
    def log_path(self) -> str:
        """The launcher's output (and each spawned rank's, outside calls)."""
        return os.path.join(self.folder, "launcher.log")

    def _spawn(self) -> None:
        context = multiprocessing.get_context("spawn")
        port, run = free_port(), new_run_id()
        for rank in range(self.nprocs):
            variables = launch_variables(rank, self.nprocs, port, None, run)
            log = os.path.join(self.folder, f"rank-{rank}.log")
            proc = context.Process(
                target=warm_rank.serve_spawned,
                args=(self.folder, variables, log),
                name=f"{_PROCESS_NAME}-{rank}",
                daemon=True,
            )
            proc.start()
            self._spawned.append(proc)

    def _accept(self, listener: Listener, start_timeout: float) -> None:
        """Take every rank's connection and hello, or raise why the ranks did not come."""
        arrived: list[Connection] = []
        failed: list[BaseException] = []

        def take() -> None:
            try:
                while len(arrived) < self.nprocs:
                    arrived.append(listener.accept())
            except BaseException as exc:  # the listener closed: the start failed
                failed.append(exc)

        taker = threading.Thread(target=take, daemon=True)
        taker.start()
        deadline = time.monotonic() + start_timeout
        while taker.is_alive():
            taker.join(0.1)
            ended = self._ended()
            if ended is not None or time.monotonic() > deadline:
                listener.close()
                taker.join()
                why = ended or f"only {len(arrived)} connected within {start_timeout:g} s"
                raise RankFailedError(
                    -1,
                    self.output_tail(),
                    f"warm world ({self.describe}): its ranks did not start: {why}.\n"
                    f"{self.output_tail()}HINT: read the output above; a rank that needs longer "
                    "to start (a slow import, a busy machine) needs a larger start_timeout=.",
                )
        for conn in arrived:
            _, rank, _, pid = conn.recv()
            conn.send(os.getpid())
            self._conns[rank] = conn
            self._pids[rank] = pid
        if sorted(self._conns) != list(range(self.nprocs)):
            raise RankFailedError(
                -1,
                "",
                f"warm world ({self.describe}): the ranks that connected say they are "
                f"{sorted(self._conns)}, not 0..{self.nprocs - 1}. HINT: the launcher must "
                f"start exactly {self.nprocs} ranks (one job step, no other job's variables).",
            )

    def _ended(self) -> str | None:
        """How the launcher or a spawned rank ended early, or None while they run."""
        if self._launcher is not None and self._launcher.poll() is not None:
            return f"the launcher ended ({ended(self._launcher.returncode, launcher=True)})"
        for rank, proc in enumerate(self._spawned):
            if proc.exitcode is not None:
                return f"rank {rank} ended ({ended(proc.exitcode)})"
        return None

    def output_tail(self, lines: int = 40) -> str:
        """The last lines of the launcher's output and of the spawned ranks' own."""
        names = ["launcher.log"] + [f"rank-{rank}.log" for rank in range(len(self._spawned))]
        shown = ""
        for name in names:
            tail = read_text(os.path.join(self.folder, name)).splitlines()[-lines:]
            if tail:
                shown += f"  {name}:\n" + "".join(f"    {line}\n" for line in tail)
        return shown

    # -- calls ------------------------------------------------------------------------------
    def call(
        self,
        payload: bytes,
        backend: str | None,
        timeout: float,
        op_timeout: float | None,
        test: str,
    ) -> list[Any]:
        """Run ``payload`` (``(fn, args)`` pickled) on every rank; the results in rank order.

        Raises:
            RankFailedError: a rank raised, or ended without a report.
            DistTimeoutError: some ranks had not reported within ``timeout``.
        """
        where = f" in {test}" if test else ""
        port = free_port()
        # A fresh rendezvous each call, as a new job's: run id and port (MASTER_PORT for the
        # env method, init's master_port for the launchers that derive their own)
        fresh = {"DISTCOMM_RUN_ID": new_run_id(), "MASTER_PORT": str(port)}
        environ = {**self._changed_environ(), **_RUN_VARIABLES, **fresh}
        message = ("run", payload, environ, _preparation(), port, backend, op_timeout)
        try:
            for rank, conn in self._conns.items():
                try:
                    conn.send(message)
                except OSError:
                    raise died(rank, self.nprocs, self._exit_code(rank), where) from None
            return self._collect(timeout, where)
        finally:
            self._show_output()

    def _changed_environ(self) -> dict[str, str | None]:
        """The controller's environment changes since the start (None: removed), which the
        ranks take for the call, as spawned processes would inherit them."""
        now = os.environ
        changes: dict[str, str | None] = {k: v for k, v in now.items() if self._environ.get(k) != v}
        changes.update({k: None for k in self._environ if k not in now})
        return changes

    def _collect(self, timeout: float, where: str) -> list[Any]:
        results: dict[int, Any] = {}
        rank_of = {conn: rank for rank, conn in self._conns.items()}
        deadline = time.monotonic() + timeout
        while len(results) < self.nprocs:
            remaining = deadline - time.monotonic()
            pending = [conn for conn, rank in rank_of.items() if rank not in results]
            if remaining <= 0:
                raise self._timed_out(sorted(rank_of[c] for c in pending), timeout, where)
            for ready in wait(pending, remaining):
                conn = cast(Connection, ready)
                rank = rank_of[conn]
                try:
                    ok, value, mapped = conn.recv()
                except (EOFError, OSError):
                    raise died(rank, self.nprocs, self._exit_code(rank), where) from None
                self._mapped.update(mapped)
                if not ok:
                    raise RankFailedError(
                        rank,
                        value,
                        f"rank {rank} of {self.nprocs} failed{where} "
                        f"(warm world: {self.describe}):\n{value}",
                    )
                results[rank] = value
        return [results[rank] for rank in range(self.nprocs)]

    def _exit_code(self, rank: int) -> int | None:
        if self._spawned:
            proc = self._spawned[rank]
            proc.join(_GRACE)
            return proc.exitcode
        return None

    def _timed_out(self, missing: list[int], timeout: float, where: str) -> DistTimeoutError:
        paths = {rank: warm_rank.stacks_path(self.folder, rank) for rank in missing}
        texts = ask_for_stacks({rank: self._pids.get(rank) for rank in missing}, paths)
        stacks = where_they_are(sorted(texts.items()), [warm_rank.__file__])
        return DistTimeoutError(
            f"warm world ({self.describe}): ranks {missing} of {self.nprocs} did not finish"
            f"{where} within {timeout:g} s.\n{stacks}HINT: a rank is stuck where shown (a rank "
            "outside distcomm keeps the others waiting in their next collective), or it is "
            "merely slow: raise timeout=. The world's processes are replaced before its next "
            "call.",
            op="warm world",
            missing_ranks=missing,
        )

    def _show_output(self) -> None:
        """Write what each rank printed during the call to this process's stdout, each line
        prefixed ``[rank N] ``."""
        for rank in range(self.nprocs):
            text = read_text(warm_rank.output_path(self.folder, rank))
            if text:
                sys.stdout.write("".join(f"[rank {rank}] {line}\n" for line in text.splitlines()))
        sys.stdout.flush()

    # -- stopping ---------------------------------------------------------------------------
    def stop(self, *, kill: bool = False) -> None:
        """End every process: told to (unless ``kill``), then SIGTERM, then SIGKILL; remove the
        folder."""
        if not kill:
            for conn in self._conns.values():
                with contextlib.suppress(OSError):
                    conn.send(("close",))
            self._wait(_GRACE)
        for sig in (signal.SIGTERM, signal.SIGKILL):
            if self._wait(0 if sig == signal.SIGTERM else _GRACE):
                break
            self._signal(sig)
        self._wait(_GRACE)
        for conn in self._conns.values():
            conn.close()
        self._conns.clear()
        _remove_orphans(self._mapped)
        shutil.rmtree(self.folder, ignore_errors=True)

    def _alive(self) -> list[Callable[[], bool]]:
        checks: list[Callable[[], bool]] = [proc.is_alive for proc in self._spawned]
        if self._launcher is not None:
            launcher = self._launcher
            checks.append(lambda: launcher.poll() is None)
        checks += [_process_exists(pid) for pid in self._pids.values()]
        return checks

    def _wait(self, seconds: float) -> bool:
        """Whether every process ended within ``seconds``."""
        deadline = time.monotonic() + seconds
        while any(alive() for alive in self._alive()):
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.05)
        for proc in self._spawned:
            proc.join(0)
        return True

    def _signal(self, sig: signal.Signals) -> None:
        if self._launcher is not None:
            with contextlib.suppress(OSError):
                os.killpg(self._launcher.pid, sig)
        for pid in [*self._pids.values(), *(p.pid for p in self._spawned if p.pid)]:
            with contextlib.suppress(OSError):
                os.kill(pid, sig)


def _preparation() -> dict[str, Any]:
    """What multiprocessing gives a process it spawns (``sys.path``, the working directory, the
    main module to import as ``__mp_main__``), without this process's authentication key."""
    data: dict[str, Any] = multiprocessing.spawn.get_preparation_data(_PROCESS_NAME)
    data.pop("authkey", None)
    return data


def _remove_orphans(paths: set[str]) -> None:
    """Remove the files of ``paths`` that no process maps any more: what a rank killed before
    its library cleaned up (MPICH's segment, when a rank dies and the launcher kills the rest)
    would leave in /dev/shm. A file another live process maps is left alone."""
    left = {path for path in paths if os.path.exists(path)}
    if not left:
        return
    for maps in glob.glob("/proc/[0-9]*/maps"):
        text = read_text(maps)  # "" when gone, or not ours to read
        left = {path for path in left if path not in text}
        if not left:
            return
    for path in left:
        with contextlib.suppress(OSError):
            os.unlink(path)


def _process_exists(pid: int) -> Callable[[], bool]:
    def exists() -> bool:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        # A zombie child of ours (spawned) still answers: ask its state
        try:
            with open(f"/proc/{pid}/stat", encoding="ascii") as file:
                return file.read().rpartition(")")[2].split()[0] != "Z"
        except OSError:
            return False

    return exists
