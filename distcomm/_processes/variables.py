"""What makes a process one rank of a single-node job, and how a rank's exit reads in a shell.

Shared by ``distcomm run`` (:mod:`distcomm._processes.supervisor`), ``distcomm.testing.spawn``
and flame's ``run_local`` (:mod:`distcomm._processes.workers`).
"""

from __future__ import annotations

import uuid

__all__ = ["exit_status", "launch_variables"]


def launch_variables(
    rank: int,
    nprocs: int,
    master_port: int,
    backend: str | None = None,
    run_id: str | None = None,
    restart_count: int = 0,
) -> dict[str, str]:
    """The variables that make a process rank ``rank`` of a single-node job of ``nprocs``.

    They are what torchrun sets on one node (read by distcomm's ``env`` detection), the
    restart count included (``TORCHELASTIC_RESTART_COUNT``, as torchrun sets it), plus
    ``PYTHONUNBUFFERED=1``, when ``backend`` is given ``DISTCOMM_BACKEND``, and when ``run_id``
    is given ``DISTCOMM_RUN_ID`` (the job's identity at its rendezvous: a process of another
    run that reaches it fails at once, naming both).
    """
    variables = {
        "RANK": str(rank),
        "WORLD_SIZE": str(nprocs),
        "LOCAL_RANK": str(rank),
        "LOCAL_WORLD_SIZE": str(nprocs),
        "GROUP_RANK": "0",
        "GROUP_WORLD_SIZE": "1",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(master_port),
        # The job's rank 0 serves its store: not torchrun's agent, even inside a torchrun worker
        "TORCHELASTIC_USE_AGENT_STORE": "False",
        "TORCHELASTIC_RESTART_COUNT": str(restart_count),
        # Nothing of an outer `distcomm run` (distcomm run sets its own: reports, pid, stderr)
        "DISTCOMM_RUN_REPORTS": "",
        "DISTCOMM_RUN_PID": "",
        "DISTCOMM_RUN_STDERR": "",
        "PYTHONUNBUFFERED": "1",
    }
    if backend is not None:
        variables["DISTCOMM_BACKEND"] = backend
    if run_id is not None:
        variables["DISTCOMM_RUN_ID"] = run_id
    return variables


def new_run_id() -> str:
    """A fresh identity for one run of ``distcomm run`` or ``spawn``."""
    return uuid.uuid4().hex[:12]


def exit_status(returncode: int) -> int:
    """A shell's exit status for a child's return code: 128 + N for a child killed by signal N."""
    return 128 - returncode if returncode < 0 else returncode
