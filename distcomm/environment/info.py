"""`LaunchInfo`, what launch detection returns, and the checked readers detectors build it with."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from distcomm.errors import EnvironmentDetectionError

__all__ = ["LaunchInfo", "read_int"]


@dataclasses.dataclass(frozen=True)
class LaunchInfo:
    """How this process was launched: its place in the job, and where the job meets.

    ``sources`` maps each field name to where its value came from: the environment variable,
    ``"argument"``, ``"default"`` or ``"derived: ..."``.

    ``mpi_wireup`` says how MPI can start when another launcher owns the launch: the MPI
    variables a process manager set beside it (``srun --mpi=pmi2`` sets PMI_RANK and PMI_SIZE
    in each Slurm task), e.g. ``"PMI_SIZE=4"``. None when there are none (or the launch is
    MPI's own: ``method == "mpi"``).

    ``agent_store`` says that the launcher itself serves the rendezvous store at
    ``master_addr:master_port`` (torchrun's agent store, TORCHELASTIC_USE_AGENT_STORE): every
    rank connects to it and none tries to serve one.

    ``restart_count`` is how many times the launcher has restarted the job before this attempt:
    torchrun's and ``distcomm run --max-restarts``'s TORCHELASTIC_RESTART_COUNT, Slurm's
    SLURM_RESTART_COUNT (a requeued job); 0 elsewhere.
    """

    method: str
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    node_rank: int
    num_nodes: int
    master_addr: str | None = None
    master_port: int | None = None
    job_id: str | None = None
    mpi_wireup: str | None = None
    agent_store: bool = False
    restart_count: int = 0
    sources: dict[str, str] = dataclasses.field(default_factory=dict, hash=False, compare=False)

    def __post_init__(self) -> None:
        checks = (
            ("rank", self.rank, "world_size", self.world_size),
            ("local_rank", self.local_rank, "local_world_size", self.local_world_size),
            ("node_rank", self.node_rank, "num_nodes", self.num_nodes),
        )
        for name, value, size_name, size in checks:
            if size < 1:
                raise self._error(size_name, size, "must be at least 1")
            if not 0 <= value < size:
                raise self._error(name, value, f"must be in [0, {size_name}={size})")
        if self.master_port is not None and not 0 <= self.master_port <= 65535:
            raise self._error("master_port", self.master_port, "must be in [0, 65535]")

    def _error(self, field: str, value: object, rule: str) -> EnvironmentDetectionError:
        source = self.sources.get(field, "default")
        return EnvironmentDetectionError(
            f"{self.method} launch: {field}={value!r} (from {source}) {rule}. HINT: check the "
            f"launcher's variables, or pass distcomm.init(method=...) to pick another method.",
            variable=source,
            value=str(value),
        )

    def replace(self, source: str = "argument", **changes: Any) -> LaunchInfo:
        """Return a copy with ``changes`` applied, recording ``source`` for each changed field."""
        sources = dict(self.sources)
        sources.update({name: source for name in changes})
        return dataclasses.replace(self, sources=sources, **changes)

    def as_dict(self) -> dict[str, Any]:
        """Return the fields as a JSON-ready dict (``sources`` included)."""
        return dataclasses.asdict(self)


def read_int(environ: Mapping[str, str], name: str, *, minimum: int = 0) -> int | None:
    """Return ``environ[name]`` as an int, or None when unset.

    Raises:
        EnvironmentDetectionError: the variable is set but empty, not an integer, or below
            ``minimum``; the message names the variable and its value.
    """
    raw = environ.get(name)
    if raw is None:
        return None
    try:
        value = int(raw.strip())
    except ValueError:
        raise EnvironmentDetectionError(
            f"{name}={raw!r} is not an integer. HINT: unset it or give it an integer value.",
            variable=name,
            value=raw,
        ) from None
    if value < minimum:
        raise EnvironmentDetectionError(
            f"{name}={raw!r} must be at least {minimum}. HINT: check the launcher's variables.",
            variable=name,
            value=raw,
        )
    return value
