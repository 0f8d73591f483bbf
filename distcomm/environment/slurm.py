"""The ``slurm`` launch method: a task of an ``srun`` job step.

Only a real task step counts: SLURM_STEP_ID is set and names no pseudo-step (the batch script,
the extern step, salloc's interactive step), and SLURM_PROCID is set. The batch script alone has
SLURM_PROCID=0 and SLURM_NTASKS=N but no task step: that process is one of one (``single_node``
says so with a warning).

Precedence with MPI (docs/launch.md#precedence): when an MPI launcher's size variable is present
too and differs from the step's task count, the tasks are MPI's proxies, not its ranks (mpirun
inside an sbatch script starts its proxies through srun), and ``mpi`` takes the launch. Both
counts are the same on every rank, so every rank decides the same way.
"""

from __future__ import annotations

from collections.abc import Mapping

from distcomm.environment.hostlist import expand_tasks_per_node
from distcomm.environment.info import LaunchInfo, read_int
from distcomm.environment.mpi import mpi_world_size
from distcomm.environment.readers import (
    master_addr,
    master_port,
    read_nodelist,
    read_text,
    require_int,
)
from distcomm.errors import EnvironmentDetectionError

__all__ = ["PSEUDO_STEPS", "detect", "task_step"]

#: SLURM_STEP_ID values that are no srun task step: the batch script, the extern step, salloc's
#: interactive step (by name and by Slurm's numeric ids for them).
PSEUDO_STEPS = frozenset(
    {"batch", "extern", "interactive", "4294967290", "4294967294", "4294967295"}
)
_WORLD_VARIABLES = ("SLURM_STEP_NUM_TASKS", "SLURM_NTASKS", "SLURM_NPROCS")
_NODES_VARIABLES = ("SLURM_STEP_NUM_NODES", "SLURM_NNODES")
_TASKS_PER_NODE_VARIABLES = ("SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE")


def task_step(environ: Mapping[str, str]) -> str | None:
    """Return SLURM_STEP_ID when it names an srun task step, else None.

    Raises:
        EnvironmentDetectionError: SLURM_STEP_ID is set but empty.
    """
    step = read_text(environ, "SLURM_STEP_ID")
    return None if step is None or step in PSEUDO_STEPS else step


def detect(environ: Mapping[str, str]) -> LaunchInfo | None:
    """Return the launch of this srun task, or None outside a task step or when MPI takes it.

    Raises:
        EnvironmentDetectionError: a Slurm variable is missing from the task step or malformed
            (a bad hostlist, task counts per node that do not match the number of nodes, ...).
    """
    step = task_step(environ)
    if step is None or "SLURM_PROCID" not in environ:
        return None
    context = f"SLURM_STEP_ID={step!r} marks an srun task step"
    world_size, world_variable = _first_int(environ, _WORLD_VARIABLES, context, minimum=1)
    mpi = mpi_world_size(environ)
    if mpi is not None and mpi[1] != world_size:
        return None
    rank = require_int(environ, "SLURM_PROCID", context=context)
    local_rank = require_int(environ, "SLURM_LOCALID", context=context)
    node_rank = require_int(environ, "SLURM_NODEID", context=context)
    nodelist = read_nodelist(environ)
    sources = {
        "rank": "SLURM_PROCID",
        "world_size": world_variable,
        "local_rank": "SLURM_LOCALID",
        "node_rank": "SLURM_NODEID",
    }
    num_nodes, sources["num_nodes"] = _num_nodes(environ, nodelist, context)
    _check_node_rank(environ, node_rank, num_nodes, sources["num_nodes"])
    local_world_size, sources["local_world_size"] = _local_world_size(
        environ, node_rank, num_nodes, world_size
    )
    address, sources["master_addr"] = master_addr(environ, nodelist)
    port, sources["master_port"] = master_port(environ)
    job_id, sources["job_id"] = _job_id(environ, step)
    wireup = _record_method(step, mpi, sources)
    restarts = read_int(environ, "SLURM_RESTART_COUNT")  # set once a job was requeued
    if restarts is not None:
        sources["restart_count"] = "SLURM_RESTART_COUNT"
    return LaunchInfo(
        method="slurm",
        rank=rank,
        world_size=world_size,
        local_rank=local_rank,
        local_world_size=local_world_size,
        node_rank=node_rank,
        num_nodes=num_nodes,
        master_addr=address,
        master_port=port,
        job_id=job_id,
        mpi_wireup=wireup,
        restart_count=restarts or 0,
        sources=sources,
    )


def _check_node_rank(
    environ: Mapping[str, str], node_rank: int, num_nodes: int, num_nodes_source: str
) -> None:
    """Raise EnvironmentDetectionError unless SLURM_NODEID is below the number of nodes."""
    if node_rank >= num_nodes:
        raise EnvironmentDetectionError(
            f"SLURM_NODEID={environ['SLURM_NODEID']!r} must be below the number of nodes, "
            f"{num_nodes} (from {num_nodes_source}). HINT: check the step's Slurm variables.",
            variable="SLURM_NODEID",
            value=environ["SLURM_NODEID"],
        )


def _job_id(environ: Mapping[str, str], step: str) -> tuple[str | None, str]:
    """Return ``(job_id, source)``: ``SLURM_JOB_ID.SLURM_STEP_ID``, or None when SLURM_JOB_ID
    is unset.

    Raises:
        EnvironmentDetectionError: SLURM_JOB_ID is set but empty.
    """
    job_id = read_text(environ, "SLURM_JOB_ID")
    if job_id is None:
        return None, "default"
    # two steps of one job are two worlds: the step is part of it
    return f"{job_id}.{step}", "derived: SLURM_JOB_ID.SLURM_STEP_ID"


def _record_method(step: str, mpi: tuple[str, int] | None, sources: dict[str, str]) -> str | None:
    """Put in ``sources`` the MPI wireup (when an MPI launcher's size equals the step's task
    count) and why this is a Slurm launch; return the wireup, or None."""
    reason = f"srun task step (SLURM_STEP_ID={step!r}, SLURM_PROCID set)"
    wireup = None
    if mpi is not None:
        reason += f"; {mpi[0]}={mpi[1]} equals the step's task count"
        wireup = sources["mpi_wireup"] = f"{mpi[0]}={mpi[1]}"
    sources["method"] = reason
    return wireup


def _first_int(
    environ: Mapping[str, str], names: tuple[str, ...], context: str, *, minimum: int
) -> tuple[int, str]:
    """Return ``(value, variable)`` for the first of ``names`` that is set.

    Raises:
        EnvironmentDetectionError: none is set, or the first one set is malformed.
    """
    for name in names:
        value = read_int(environ, name, minimum=minimum)
        if value is not None:
            return value, name
    raise EnvironmentDetectionError(
        f"none of {', '.join(names)} is set, but {context}. HINT: launch through srun itself, "
        "or pick another method with distcomm.init(method=...).",
        variable=names[0],
        value=None,
    )


def _num_nodes(
    environ: Mapping[str, str], nodelist: tuple[str, list[str]] | None, context: str
) -> tuple[int, str]:
    """Return ``(num_nodes, source)``: from the step's variables, else the hostlist's length."""
    if nodelist is not None and not any(name in environ for name in _NODES_VARIABLES):
        variable, hosts = nodelist
        return len(hosts), f"derived: number of hosts in {variable}"
    return _first_int(environ, _NODES_VARIABLES, context, minimum=1)


def _local_world_size(
    environ: Mapping[str, str], node_rank: int, num_nodes: int, world_size: int
) -> tuple[int, str]:
    """Return ``(local_world_size, source)`` from the tasks-per-node list at ``node_rank``."""
    for name in _TASKS_PER_NODE_VARIABLES:
        raw = environ.get(name)
        if raw is None:
            continue
        counts = expand_tasks_per_node(raw, name)
        if len(counts) != num_nodes:
            raise EnvironmentDetectionError(
                f"{name}={raw!r} lists {len(counts)} nodes, but the step has num_nodes="
                f"{num_nodes}. HINT: check how {name} was set (srun sets it to match), or "
                "unset it.",
                variable=name,
                value=raw,
            )
        return counts[node_rank], name
    return -(-world_size // num_nodes), "derived: ceil(world_size / num_nodes)"
