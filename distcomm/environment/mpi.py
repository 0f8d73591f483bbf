"""The ``mpi`` launch method: a process started by mpirun / mpiexec (or an MPI-aware srun).

Recognised flavours, tried in this order: OpenMPI (``OMPI_COMM_WORLD_*``), MVAPICH
(``MV2_COMM_WORLD_*``), MPICH/Hydra (``PMI_RANK``, ``PMI_SIZE``, ``MPI_LOCALRANKID``,
``MPI_LOCALNRANKS``) and PMIx (``PMIX_RANK`` with the size from ``OMPI_COMM_WORLD_SIZE`` or
``PMI_SIZE``). Nothing is initialised: MPI itself is only touched by the mpi backend at init.

MPI launchers name no rendezvous address; when the job runs under Slurm the first host of its
node list (and the Slurm default port) stand in, else backends that need one get it from rank 0
over MPI at init.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from distcomm.environment.info import LaunchInfo
from distcomm.environment.readers import (
    master_addr,
    master_port,
    node_layout,
    read_nodelist,
    read_text,
    require_int,
)
from distcomm.errors import EnvironmentDetectionError

__all__ = ["detect", "mpi_world_size"]


@dataclasses.dataclass(frozen=True)
class _Flavour:
    """The variables one MPI launcher sets for each rank."""

    name: str
    rank: str
    size: str
    local_rank: str
    local_size: str
    #: Whether the rank variable without the size variable is an error (else: not this flavour).
    size_required: bool = True


_FLAVOURS = (
    _Flavour(
        "OpenMPI",
        "OMPI_COMM_WORLD_RANK",
        "OMPI_COMM_WORLD_SIZE",
        "OMPI_COMM_WORLD_LOCAL_RANK",
        "OMPI_COMM_WORLD_LOCAL_SIZE",
    ),
    _Flavour(
        "MVAPICH",
        "MV2_COMM_WORLD_RANK",
        "MV2_COMM_WORLD_SIZE",
        "MV2_COMM_WORLD_LOCAL_RANK",
        "MV2_COMM_WORLD_LOCAL_SIZE",
    ),
    _Flavour("MPICH/Hydra", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"),
    # srun --mpi=pmix sets PMIX_RANK alone: without a size it is no MPI launch we can read.
    _Flavour(
        "PMIx",
        "PMIX_RANK",
        "OMPI_COMM_WORLD_SIZE",
        "OMPI_COMM_WORLD_LOCAL_RANK",
        "OMPI_COMM_WORLD_LOCAL_SIZE",
        size_required=False,
    ),
    _Flavour(
        "PMIx",
        "PMIX_RANK",
        "PMI_SIZE",
        "MPI_LOCALRANKID",
        "MPI_LOCALNRANKS",
        size_required=False,
    ),
)
_JOB_ID_VARIABLES = ("SLURM_JOB_ID", "OMPI_MCA_ess_base_jobid")


def _flavour(environ: Mapping[str, str]) -> _Flavour | None:
    """Return the first flavour whose rank and size variables are both set.

    Raises:
        EnvironmentDetectionError: a flavour's rank variable is set without its size variable.
    """
    for flavour in _FLAVOURS:
        if flavour.rank not in environ:
            continue
        if flavour.size in environ:
            return flavour
        if flavour.size_required:
            raise EnvironmentDetectionError(
                f"{flavour.rank}={environ[flavour.rank]!r} is set but {flavour.size} is not; "
                f"{flavour.name} sets both. HINT: launch with {flavour.name}'s mpirun, or unset "
                f"{flavour.rank}.",
                variable=flavour.size,
                value=None,
            )
    return None


def mpi_world_size(environ: Mapping[str, str]) -> tuple[str, int] | None:
    """Return ``(variable, size)``: the world size an MPI launcher set, or None if none did.

    The size is the same on every rank of the job, so other detectors may use it to decide
    precedence (``slurm`` yields to ``mpi`` when the two disagree).

    Raises:
        EnvironmentDetectionError: the size variable is malformed, or a rank variable is set
            without its size variable.
    """
    flavour = _flavour(environ)
    if flavour is None:
        return None
    return flavour.size, require_int(
        environ, flavour.size, context=f"{flavour.name} sets it", minimum=1
    )


def detect(environ: Mapping[str, str]) -> LaunchInfo | None:
    """Return the launch an MPI launcher describes, or None when no flavour's variables are set.

    Raises:
        EnvironmentDetectionError: a variable is malformed, or a rank variable is set without
            its size variable.
    """
    flavour = _flavour(environ)
    if flavour is None:
        return None
    context = f"{flavour.name} sets it"
    rank = require_int(environ, flavour.rank, context=context)
    world_size = require_int(environ, flavour.size, context=context, minimum=1)
    layout, sources = node_layout(
        environ,
        rank,
        world_size,
        local_rank=flavour.local_rank,
        local_world_size=flavour.local_size,
    )
    address, sources["master_addr"] = master_addr(environ, read_nodelist(environ))
    port, sources["master_port"] = master_port(environ)
    job_variable = next((name for name in _JOB_ID_VARIABLES if name in environ), None)
    sources.update(
        method=f"{flavour.rank} and {flavour.size} set ({flavour.name})",
        rank=flavour.rank,
        world_size=flavour.size,
        job_id=job_variable or "default",
    )
    return LaunchInfo(
        method="mpi",
        rank=rank,
        world_size=world_size,
        **layout,
        master_addr=address,
        master_port=port,
        job_id=read_text(environ, job_variable) if job_variable else None,
        mpi_wireup=None,  # MPI's own launch
        agent_store=False,
        sources=sources,
    )
