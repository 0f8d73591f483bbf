"""What tests need to start jobs as a user would: a clean environment and the launcher's path."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

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
    """This process's environment for a child job: without DISTCOMM_* and MASTER_* variables."""
    return {k: v for k, v in os.environ.items() if not k.startswith(("DISTCOMM_", "MASTER_"))}


def dev_shm_names() -> set[str]:
    """The names in /dev/shm now: a job that distcomm ended must leave the same set behind."""
    return set(os.listdir("/dev/shm"))


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
