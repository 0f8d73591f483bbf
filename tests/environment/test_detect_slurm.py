"""Tests of distcomm.environment.slurm: srun task steps, and what it rejects."""

from __future__ import annotations

import pytest
from launch_tables import check_detected, check_malformed, launch, srun_task

from distcomm._runtime.detection import detect_environment

DETECTED = [
    pytest.param(
        srun_task(4, 0, 2, 6, "node[01-03]", "2(x3)", 3),
        launch("slurm", 4, 6, 0, 2, 2, 3, "node01", 16234, "1234.0"),
        id="srun-node01-03",
    ),
    pytest.param(
        srun_task(6, 0, 3, 7, "a,b[1-2],c", "2(x3),1", 4),
        launch("slurm", 6, 7, 0, 1, 3, 4, "a", 16234, "1234.0"),
        id="srun-a-b12-c-last",
    ),
    pytest.param(
        srun_task(3, 1, 1, 7, "a,b[1-2],c", "2(x3),1", 4, job_id="987654"),
        launch("slurm", 3, 7, 1, 2, 1, 4, "a", 22654, "987654.0"),
        id="srun-a-b12-c-mid",
    ),
    pytest.param(
        srun_task(1, 1, 0, 7, "a,b[1-2],c", "2(x3),1", 4),
        launch("slurm", 1, 7, 1, 2, 0, 4, "a", 16234, "1234.0"),
        id="srun-a-b12-c-first",
    ),
    pytest.param(
        srun_task(1, 0, 1, 2, "linux[1,2]", "1(x2)", 2),
        launch("slurm", 1, 2, 0, 1, 1, 2, "linux1", 16234, "1234.0"),
        id="srun-linux12",
    ),
    pytest.param(
        srun_task(3, 1, 1, 7, "nodeA,nodeB[001,003],nodeC", "2(x3),1", 4),
        launch("slurm", 3, 7, 1, 2, 1, 4, "nodeA", 16234, "1234.0"),
        id="srun-nodeB001",
    ),
    pytest.param(
        srun_task(5, 1, 1, 8, "gpu-[1-2]-ib", "4(x2)", 2),
        launch("slurm", 5, 8, 1, 4, 1, 2, "gpu-1-ib", 16234, "1234.0"),
        id="srun-gpu-ib",
    ),
    pytest.param(
        srun_task(2, 0, 2, 4, "x[1-2]y[3-4]", "1(x4)", 4),
        launch("slurm", 2, 4, 0, 1, 2, 4, "x1y3", 16234, "1234.0"),
        id="srun-xy",
    ),
    pytest.param(
        {
            "SLURM_STEP_ID": "3",
            "SLURM_PROCID": "1",
            "SLURM_NTASKS": "2",
            "SLURM_LOCALID": "0",
            "SLURM_NODEID": "1",
            "SLURM_JOB_NODELIST": "linux[1,2]",
            "SLURM_TASKS_PER_NODE": "1(x2)",
            "SLURM_JOB_ID": "10000",
        },
        launch("slurm", 1, 2, 0, 1, 1, 2, "linux1", 15000, "10000.3"),
        id="srun-old-variables",
    ),
    pytest.param(
        {
            "SLURM_STEP_ID": "0",
            "SLURM_PROCID": "2",
            "SLURM_STEP_NUM_TASKS": "4",
            "SLURM_LOCALID": "0",
            "SLURM_NODEID": "1",
            "SLURM_STEP_NUM_NODES": "2",
        },
        launch("slurm", 2, 4, 0, 2, 1, 2, None, None, None),
        id="srun-bare",
    ),
    pytest.param(
        srun_task(1, 1, 0, 2, "n1", "2", 1, MASTER_ADDR="10.0.0.7", MASTER_PORT="2345"),
        launch("slurm", 1, 2, 1, 2, 0, 1, "10.0.0.7", 2345, "1234.0"),
        id="srun-master-override",
    ),
]


@pytest.mark.parametrize(("environ", "expected"), DETECTED)
def test_detect_environment(environ: dict[str, str], expected: dict[str, object]) -> None:
    check_detected(environ, expected)


ERRORS = [
    pytest.param(
        {**srun_task(0, 0, 0, 2, "n1", "2", 1), "SLURM_STEP_NODELIST": "node[1-"},
        "SLURM_STEP_NODELIST",
        "'node[1-'",
        id="hostlist-unclosed",
    ),
    pytest.param(
        {**srun_task(0, 0, 0, 2, "n1", "2", 1), "SLURM_STEP_NODELIST": "node[3-1]"},
        "SLURM_STEP_NODELIST",
        "'node[3-1]'",
        id="hostlist-backwards",
    ),
    pytest.param(
        {**srun_task(0, 0, 0, 2, "n1", "2", 1), "SLURM_STEP_NODELIST": "node[a-b]"},
        "SLURM_STEP_NODELIST",
        "'node[a-b]'",
        id="hostlist-letters",
    ),
    pytest.param(
        {**srun_task(0, 0, 0, 2, "n1", "2", 1), "SLURM_STEP_NODELIST": ","},
        "SLURM_STEP_NODELIST",
        "','",
        id="hostlist-comma",
    ),
    pytest.param(
        {**srun_task(0, 0, 0, 2, "n1", "2", 1), "SLURM_STEP_NODELIST": ""},
        "SLURM_STEP_NODELIST",
        "''",
        id="hostlist-empty",
    ),
    pytest.param(
        {**srun_task(0, 0, 0, 2, "n1", "2", 1), "SLURM_STEP_TASKS_PER_NODE": "2(x)"},
        "SLURM_STEP_TASKS_PER_NODE",
        "'2(x)'",
        id="tasks-per-node-no-count",
    ),
    pytest.param(
        {**srun_task(0, 0, 0, 2, "n1", "2", 1), "SLURM_STEP_TASKS_PER_NODE": "x3"},
        "SLURM_STEP_TASKS_PER_NODE",
        "'x3'",
        id="tasks-per-node-letters",
    ),
    pytest.param(
        srun_task(0, 0, 0, 6, "n[1-3]", "2(x2)", 3),
        "SLURM_STEP_TASKS_PER_NODE",
        "'2(x2)'",
        id="tasks-per-node-length",
    ),
    pytest.param(
        srun_task(0, 0, 2, 4, "n[1-2]", "2(x2)", 2), "SLURM_NODEID", "'2'", id="node-id-too-big"
    ),
    pytest.param(
        srun_task(4, 0, 0, 4, "n1", "4", 1), "SLURM_PROCID", "rank=4", id="procid-too-big"
    ),
    pytest.param(
        {**srun_task(0, 0, 0, 2, "n1", "2", 1), "SLURM_STEP_NUM_TASKS": "two"},
        "SLURM_STEP_NUM_TASKS",
        "'two'",
        id="bad-step-tasks",
    ),
    pytest.param(
        {k: v for k, v in srun_task(0, 0, 0, 2, "n1", "2", 1).items() if k != "SLURM_LOCALID"},
        "SLURM_LOCALID",
        "is unset",
        id="no-localid",
    ),
    pytest.param(
        {"SLURM_STEP_ID": "", "SLURM_PROCID": "0"}, "SLURM_STEP_ID", "''", id="empty-step-id"
    ),
]


@pytest.mark.parametrize(("environ", "variable", "shown"), ERRORS)
def test_malformed_environment(environ: dict[str, str], variable: str, shown: str) -> None:
    check_malformed(environ, variable, shown)


def test_srun_pmi2_reason_names_the_agreeing_size() -> None:
    info = detect_environment(
        environ=srun_task(0, 0, 0, 2, "n1", "2", 1, PMI_SIZE="2", PMI_RANK="0")
    )
    assert "PMI_SIZE=2 equals the step's task count" in info.sources["method"]
    assert info.mpi_wireup == "PMI_SIZE=2" and info.sources["mpi_wireup"] == "PMI_SIZE=2"
    assert detect_environment(environ=srun_task(0, 0, 0, 2, "n1", "2", 1)).mpi_wireup is None


def test_a_requeued_job_knows_its_restart_count() -> None:
    """sbatch --requeue: Slurm counts the restarts in SLURM_RESTART_COUNT (unset at first)."""
    task = srun_task(0, 0, 0, 2, "n1", "2", 1)
    assert detect_environment(environ=task).restart_count == 0
    info = detect_environment(environ={**task, "SLURM_RESTART_COUNT": "2"})
    assert info.restart_count == 2 and info.sources["restart_count"] == "SLURM_RESTART_COUNT"
    check_malformed({**task, "SLURM_RESTART_COUNT": "-1"}, "SLURM_RESTART_COUNT", "'-1'")
