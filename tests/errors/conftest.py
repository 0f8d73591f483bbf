"""Fixtures of the bad-input catalogue (docs/errors.md): no row may leave anything behind."""

from __future__ import annotations

import multiprocessing
from collections.abc import Iterator
from pathlib import Path

import pytest


def shm_entries() -> set[str]:
    """distcomm's entries in /dev/shm now."""
    return {p.name for p in Path("/dev/shm").glob("distcomm-*")}


@pytest.fixture(autouse=True)
def nothing_left_behind() -> Iterator[None]:
    """Fail a row that leaves a distcomm shared-memory entry or a child process behind."""
    before = shm_entries()
    yield
    assert shm_entries() - before == set(), "a row left distcomm entries in /dev/shm"
    assert multiprocessing.active_children() == [], "a row left child processes running"
