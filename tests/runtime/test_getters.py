"""Tests of distcomm._runtime.getters before ``init``: answers from the detected launch."""

from __future__ import annotations

import pytest

import distcomm


def test_getters_before_init_answer_from_the_detected_launch(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    launch = {
        "RANK": "3",
        "WORLD_SIZE": "4",
        "LOCAL_RANK": "1",
        "LOCAL_WORLD_SIZE": "2",
        "GROUP_RANK": "1",
    }
    for name, value in launch.items():
        monkeypatch.setenv(name, value)
    assert distcomm.get_rank() == 3
    assert distcomm.get_world_size() == 4
    assert distcomm.get_local_rank() == 1
    assert distcomm.get_local_world_size() == 2
    assert distcomm.get_node_rank() == 1
    assert distcomm.is_main_process() is False
    assert distcomm.is_local_main_process() is False
    assert not distcomm.is_initialized()
    assert not distcomm.is_distributed()
    assert distcomm.get_backend() is None


def test_getters_before_init_on_a_plain_machine() -> None:
    assert (distcomm.get_rank(), distcomm.get_world_size()) == (0, 1)
    assert distcomm.get_local_rank() == 0
    assert distcomm.get_local_world_size() == 1
    assert distcomm.get_node_rank() == 0
    assert distcomm.is_main_process() and distcomm.is_local_main_process()
    assert not distcomm.is_initialized()
