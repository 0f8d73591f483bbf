"""Tests of distcomm.environment.mpi: Open MPI, MVAPICH, MPICH (hydra) and PMIx launches, and what
it rejects."""

from __future__ import annotations

import pytest
from launch_tables import check_detected, check_malformed, launch

DETECTED = [
    pytest.param(
        {
            "OMPI_COMM_WORLD_RANK": "2",
            "OMPI_COMM_WORLD_SIZE": "4",
            "OMPI_COMM_WORLD_LOCAL_RANK": "0",
            "OMPI_COMM_WORLD_LOCAL_SIZE": "2",
            "OMPI_MCA_ess_base_jobid": "3456",
            "PMIX_RANK": "2",
        },
        launch("mpi", 2, 4, 0, 2, 1, 2, None, None, "3456"),
        id="openmpi",
    ),
    pytest.param(
        {
            "MV2_COMM_WORLD_RANK": "1",
            "MV2_COMM_WORLD_SIZE": "3",
            "MV2_COMM_WORLD_LOCAL_RANK": "1",
            "MV2_COMM_WORLD_LOCAL_SIZE": "3",
        },
        launch("mpi", 1, 3, 1, 3, 0, 1, None, None, None),
        id="mvapich",
    ),
    pytest.param(
        {"PMI_RANK": "3", "PMI_SIZE": "4", "MPI_LOCALRANKID": "1", "MPI_LOCALNRANKS": "2"},
        launch("mpi", 3, 4, 1, 2, 1, 2, None, None, None),
        id="mpich-hydra",
    ),
    pytest.param(
        {"PMI_RANK": "3", "PMI_SIZE": "4"},
        launch("mpi", 3, 4, 3, 4, 0, 1, None, None, None),
        id="mpich-no-local",
    ),
    pytest.param(
        {"PMIX_RANK": "2", "OMPI_COMM_WORLD_SIZE": "3"},
        launch("mpi", 2, 3, 2, 3, 0, 1, None, None, None),
        id="pmix-ompi-size",
    ),
    pytest.param(
        {"PMIX_RANK": "1", "PMI_SIZE": "2", "MPI_LOCALNRANKS": "1"},
        launch("mpi", 1, 2, 0, 1, 1, 2, None, None, None),
        id="pmix-pmi-size",
    ),
    pytest.param(
        {
            "PMI_RANK": "0",
            "PMI_SIZE": "2",
            "MASTER_ADDR": "head",
            "MASTER_PORT": "4000",
            "SLURM_JOB_ID": "12",
            "SLURM_NODELIST": "n[3-4]",
        },
        launch("mpi", 0, 2, 0, 2, 0, 1, "head", 4000, "12"),
        id="mpi-master-override",
    ),
    pytest.param(
        {"PMI_RANK": "0", "PMI_SIZE": "2", "SLURM_JOB_ID": "12", "SLURM_NODELIST": "n[3-4]"},
        launch("mpi", 0, 2, 0, 2, 0, 1, "n3", 15012, "12"),
        id="mpi-slurm-defaults",
    ),
]


@pytest.mark.parametrize(("environ", "expected"), DETECTED)
def test_detect_environment(environ: dict[str, str], expected: dict[str, object]) -> None:
    check_detected(environ, expected)


ERRORS = [
    pytest.param(
        {"OMPI_COMM_WORLD_RANK": "0"},
        "OMPI_COMM_WORLD_SIZE",
        "OMPI_COMM_WORLD_RANK='0'",
        id="ompi-rank-without-size",
    ),
    pytest.param({"PMI_RANK": "0", "PMI_SIZE": "two"}, "PMI_SIZE", "'two'", id="bad-pmi-size"),
    pytest.param({"PMI_RANK": "2", "PMI_SIZE": "2"}, "PMI_RANK", "rank=2", id="pmi-rank-too-big"),
]


@pytest.mark.parametrize(("environ", "variable", "shown"), ERRORS)
def test_malformed_environment(environ: dict[str, str], variable: str, shown: str) -> None:
    check_malformed(environ, variable, shown)
