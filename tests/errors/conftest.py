"""Fixtures of the bad-input catalogue (docs/errors.md): no row may leave anything behind."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from jobs import children_left, dev_shm_names


def shm_entries() -> set[str]:
    """distcomm's entries in /dev/shm now, but those a running process uses."""
    return {name for name in dev_shm_names() if name.startswith("distcomm-")}


@pytest.fixture(autouse=True)
def nothing_left_behind() -> Iterator[None]:
    """Fail a row that leaves a distcomm shared-memory entry or a child process behind."""
    before = shm_entries()
    yield
    assert shm_entries() - before == set(), "a row left distcomm entries in /dev/shm"
    assert children_left() == [], "a row left child processes running"
