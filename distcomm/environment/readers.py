"""Readers the launch detectors share: text variables, node layouts, and where a job meets.

Every reader takes the environ mapping, reads it, and returns the value with its source (the
variable's name or ``"derived: ..."``) so that :class:`~distcomm.environment.info.LaunchInfo`
can say where each field came from. Nothing here writes anything.
"""

from __future__ import annotations

from collections.abc import Mapping

from distcomm.environment.hostlist import expand_hostlist
from distcomm.environment.info import read_int
from distcomm.errors import EnvironmentDetectionError

__all__ = [
    "NODELIST_VARIABLES",
    "SLURM_PORT_BASE",
    "SLURM_PORT_SPAN",
    "master_addr",
    "master_port",
    "node_layout",
    "read_nodelist",
    "read_text",
    "require_int",
]

#: Where a Slurm task finds its hosts, most specific first.
NODELIST_VARIABLES = ("SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST")
#: The default rendezvous port in a Slurm job is SLURM_PORT_BASE + SLURM_JOB_ID % SLURM_PORT_SPAN.
SLURM_PORT_BASE = 15000
SLURM_PORT_SPAN = 10000


def read_text(environ: Mapping[str, str], name: str) -> str | None:
    """Return ``environ[name]`` without surrounding whitespace, or None when unset.

    Raises:
        EnvironmentDetectionError: the variable is set but empty.
    """
    raw = environ.get(name)
    if raw is None:
        return None
    if not raw.strip():
        raise EnvironmentDetectionError(
            f"{name}={raw!r} is empty. HINT: unset it or give it a value.",
            variable=name,
            value=raw,
        )
    return raw.strip()


def require_int(environ: Mapping[str, str], name: str, *, context: str, minimum: int = 0) -> int:
    """Return ``environ[name]`` as an int; unlike ``read_int``, unset is an error too.

    Args:
        environ: the environment to read.
        name: the variable.
        context: why the variable must be set, for the message (``"SLURM_STEP_ID='0' marks an
            srun task"``).
        minimum: the smallest valid value.

    Raises:
        EnvironmentDetectionError: the variable is unset, empty, not an integer or too small.
    """
    value = read_int(environ, name, minimum=minimum)
    if value is None:
        raise EnvironmentDetectionError(
            f"{name} is unset, but {context}. HINT: launch through the launcher itself, or "
            f"set {name} (or pick another method with distcomm.init(method=...)).",
            variable=name,
            value=None,
        )
    return value


def read_nodelist(environ: Mapping[str, str]) -> tuple[str, list[str]] | None:
    """Return ``(variable, hosts)`` from the first of :data:`NODELIST_VARIABLES` that is set.

    Raises:
        EnvironmentDetectionError: that variable holds a malformed hostlist.
    """
    for name in NODELIST_VARIABLES:
        raw = environ.get(name)
        if raw is not None:
            return name, expand_hostlist(raw, name)
    return None


def node_layout(
    environ: Mapping[str, str],
    rank: int,
    world_size: int,
    *,
    local_rank: str,
    local_world_size: str,
    node_rank: str | None = None,
    num_nodes: str | None = None,
) -> tuple[dict[str, int], dict[str, str]]:
    """Read (or derive) the local rank, local world size, node rank and number of nodes.

    Missing local variables mean one node (or, with the local size known, a block mapping of
    ranks to nodes); a missing or unnamed node variable is derived from a block mapping.

    Args:
        environ: the environment to read.
        rank: the global rank, already read.
        world_size: the global world size, already read.
        local_rank: the variable holding the local rank.
        local_world_size: the variable holding the number of ranks on this node.
        node_rank: the variable holding the node's rank, or None when the launcher has none.
        num_nodes: the variable holding the number of nodes, or None when the launcher has none.

    Returns:
        ``(values, sources)``: both keyed by the LaunchInfo field names.

    Raises:
        EnvironmentDetectionError: a variable is set but malformed.
    """
    values, sources = _local_layout(environ, rank, world_size, local_rank, local_world_size)
    local_size = values["local_world_size"]
    values["node_rank"], sources["node_rank"] = _read_or_derive(
        environ, node_rank, rank // local_size, "rank // local_world_size", minimum=0
    )
    values["num_nodes"], sources["num_nodes"] = _read_or_derive(
        environ,
        num_nodes,
        -(-world_size // local_size),
        "ceil(world_size / local_world_size)",
        minimum=1,
    )
    return values, sources


def _local_layout(
    environ: Mapping[str, str],
    rank: int,
    world_size: int,
    local_rank: str,
    local_world_size: str,
) -> tuple[dict[str, int], dict[str, str]]:
    """Read (or derive) the local rank and local world size, as :func:`node_layout` does.

    Returns:
        ``(values, sources)``: both keyed by ``local_rank`` and ``local_world_size``.
    """
    local_rank_value = read_int(environ, local_rank)
    local_size_value = read_int(environ, local_world_size, minimum=1)
    if local_size_value is not None:
        local_size, local_size_source = local_size_value, local_world_size
    else:
        unset = local_world_size
        if local_rank_value is None:
            unset = f"{local_rank} and {local_world_size}"
        local_size = world_size
        local_size_source = f"derived: world_size ({unset} unset: one node assumed)"
    if local_rank_value is not None:
        local, local_source = local_rank_value, local_rank
    elif local_size_value is not None:
        local = rank % local_size_value
        local_source = (
            f"derived: rank % local_world_size ({local_rank} unset: block mapping assumed)"
        )
    else:
        local, local_source = rank, f"derived: rank ({local_rank} unset: one node assumed)"
    values = {"local_rank": local, "local_world_size": local_size}
    sources = {"local_rank": local_source, "local_world_size": local_size_source}
    return values, sources


def _read_or_derive(
    environ: Mapping[str, str], variable: str | None, derived: int, formula: str, *, minimum: int
) -> tuple[int, str]:
    """Return ``(value, source)`` from ``variable`` when it is set, else ``derived``."""
    if variable is None:
        return derived, f"derived: {formula} (block mapping assumed)"
    value = read_int(environ, variable, minimum=minimum)
    if value is None:
        return derived, f"derived: {formula} ({variable} unset: block mapping assumed)"
    return value, variable


def master_addr(
    environ: Mapping[str, str], nodelist: tuple[str, list[str]] | None
) -> tuple[str | None, str]:
    """Return ``(address, source)``: MASTER_ADDR, else the first host of ``nodelist``, else None.

    Raises:
        EnvironmentDetectionError: MASTER_ADDR is set but empty.
    """
    address = read_text(environ, "MASTER_ADDR")
    if address is not None:
        return address, "MASTER_ADDR"
    if nodelist is not None:
        variable, hosts = nodelist
        return hosts[0], f"derived: first host of {variable}"
    return None, "default"


def master_port(environ: Mapping[str, str]) -> tuple[int | None, str]:
    """Return ``(port, source)``: MASTER_PORT, else the Slurm job's default port, else None.

    The Slurm default, ``15000 + SLURM_JOB_ID % 10000``, is the same on every task of a job and
    differs between jobs sharing a node (unless their ids collide modulo 10000).

    Raises:
        EnvironmentDetectionError: MASTER_PORT or SLURM_JOB_ID is set but not an integer.
    """
    port = read_int(environ, "MASTER_PORT")
    if port is not None:
        return port, "MASTER_PORT"
    job_id = read_int(environ, "SLURM_JOB_ID")
    if job_id is not None:
        return (
            SLURM_PORT_BASE + job_id % SLURM_PORT_SPAN,
            f"derived: {SLURM_PORT_BASE} + SLURM_JOB_ID % {SLURM_PORT_SPAN}",
        )
    return None, "default"
