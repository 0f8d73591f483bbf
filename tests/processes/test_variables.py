"""Tests of distcomm._processes.variables: what ``distcomm run`` and ``spawn`` set in each rank."""

from __future__ import annotations

from distcomm._processes.variables import launch_variables


def test_launch_variables() -> None:
    assert launch_variables(1, 4, 29500, "gloo") == {
        "RANK": "1",
        "WORLD_SIZE": "4",
        "LOCAL_RANK": "1",
        "LOCAL_WORLD_SIZE": "4",
        "GROUP_RANK": "0",
        "GROUP_WORLD_SIZE": "1",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": "29500",
        "TORCHELASTIC_USE_AGENT_STORE": "False",
        "DISTCOMM_RUN_REPORTS": "",
        "PYTHONUNBUFFERED": "1",
        "DISTCOMM_BACKEND": "gloo",
    }
    assert "DISTCOMM_BACKEND" not in launch_variables(0, 1, 29500)
