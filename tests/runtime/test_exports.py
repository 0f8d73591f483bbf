"""Tests of distcomm._runtime.exports: the launcher variables ``init`` exports, and takes back."""

from __future__ import annotations

import os

import pytest

import distcomm


def test_export_env_sets_absent_variables_and_finalize_removes_exactly_those(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("MASTER_ADDR", "10.1.2.3")
    distcomm.init()
    assert os.environ["RANK"] == "0"
    assert os.environ["WORLD_SIZE"] == "1"
    assert os.environ["LOCAL_RANK"] == "0"
    assert os.environ["LOCAL_WORLD_SIZE"] == "1"
    assert os.environ["MASTER_ADDR"] == "10.1.2.3"  # present: never overwritten
    assert "MASTER_PORT" not in os.environ  # a world of 1 has no port to export
    distcomm.finalize()
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_PORT"):
        assert name not in os.environ
    assert os.environ["MASTER_ADDR"] == "10.1.2.3"


def test_export_env_sets_master_addr_when_absent() -> None:
    distcomm.init()
    assert os.environ["MASTER_ADDR"] == "127.0.0.1"
    distcomm.finalize()
    assert "MASTER_ADDR" not in os.environ


def test_export_env_false_exports_nothing() -> None:
    before = dict(os.environ)
    distcomm.init(export_env=False)
    assert dict(os.environ) == before
    distcomm.finalize()
    assert dict(os.environ) == before
