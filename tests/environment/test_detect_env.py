"""Tests of distcomm.environment.env: torchrun-style RANK/WORLD_SIZE launches, and what it
rejects."""

from __future__ import annotations

import pytest
from launch_tables import (
    TORCHRUN,
    TORCHRUN_MULTINODE,
    check_detected,
    check_malformed,
    launch,
)

DETECTED = [
    pytest.param(
        TORCHRUN,
        launch("env", 3, 4, 3, 4, 0, 1, "127.0.0.1", 29500, None, agent_store=True),
        id="torchrun",
    ),
    pytest.param(
        TORCHRUN_MULTINODE,
        launch("env", 5, 8, 1, 4, 1, 2, "node01", 29400, "job42"),
        id="torchrun-multinode",
    ),
    pytest.param(
        {"RANK": "1", "WORLD_SIZE": "2"},
        launch("env", 1, 2, 1, 2, 0, 1, "127.0.0.1", None, None),
        id="env-minimal",
    ),
    pytest.param(
        {"RANK": "5", "WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "4"},
        launch("env", 5, 8, 1, 4, 1, 2, None, None, None),
        id="env-local-size-only",
    ),
    pytest.param(
        {"RANK": "0", "WORLD_SIZE": "1", "SLURM_JOB_ID": "55"},
        launch("env", 0, 1, 0, 1, 0, 1, "127.0.0.1", None, "55"),
        id="env-slurm-job",
    ),
]


@pytest.mark.parametrize(("environ", "expected"), DETECTED)
def test_detect_environment(environ: dict[str, str], expected: dict[str, object]) -> None:
    check_detected(environ, expected)


ERRORS = [
    pytest.param({"RANK": "", "WORLD_SIZE": "2"}, "RANK", "''", id="empty-rank"),
    pytest.param({"RANK": "0", "WORLD_SIZE": "abc"}, "WORLD_SIZE", "'abc'", id="bad-world"),
    pytest.param({"RANK": "0", "WORLD_SIZE": "0"}, "WORLD_SIZE", "'0'", id="zero-world"),
    pytest.param({"RANK": "4", "WORLD_SIZE": "4"}, "RANK", "rank=4", id="rank-too-big"),
    pytest.param({"RANK": "0"}, "WORLD_SIZE", "RANK='0'", id="rank-without-world"),
    pytest.param({"WORLD_SIZE": "2"}, "RANK", "WORLD_SIZE='2'", id="world-without-rank"),
    pytest.param(
        {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "-1"},
        "LOCAL_RANK",
        "'-1'",
        id="negative-local-rank",
    ),
    pytest.param(
        {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "2", "LOCAL_WORLD_SIZE": "2"},
        "LOCAL_RANK",
        "local_rank=2",
        id="local-rank-too-big",
    ),
    pytest.param(
        {"RANK": "0", "WORLD_SIZE": "2", "MASTER_PORT": "http"},
        "MASTER_PORT",
        "'http'",
        id="bad-port",
    ),
    pytest.param(
        {"RANK": "0", "WORLD_SIZE": "2", "MASTER_PORT": "70000"},
        "MASTER_PORT",
        "70000",
        id="port-out-of-range",
    ),
    pytest.param(
        {"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": " "},
        "MASTER_ADDR",
        "' '",
        id="empty-master-addr",
    ),
]


@pytest.mark.parametrize(("environ", "variable", "shown"), ERRORS)
def test_malformed_environment(environ: dict[str, str], variable: str, shown: str) -> None:
    check_malformed(environ, variable, shown)


def test_torchrun_and_distcomm_run_restarts_are_counted() -> None:
    """TORCHELASTIC_RESTART_COUNT (torchrun's; distcomm run --max-restarts sets it too)."""
    from distcomm._runtime.detection import detect_environment

    ranks = {"RANK": "1", "WORLD_SIZE": "2"}
    assert detect_environment(environ=ranks).restart_count == 0
    info = detect_environment(environ={**ranks, "TORCHELASTIC_RESTART_COUNT": "3"})
    assert info.restart_count == 3
    assert info.sources["restart_count"] == "TORCHELASTIC_RESTART_COUNT"
    check_malformed(
        {**ranks, "TORCHELASTIC_RESTART_COUNT": "x"}, "TORCHELASTIC_RESTART_COUNT", "'x'"
    )
