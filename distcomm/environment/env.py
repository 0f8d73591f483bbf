"""The ``env`` launch method: RANK and WORLD_SIZE set by torchrun or by hand.

Read: RANK, WORLD_SIZE (both required), LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK (the node's
rank), GROUP_WORLD_SIZE (the number of nodes), MASTER_ADDR, MASTER_PORT, the job id from
TORCHELASTIC_RUN_ID or SLURM_JOB_ID, and TORCHELASTIC_USE_AGENT_STORE (torchrun's agent serves
the store at MASTER_ADDR:MASTER_PORT). What is missing is derived, and ``sources`` says how.
"""

from __future__ import annotations

from collections.abc import Mapping

from distcomm.environment.info import LaunchInfo, read_int
from distcomm.environment.readers import node_layout, read_text, require_int
from distcomm.errors import EnvironmentDetectionError

__all__ = ["detect"]

_JOB_ID_VARIABLES = ("DISTCOMM_RUN_ID", "TORCHELASTIC_RUN_ID", "SLURM_JOB_ID")
#: What torchrun puts in TORCHELASTIC_RUN_ID when no --rdzv-id is given: no id at all.
_NO_RUN_ID = "none"
#: TORCHELASTIC_USE_AGENT_STORE values that mean torchrun's agent serves the store (it sets True).
_TRUE = ("true", "1")


def detect(environ: Mapping[str, str]) -> LaunchInfo | None:
    """Return the launch described by RANK and WORLD_SIZE, or None when neither is set.

    Raises:
        EnvironmentDetectionError: only one of RANK and WORLD_SIZE is set, or a variable is
            malformed (not an integer, rank not below the world size, ...).
    """
    present = [name for name in ("RANK", "WORLD_SIZE") if name in environ]
    if not present:
        return None
    _check_both_set(environ, present)
    context = "the env method needs it"
    rank = require_int(environ, "RANK", context=context)
    world_size = require_int(environ, "WORLD_SIZE", context=context, minimum=1)
    layout, sources = node_layout(
        environ,
        rank,
        world_size,
        local_rank="LOCAL_RANK",
        local_world_size="LOCAL_WORLD_SIZE",
        node_rank="GROUP_RANK",
        num_nodes="GROUP_WORLD_SIZE",
    )
    address, sources["master_addr"] = _master_addr(environ, layout["num_nodes"])
    port = read_int(environ, "MASTER_PORT")
    job_variable, job_id = _job_id(environ)
    agent_store = environ.get("TORCHELASTIC_USE_AGENT_STORE", "").strip().lower() in _TRUE
    sources.update(
        method="RANK and WORLD_SIZE set (torchrun, or set by hand)",
        rank="RANK",
        world_size="WORLD_SIZE",
        master_port="MASTER_PORT" if port is not None else "default",
        job_id=job_variable,
    )
    if agent_store:
        sources["agent_store"] = "TORCHELASTIC_USE_AGENT_STORE"
    restarts = read_int(environ, "TORCHELASTIC_RESTART_COUNT")
    if restarts is not None:
        sources["restart_count"] = "TORCHELASTIC_RESTART_COUNT"
    return LaunchInfo(
        method="env",
        rank=rank,
        world_size=world_size,
        **layout,
        master_addr=address,
        master_port=port,
        job_id=job_id,
        mpi_wireup=None,  # torchrun and `distcomm run` set no MPI variables
        agent_store=agent_store,
        restart_count=restarts or 0,
        sources=sources,
    )


def _check_both_set(environ: Mapping[str, str], present: list[str]) -> None:
    """Raise EnvironmentDetectionError when only one of RANK and WORLD_SIZE is ``present``."""
    if len(present) == 1:
        (given,) = present
        missing = "WORLD_SIZE" if given == "RANK" else "RANK"
        raise EnvironmentDetectionError(
            f"{given}={environ[given]!r} is set but {missing} is not; the env method needs "
            f"both. HINT: set {missing} as well (torchrun sets both), or "
            f"unset {given}.",
            variable=missing,
            value=None,
        )


def _master_addr(environ: Mapping[str, str], num_nodes: int) -> tuple[str | None, str]:
    """Return ``(address, source)``: MASTER_ADDR, else the loopback on one node, else None.

    Raises:
        EnvironmentDetectionError: MASTER_ADDR is set but empty.
    """
    address = read_text(environ, "MASTER_ADDR")
    if address is not None:
        return address, "MASTER_ADDR"
    if num_nodes == 1:
        return "127.0.0.1", "derived: one node, loopback"
    return None, "default"


def _job_id(environ: Mapping[str, str]) -> tuple[str, str | None]:
    """Return ``(source, job id)``: DISTCOMM_RUN_ID (``distcomm run``'s, ``spawn``'s),
    TORCHELASTIC_RUN_ID (unless torchrun's "none"), SLURM_JOB_ID."""
    for name in _JOB_ID_VARIABLES:
        value = read_text(environ, name)
        if value is not None and value != _NO_RUN_ID:
            return name, value
    return "default", None
