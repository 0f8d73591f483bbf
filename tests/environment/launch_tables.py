"""Launch environments shared by the detection tests of this directory: what launchers set, and
the checks of what detection makes of them (imported by name: ``from launch_tables import ...``).
"""

from __future__ import annotations

import dataclasses
import warnings

import pytest

from distcomm._runtime.detection import detect_environment
from distcomm.environment import LaunchInfo
from distcomm.errors import EnvironmentDetectionError

FIELDS = [field.name for field in dataclasses.fields(LaunchInfo) if field.name != "sources"]
#: Fields every detector names a source for (mpi_wireup, agent_store and restart_count have one
#: only when set).
SOURCED = [
    name for name in FIELDS[1:] if name not in ("mpi_wireup", "agent_store", "restart_count")
]


def launch(
    method: str,
    rank: int,
    world_size: int,
    local_rank: int,
    local_world_size: int,
    node_rank: int,
    num_nodes: int,
    master_addr: str | None,
    master_port: int | None,
    job_id: str | None,
    mpi_wireup: str | None = None,
    agent_store: bool = False,
    restart_count: int = 0,
) -> dict[str, object]:
    """Return the expected LaunchInfo fields by name."""
    return {
        "method": method,
        "rank": rank,
        "world_size": world_size,
        "local_rank": local_rank,
        "local_world_size": local_world_size,
        "node_rank": node_rank,
        "num_nodes": num_nodes,
        "master_addr": master_addr,
        "master_port": master_port,
        "job_id": job_id,
        "mpi_wireup": mpi_wireup,
        "agent_store": agent_store,
        "restart_count": restart_count,
    }


def srun_task(
    procid: int,
    localid: int,
    nodeid: int,
    ntasks: int,
    nodelist: str,
    tasks_per_node: str,
    nnodes: int,
    job_id: str = "1234",
    **extra: str,
) -> dict[str, str]:
    """Return what srun sets for one task of step 0 (Slurm >= 20), plus ``extra``."""
    return {
        "SLURM_JOB_ID": job_id,
        "SLURM_JOBID": job_id,
        "SLURM_STEP_ID": "0",
        "SLURM_STEPID": "0",
        "SLURM_PROCID": str(procid),
        "SLURM_LOCALID": str(localid),
        "SLURM_NODEID": str(nodeid),
        "SLURM_NTASKS": str(ntasks),
        "SLURM_NPROCS": str(ntasks),
        "SLURM_STEP_NUM_TASKS": str(ntasks),
        "SLURM_NNODES": str(nnodes),
        "SLURM_STEP_NUM_NODES": str(nnodes),
        "SLURM_JOB_NODELIST": nodelist,
        "SLURM_NODELIST": nodelist,
        "SLURM_STEP_NODELIST": nodelist,
        "SLURM_TASKS_PER_NODE": tasks_per_node,
        "SLURM_STEP_TASKS_PER_NODE": tasks_per_node,
        **extra,
    }


TORCHRUN = {
    "RANK": "3",
    "WORLD_SIZE": "4",
    "LOCAL_RANK": "3",
    "LOCAL_WORLD_SIZE": "4",
    "GROUP_RANK": "0",
    "GROUP_WORLD_SIZE": "1",
    "ROLE_RANK": "3",
    "ROLE_WORLD_SIZE": "4",
    "MASTER_ADDR": "127.0.0.1",
    "MASTER_PORT": "29500",
    "TORCHELASTIC_RUN_ID": "none",
    "TORCHELASTIC_USE_AGENT_STORE": "True",
}
TORCHRUN_MULTINODE = {
    "RANK": "5",
    "WORLD_SIZE": "8",
    "LOCAL_RANK": "1",
    "LOCAL_WORLD_SIZE": "4",
    "GROUP_RANK": "1",
    "GROUP_WORLD_SIZE": "2",
    "MASTER_ADDR": "node01",
    "MASTER_PORT": "29400",
    "TORCHELASTIC_RUN_ID": "job42",
}
BATCH_SCRIPT = {
    "SLURM_JOB_ID": "9001",
    "SLURM_NTASKS": "4",
    "SLURM_NPROCS": "4",
    "SLURM_PROCID": "0",
    "SLURM_LOCALID": "0",
    "SLURM_NODEID": "0",
    "SLURM_NNODES": "1",
    "SLURM_NODELIST": "n1",
    "SLURM_TASKS_PER_NODE": "4",
}
MPIRUN_IN_SBATCH = {
    **srun_task(0, 0, 0, 1, "host1", "1", 1, job_id="77"),
    "SLURM_NTASKS": "2",
    "PMI_RANK": "1",
    "PMI_SIZE": "2",
    "MPI_LOCALRANKID": "1",
    "MPI_LOCALNRANKS": "2",
}


def check_detected(environ: dict[str, str], expected: dict[str, object]) -> None:
    """``environ`` is detected as ``expected``, with no warning, and every field has a source."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        info = detect_environment(environ=environ)
    assert {name: getattr(info, name) for name in FIELDS} == expected
    wireup = {"mpi_wireup"} if info.mpi_wireup is not None else set()
    agent = {"agent_store"} if info.agent_store else set()
    restarts = {"restart_count"} if "restart_count" in info.sources else set()
    assert set(info.sources) == {*SOURCED, "method", *wireup, *agent, *restarts}
    for name in SOURCED:
        source = info.sources[name]
        assert source in environ or source == "default" or source.startswith("derived: ")
    assert info.sources["method"]


def check_malformed(environ: dict[str, str], variable: str, shown: str) -> None:
    """Detecting ``environ`` raises an error naming ``variable`` and showing ``shown``."""
    with pytest.raises(EnvironmentDetectionError) as info:
        detect_environment(environ=environ)
    message = str(info.value)
    assert variable in message
    assert shown in message
    assert "HINT:" in message
    assert info.value.variable == variable
