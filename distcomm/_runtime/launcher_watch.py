"""A rank ends with its launcher: nothing of a job outlives ``distcomm run``, torchrun or srun.

A launcher that dies without stopping its ranks (SIGKILL, the OOM killer, a scheduler) leaves
them re-parented to init, holding memory and devices until their script ends or a collective
times out. So ``init()`` in a rank that a launcher started (:func:`launcher_of`: ``distcomm
run``, torchrun, srun, mpirun; not a script run by hand) starts a thread that waits for the
launcher's process to end: on a pidfd, which the kernel makes readable when it exits (no
polling), or, where there is none, a look every :data:`_POLL` seconds. When it ends, the rank
ends within a moment, cleanly, even if its main thread is blocked in the engine (which waits
without the GIL):

- a last line on stderr (``distcomm run``'s own stderr, which its ranks keep a copy of, since
  their stderr is a pipe to the launcher that went away) naming the launcher and its pid;
- its last words (:func:`~distcomm.backend.aborts.last_words`: the flight recorder dumped, when
  it is on);
- the job's temporary folders it knows of removed (``distcomm run``'s failure reports,
  torchrun's error files), its own children killed (a DataLoader's workers);
- exit status :data:`LAUNCHER_GONE` (75).

``DISTCOMM_DETACH=1`` lets a rank outlive its launcher on purpose. A launcher's own endings
(Ctrl-C, a failed rank, restarts) stop the ranks before it exits, as they always did.
"""

from __future__ import annotations

import contextlib
import os
import re
import select
import shutil
import signal
import tempfile
import threading
import time
from collections.abc import Mapping

from distcomm import _settings
from distcomm._logs import logger
from distcomm.backend import aborts
from distcomm.environment.info import LaunchInfo

__all__ = ["LAUNCHER_GONE", "launcher_of", "watch"]

#: The exit status of a rank whose launcher went away.
LAUNCHER_GONE = 75
#: Seconds between two looks at the launcher where the kernel has no pidfd.
_POLL = 0.25
#: The launcher being watched, once a thread watches it (one per process).
_watched: tuple[str, int] | None = None
_lock = threading.Lock()


def launcher_of(
    launch: LaunchInfo, environ: Mapping[str, str] | None = None
) -> tuple[str, int] | None:
    """The launcher that started this rank and its pid: ``distcomm run`` (its pid in
    ``DISTCOMM_RUN_PID``), or this process's parent under torchrun (its agent), srun (Slurm's
    step daemon) and mpirun (its proxy); None for a process no launcher started, or with
    ``DISTCOMM_DETACH=1``."""
    env = os.environ if environ is None else environ
    if _settings.read("DISTCOMM_DETACH", env):
        return None
    pid = _settings.read("DISTCOMM_RUN_PID", env)
    if pid is not None:
        return "distcomm run", pid
    ours = launch.sources.get("job_id") == "DISTCOMM_RUN_ID"  # spawn's (distcomm run's: above)
    if launch.method == "env" and env.get("TORCHELASTIC_RUN_ID") and not ours:
        name = "torchrun"
    elif launch.method == "slurm":
        name = "srun"
    elif launch.method == "mpi":
        name = "mpirun"
    else:
        return None
    return name, os.getppid()


def watch(launch: LaunchInfo) -> None:
    """End this rank when its launcher ends (module docstring); once per process."""
    global _watched
    found = launcher_of(launch)
    with _lock:
        if found is None or _watched is not None:
            return
        _watched = found
    name, pid = found
    thread = threading.Thread(
        target=_wait_then_end, args=(name, pid, launch.rank), name="distcomm-launcher-watch"
    )
    thread.daemon = True
    thread.start()
    logger.debug("rank %d ends with its launcher (%s, pid %d)", launch.rank, name, pid)


def _wait_then_end(name: str, pid: int, rank: int) -> None:
    """The watching thread: wait for ``pid`` to end, then end this rank. A launcher that is no
    longer this process's ancestor (it died before ``init()``; its pid may be another's now) is
    gone already."""
    try:
        handle = os.pidfd_open(pid)
    except (AttributeError, OSError):  # no pidfd here, or already gone (then the loop ends)
        while _alive(pid) and _ancestor(pid):
            time.sleep(_POLL)
    else:
        try:
            if _ancestor(pid):
                select.select([handle], [], [])
        finally:
            os.close(handle)
    _end(name, pid, rank)


def _ancestor(pid: int) -> bool:
    """Whether ``pid`` is this process's parent, or its parent's, and so on (read from /proc;
    where there is none, assumed)."""
    here = os.getppid()
    for _ in range(64):
        if here == pid:
            return True
        if here <= 1:
            return False
        try:
            here = int(_stat(here)[1])
        except (OSError, ValueError, IndexError):
            return not os.path.isdir("/proc/self")
    return False


def _stat(pid: int) -> list[str]:
    """The fields of ``/proc/<pid>/stat`` after the command's name: state, parent pid, ...

    Raises:
        OSError: no such process, or no /proc.
    """
    with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as stat:
        return stat.read().rpartition(")")[2].split()


def _alive(pid: int) -> bool:
    """Whether ``pid`` still runs (a zombie, never reaped by a dead parent, does not)."""
    try:
        return _stat(pid)[0] != "Z"
    except OSError:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except OSError:
            return True
        return True


def _end(name: str, pid: int, rank: int) -> None:
    """This rank's clean ending after its launcher's death (module docstring)."""
    _say(
        f"distcomm: rank {rank}: its launcher ({name}, pid {pid}) went away; ending this rank "
        f"(exit status {LAUNCHER_GONE}) so that nothing of the job outlives it. HINT: "
        "DISTCOMM_DETACH=1 keeps a rank running after its launcher ends."
    )
    aborts.last_words()  # the flight recorder, when it is on
    _remove_job_folders()
    _kill_children()
    os._exit(LAUNCHER_GONE)


def _say(line: str) -> None:
    """``line`` on ``distcomm run``'s own stderr (its ranks keep a copy), else on this one's."""
    data = (line + "\n").encode()
    fd = _settings.read("DISTCOMM_RUN_STDERR")
    for target in ([] if fd is None else [fd]) + [2]:
        try:
            os.write(target, data)
            return
        except (OSError, ValueError):
            continue


def _remove_job_folders() -> None:
    """The job's temporary folders that no launcher is left to remove: ``distcomm run``'s
    failure reports, torchrun's error files (its ``torchelastic_*`` folder)."""
    reports = _settings.read("DISTCOMM_RUN_REPORTS")
    if reports:
        shutil.rmtree(reports, ignore_errors=True)
    error_file = os.environ.get("TORCHELASTIC_ERROR_FILE", "")
    top = re.match(r"(.*?/torchelastic_[^/]+)/", error_file)
    if top and os.path.dirname(top[1]) == tempfile.gettempdir():
        shutil.rmtree(top[1], ignore_errors=True)


def _kill_children() -> None:
    """SIGKILL every process this one started, and theirs (read from /proc; Linux only)."""
    parents: dict[int, list[int]] = {}
    with contextlib.suppress(OSError):
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                with contextlib.suppress(OSError, IndexError, ValueError):
                    parents.setdefault(int(_stat(int(entry))[1]), []).append(int(entry))
    stack = list(parents.get(os.getpid(), []))
    while stack:
        child = stack.pop()
        stack += parents.get(child, [])
        with contextlib.suppress(OSError):
            os.kill(child, signal.SIGKILL)
