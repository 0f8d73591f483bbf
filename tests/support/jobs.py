"""What tests need to start jobs as a user would: a clean environment and the launcher's path."""

from __future__ import annotations

import multiprocessing
import os
import shutil
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path

#: What ``distcomm run --backend B`` and ``distcomm.testing.spawn`` set in each rank.
RUN_VARIABLES = (
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "GROUP_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "TORCHELASTIC_USE_AGENT_STORE",
    "TORCHELASTIC_RESTART_COUNT",
    "PYTHONUNBUFFERED",
    "DISTCOMM_BACKEND",
    "DISTCOMM_RUN_ID",
)


def job_environment() -> dict[str, str]:
    """This process's environment for a child job: without DISTCOMM_* and MASTER_* variables,
    and without pytest-xdist's (a pytest the job runs is not a worker of this one); with
    OMP_NUM_THREADS=1 unless set (several ranks on two cores: what distcomm run and torchrun
    set, without their notice; the tests of that notice leave it out)."""
    dropped = ("DISTCOMM_", "MASTER_", "PYTEST_XDIST_")
    kept = {k: v for k, v in os.environ.items() if not k.startswith(dropped)}
    return {"OMP_NUM_THREADS": "1", **kept}


def dev_shm_names() -> set[str]:
    """The names in /dev/shm that no running process uses: a job that distcomm ended must leave
    the same set behind. A file a live process maps or holds open is a running job's (another
    test's, beside this one on another pytest-xdist worker), not a leftover."""
    names = set(os.listdir("/dev/shm"))
    return names - {os.path.basename(p) for p in in_use(f"/dev/shm/{n}" for n in names)}


def in_use(paths: Iterable[str]) -> set[str]:
    """Those of ``paths`` that a live process maps, holds open or names in its environment
    (MPICH's ranks find their launcher's topology file through ``HWLOC_XMLFILE``)."""
    wanted = set(paths)
    used: set[str] = set()
    if not wanted:
        return used
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            maps = (proc / "maps").read_text(errors="replace")
            environ = (proc / "environ").read_bytes().decode(errors="replace")
            fds = [os.readlink(fd) for fd in (proc / "fd").iterdir()]
        except OSError:
            continue  # gone, or not readable
        used |= {p for p in wanted - used if p in maps or p in environ or p in fds}
        if used == wanted:
            break
    return used


def children_left() -> list[multiprocessing.process.BaseProcess]:
    """This process's multiprocessing children, but the ranks of the session's warm worlds
    (``conftest.warm_world``: kept from test to test on purpose, closed at the end)."""
    return [
        child
        for child in multiprocessing.active_children()
        if not child.name.startswith("distcomm-warm-rank-")
    ]


def find_mpirun() -> str | None:
    """The path of ``mpirun``, the venv's MPICH first; None where there is none."""
    return shutil.which("mpirun", path=os.path.dirname(sys.executable)) or shutil.which("mpirun")


def run_job(
    command: list[str],
    *,
    timeout: float = 180,
    cwd: str | os.PathLike[str] | None = None,
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run ``command`` as a user's job would start: the clean environment (plus ``env``), no
    stdin, output captured as text, and a timeout so that a hung job fails the test instead of
    the suite."""
    return subprocess.run(
        command,
        cwd=cwd,
        env={**job_environment(), **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )
