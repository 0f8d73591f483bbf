"""What makes a process one rank of a single-node job, and how a rank's exit reads in a shell.

Shared by ``distcomm run`` (:mod:`distcomm._processes.supervisor`), ``distcomm.testing.spawn``
and flame's ``run_local`` (:mod:`distcomm._processes.workers`).
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Mapping
from typing import TextIO

__all__ = ["exit_status", "launch_variables", "stderr_copy", "torchrun_defaults"]


def launch_variables(
    rank: int,
    nprocs: int,
    master_port: int,
    backend: str | None = None,
    run_id: str | None = None,
    restart_count: int = 0,
    max_restarts: int = 0,
) -> dict[str, str]:
    """The variables that make a process rank ``rank`` of a single-node job of ``nprocs``.

    They are what torchrun sets on one node (read by distcomm's ``env`` detection), the
    restart count and the most restarts included (``TORCHELASTIC_RESTART_COUNT``,
    ``TORCHELASTIC_MAX_RESTARTS``), and its role (``ROLE_NAME``, ``ROLE_RANK``,
    ``ROLE_WORLD_SIZE``: one role, ``default``), plus
    ``PYTHONUNBUFFERED=1``, when ``backend`` is given ``DISTCOMM_BACKEND``, and when ``run_id``
    is given ``DISTCOMM_RUN_ID`` (the job's identity at its rendezvous: a process of another
    run that reaches it fails at once, naming both), and torchrun's ``TORCHELASTIC_RUN_ID``.
    """
    variables = {
        "RANK": str(rank),
        "WORLD_SIZE": str(nprocs),
        "LOCAL_RANK": str(rank),
        "LOCAL_WORLD_SIZE": str(nprocs),
        "GROUP_RANK": "0",
        "GROUP_WORLD_SIZE": "1",
        "ROLE_NAME": "default",
        "ROLE_RANK": str(rank),
        "ROLE_WORLD_SIZE": str(nprocs),
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(master_port),
        # The job's rank 0 serves its store: not torchrun's agent, even inside a torchrun worker
        "TORCHELASTIC_USE_AGENT_STORE": "False",
        "TORCHELASTIC_RESTART_COUNT": str(restart_count),
        "TORCHELASTIC_MAX_RESTARTS": str(max_restarts),
        # Nothing of an outer `distcomm run` (distcomm run sets its own: reports, pid, stderr)
        "DISTCOMM_RUN_REPORTS": "",
        "DISTCOMM_RUN_PID": "",
        "DISTCOMM_RUN_STDERR": "",
        "PYTHONUNBUFFERED": "1",
    }
    if backend is not None:
        variables["DISTCOMM_BACKEND"] = backend
    if run_id is not None:
        variables["DISTCOMM_RUN_ID"] = variables["TORCHELASTIC_RUN_ID"] = run_id
    return variables


def torchrun_defaults(
    nprocs: int, environ: Mapping[str, str], notice: TextIO | None = None
) -> dict[str, str]:
    """What torchrun also sets for its ranks where ``environ`` (the user's) does not:
    ``OMP_NUM_THREADS=1`` when more than one rank runs on the node (each would otherwise start
    a thread per core: a CPU job of 2 ranks ran 2 to 5 times slower here), said in one line on
    ``notice`` as torchrun says it, and ``TORCH_NCCL_ASYNC_ERROR_HANDLING=1`` (a failed NCCL
    operation ends its process instead of hanging)."""
    defaults = {"TORCH_NCCL_ASYNC_ERROR_HANDLING": "1"}
    if nprocs > 1:
        defaults["OMP_NUM_THREADS"] = "1"
    found = {name: value for name, value in defaults.items() if name not in environ}
    if "OMP_NUM_THREADS" in found and notice is not None:
        notice.write(
            f"distcomm run: OMP_NUM_THREADS=1 in each of the {nprocs} ranks, as torchrun sets "
            "it; export OMP_NUM_THREADS=N to choose\n"
        )
    return found


def stderr_copy(stream: TextIO) -> int | None:
    """A new descriptor of ``stream``'s file (``distcomm run``'s stderr): each rank keeps it as
    ``DISTCOMM_RUN_STDERR``, for its last line should the launcher die; None when ``stream``
    has no file (a StringIO)."""
    try:
        return os.dup(stream.fileno())
    except (AttributeError, OSError, ValueError):  # io.UnsupportedOperation is an OSError
        return None


def new_run_id() -> str:
    """A fresh identity for one run of ``distcomm run`` or ``spawn``."""
    return uuid.uuid4().hex[:12]


def exit_status(returncode: int) -> int:
    """A shell's exit status for a child's return code: 128 + N for a child killed by signal N."""
    return 128 - returncode if returncode < 0 else returncode
