"""Tests of distcomm._processes.variables: what ``distcomm run`` and ``spawn`` set in each rank."""

from __future__ import annotations

from distcomm._processes.variables import launch_variables, new_run_id


def test_launch_variables() -> None:
    assert launch_variables(1, 4, 29500, "gloo", "0123abcd") == {
        "RANK": "1",
        "WORLD_SIZE": "4",
        "LOCAL_RANK": "1",
        "LOCAL_WORLD_SIZE": "4",
        "GROUP_RANK": "0",
        "GROUP_WORLD_SIZE": "1",
        "ROLE_NAME": "default",
        "ROLE_RANK": "1",
        "ROLE_WORLD_SIZE": "4",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": "29500",
        "TORCHELASTIC_USE_AGENT_STORE": "False",
        "TORCHELASTIC_RESTART_COUNT": "0",
        "TORCHELASTIC_MAX_RESTARTS": "0",
        "DISTCOMM_RUN_REPORTS": "",
        "DISTCOMM_RUN_PID": "",
        "DISTCOMM_RUN_STDERR": "",
        "PYTHONUNBUFFERED": "1",
        "DISTCOMM_BACKEND": "gloo",
        "DISTCOMM_RUN_ID": "0123abcd",
        "TORCHELASTIC_RUN_ID": "0123abcd",
    }
    assert "DISTCOMM_BACKEND" not in launch_variables(0, 1, 29500)
    assert "DISTCOMM_RUN_ID" not in launch_variables(0, 1, 29500)
    assert "TORCHELASTIC_RUN_ID" not in launch_variables(0, 1, 29500)
    assert launch_variables(0, 1, 29500, restart_count=2)["TORCHELASTIC_RESTART_COUNT"] == "2"


def test_each_run_has_its_own_id() -> None:
    ids = {new_run_id() for _ in range(100)}
    assert len(ids) == 100 and all(len(i) == 12 for i in ids)
