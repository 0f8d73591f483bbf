"""The ``single_node`` launch method: no launcher, a world of one process at 127.0.0.1.

MASTER_ADDR and MASTER_PORT are honoured when set (for ``init(rank=..., world_size=...)``).

It is the fallback after every other method, so it always matches. Inside a Slurm batch script
that asked for several tasks but started Python without ``srun``, it warns: that process is the
only one, and the job's other tasks never run.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping

from distcomm.environment.info import LaunchInfo, read_int
from distcomm.environment.readers import read_text
from distcomm.environment.slurm import task_step
from distcomm.errors import DistcommWarning

__all__ = ["detect"]

_FIELDS = (
    "rank",
    "world_size",
    "local_rank",
    "local_world_size",
    "node_rank",
    "num_nodes",
    "master_addr",
    "master_port",
)


def detect(environ: Mapping[str, str]) -> LaunchInfo:
    """Return rank 0 of a world of 1 on this machine.

    Warns:
        DistcommWarning: in a Slurm job outside an srun task step with SLURM_NTASKS > 1.

    Raises:
        EnvironmentDetectionError: SLURM_JOB_ID or SLURM_NTASKS is set but malformed.
    """
    job_id = read_text(environ, "SLURM_JOB_ID")
    if job_id is not None:
        _warn_without_srun(environ, job_id)
    sources = dict.fromkeys(_FIELDS, "default")
    master_addr = read_text(environ, "MASTER_ADDR")
    master_port = read_int(environ, "MASTER_PORT")
    if master_addr is not None:
        sources["master_addr"] = "MASTER_ADDR"
    if master_port is not None:
        sources["master_port"] = "MASTER_PORT"
    sources["job_id"] = "SLURM_JOB_ID" if job_id is not None else "default"
    sources["method"] = "no launcher detected: one process on this machine"
    return LaunchInfo(
        method="single_node",
        rank=0,
        world_size=1,
        local_rank=0,
        local_world_size=1,
        node_rank=0,
        num_nodes=1,
        master_addr=master_addr or "127.0.0.1",
        master_port=master_port,
        job_id=job_id,
        sources=sources,
    )


def _warn_without_srun(environ: Mapping[str, str], job_id: str) -> None:
    """Warn when a Slurm job asked for several tasks but this process runs outside srun."""
    tasks = read_int(environ, "SLURM_NTASKS", minimum=1)
    if tasks is None or tasks < 2 or task_step(environ) is not None:
        return
    warnings.warn(
        f"Slurm job {job_id} asked for SLURM_NTASKS={tasks} tasks, but this process was not "
        f"started by srun, so it runs alone as a world of 1 and the other {tasks - 1} tasks "
        "never start. HINT: srun python ... (in the batch script, start the program with srun "
        "so that every task runs it).",
        DistcommWarning,
        stacklevel=4,  # the caller of detect_environment()
    )
