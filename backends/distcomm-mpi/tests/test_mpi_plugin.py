"""When the mpi backend says it can run: from the LaunchInfo alone (no MPI is started here)."""

from __future__ import annotations

import pytest
from distcomm_mpi.plugin import is_available

from distcomm import LaunchInfo


def launch(method: str, world_size: int = 4, wireup: str | None = None) -> LaunchInfo:
    return LaunchInfo(method, 0, world_size, 0, world_size, 0, 1, mpi_wireup=wireup)


@pytest.mark.parametrize(
    ("info", "available", "reason"),
    [
        (launch("mpi"), True, "MPI launcher detected"),
        (
            launch("slurm", wireup="PMI_SIZE=4"),
            True,
            "slurm launch with MPI variables (PMI_SIZE=4)",
        ),
        (launch("slurm"), False, "HINT: start it with srun --mpi=pmi2"),
        (launch("env"), False, "HINT: start it with mpirun/mpiexec (or srun --mpi=pmi2)"),
        (launch("single_node", world_size=1), True, "MPI singleton"),
    ],
)
def test_availability_follows_the_launch(info: LaunchInfo, available: bool, reason: str) -> None:
    ok, why = is_available(info)
    assert ok is available and reason in why
