"""An example distcomm plugin: a launch environment (IBM ``jsrun``) and a backend (``loopback``).

The module is the plugin: distcomm finds it through the ``distcomm`` entry point in
pyproject.toml and calls its two hooks once. It imports nothing heavy.
"""

from __future__ import annotations

from collections.abc import Mapping

import distcomm
from distcomm.backend import KIT_API, BackendSpec, EnvironmentSpec, Registry, hookimpl, read_int
from distcomm_example_plugin.loopback import create, is_available


def detect_jsrun(environ: Mapping[str, str]) -> distcomm.LaunchInfo | None:
    """Detect a job started by IBM's ``jsrun``; None when jsrun did not start this process."""
    rank = read_int(environ, "JSM_NAMESPACE_RANK")
    size = read_int(environ, "JSM_NAMESPACE_SIZE", minimum=1)
    if rank is None or size is None:
        return None
    local_rank = read_int(environ, "JSM_NAMESPACE_LOCAL_RANK")
    local_size = read_int(environ, "JSM_NAMESPACE_LOCAL_SIZE", minimum=1)
    local_rank = rank if local_rank is None else local_rank
    local_size = size if local_size is None else local_size
    # "launch-host n host1 n host2 n ...": the first compute host, skipping LSF's batch/launch nodes
    hosts = [h for h in environ.get("LSB_MCPU_HOSTS", "").split()[::2] if not h.startswith("batch")]
    return distcomm.LaunchInfo(
        method="jsm",
        rank=rank,
        world_size=size,
        local_rank=local_rank,
        local_world_size=local_size,
        node_rank=rank // local_size,
        num_nodes=-(-size // local_size),
        master_addr=environ.get("MASTER_ADDR") or (hosts[0] if hosts else None),
        master_port=read_int(environ, "MASTER_PORT"),
        job_id=environ.get("LSB_JOBID"),
        sources={
            "method": "JSM_NAMESPACE_RANK and JSM_NAMESPACE_SIZE set (IBM jsrun)",
            "rank": "JSM_NAMESPACE_RANK",
            "world_size": "JSM_NAMESPACE_SIZE",
            "local_rank": "JSM_NAMESPACE_LOCAL_RANK",
            "local_world_size": "JSM_NAMESPACE_LOCAL_SIZE",
            "node_rank": "derived: rank // local_world_size",
            "num_nodes": "derived: ceil(world_size / local_world_size)",
            "master_addr": "MASTER_ADDR"
            if environ.get("MASTER_ADDR")
            else "derived: LSB_MCPU_HOSTS",
            "master_port": "MASTER_PORT",
            "job_id": "LSB_JOBID",
        },
    )


@hookimpl
def distcomm_register_environments(registry: Registry) -> None:
    """Register ``jsm`` below the built-in MPI detection (jsrun with Spectrum MPI is MPI)."""
    registry.add_environment(EnvironmentSpec("jsm", detect_jsrun, priority=150))


@hookimpl
def distcomm_register_backends(registry: Registry) -> None:
    """Register ``loopback`` with priority 0: used only when asked for."""
    registry.add_backend(
        BackendSpec(
            name="loopback",
            factory=create,
            is_available=is_available,
            priority=0,
            description="example: a world of 1 that keeps messages to itself",
            kit_api=KIT_API,
        )
    )
