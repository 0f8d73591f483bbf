"""Tests of distcomm.environment.single_node: the fallback world of 1, its warning in a batch
script without srun, and what it rejects."""

from __future__ import annotations

import pytest
from launch_tables import BATCH_SCRIPT, check_detected, check_malformed, launch

import distcomm
from distcomm._runtime.detection import detect_environment
from distcomm.errors import DistcommWarning

DETECTED = [
    pytest.param(
        {"PMIX_RANK": "0"},
        launch("single_node", 0, 1, 0, 1, 0, 1, "127.0.0.1", None, None),
        id="pmix-alone",
    ),
    pytest.param({}, launch("single_node", 0, 1, 0, 1, 0, 1, "127.0.0.1", None, None), id="empty"),
    pytest.param(
        {"SLURM_JOB_ID": "8", "SLURM_NTASKS": "1", "SLURM_PROCID": "0"},
        launch("single_node", 0, 1, 0, 1, 0, 1, "127.0.0.1", None, "8"),
        id="batch-one-task",
    ),
    pytest.param(
        {**BATCH_SCRIPT, "SLURM_NTASKS": "1", "SLURM_STEP_ID": "extern"},
        launch("single_node", 0, 1, 0, 1, 0, 1, "127.0.0.1", None, "9001"),
        id="extern-step",
    ),
]


@pytest.mark.parametrize(("environ", "expected"), DETECTED)
def test_detect_environment(environ: dict[str, str], expected: dict[str, object]) -> None:
    check_detected(environ, expected)


ERRORS = [
    pytest.param(
        {**BATCH_SCRIPT, "SLURM_NTASKS": "many"}, "SLURM_NTASKS", "'many'", id="batch-bad-ntasks"
    ),
]


@pytest.mark.parametrize(("environ", "variable", "shown"), ERRORS)
def test_malformed_environment(environ: dict[str, str], variable: str, shown: str) -> None:
    check_malformed(environ, variable, shown)


@pytest.mark.parametrize(
    "environ",
    [
        pytest.param(BATCH_SCRIPT, id="no-step-id"),
        pytest.param({**BATCH_SCRIPT, "SLURM_STEP_ID": "batch"}, id="batch-step"),
        pytest.param({**BATCH_SCRIPT, "SLURM_STEP_ID": "4294967294"}, id="batch-step-number"),
        pytest.param({**BATCH_SCRIPT, "SLURM_STEP_ID": "4294967290"}, id="salloc-interactive"),
    ],
)
def test_batch_script_without_srun_warns(environ: dict[str, str]) -> None:
    with pytest.warns(DistcommWarning, match=r"SLURM_NTASKS=4.*HINT: srun python") as record:
        info = detect_environment(environ=environ)
    assert len(record) == 1
    assert (info.method, info.rank, info.world_size, info.job_id) == ("single_node", 0, 1, "9001")


def test_single_node_honours_master_address(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MASTER_ADDR", "10.1.2.3")
    monkeypatch.setenv("MASTER_PORT", "29511")
    detected = distcomm.detect_environment()
    assert (detected.master_addr, detected.master_port) == ("10.1.2.3", 29511)
    assert (detected.sources["master_addr"], detected.sources["master_port"]) == (
        "MASTER_ADDR",
        "MASTER_PORT",
    )
