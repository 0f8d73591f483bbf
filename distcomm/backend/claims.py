"""A rendezvous that accepts only its own job's ranks: the errors a backend raises, and when.

Two jobs that meet at one address and port (a fixed ``MASTER_PORT`` in a shared script) must
never form one world. A store-based backend makes each rank claim its place at the rendezvous:

- **the job**: where the launch names a job (:attr:`LaunchInfo.job_id`: Slurm's job and step,
  torchrun's run id, ``distcomm run``'s own), the process that serves the rendezvous records
  it, and a rank of another job fails at once with :func:`other_job` naming both ids;
- **the rank**: each rank counts itself under its rank (an atomic add); a second claim of one
  rank fails with :func:`duplicate_rank`, and marks the rendezvous so that the processes of it
  that are still meeting fail too (every process involved, never a joined world).

Without job ids, the first process to claim a rank keeps it: a rank of another job that arrives
before the job's own forms a world with it, which nothing in the rendezvous can tell apart. Job
ids (every launcher but a hand-set environment gives one) close that gap; docs/security.md.
"""

from __future__ import annotations

from distcomm.errors import BackendUnavailableError

__all__ = ["duplicate_rank", "other_job"]

_HINT = (
    "another job is using this rendezvous (a fixed MASTER_PORT in a shared script?). HINT: give "
    "each job its own MASTER_PORT (distcomm run and torchrun pick a free one), or let the "
    "launcher choose it."
)


def duplicate_rank(backend: str, where: str, rank: int) -> BackendUnavailableError:
    """The error of a process whose rank another process has claimed at ``where``
    (``"host:port"``)."""
    return BackendUnavailableError(
        f"{backend}: two processes claim rank {rank} at {where}: {_HINT}",
        backend=backend,
        reason=f"rank {rank} claimed twice at {where}",
    )


def other_job(
    backend: str, where: str, rank: int, mine: str, theirs: str
) -> BackendUnavailableError:
    """The error of rank ``rank`` of job ``mine`` that reached job ``theirs``'s rendezvous."""
    return BackendUnavailableError(
        f"{backend}: rank {rank} of job {mine!r} reached the rendezvous of job {theirs!r} at "
        f"{where}: {_HINT}",
        backend=backend,
        reason=f"another job's rendezvous at {where}",
    )
