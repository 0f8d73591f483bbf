"""Shared fixtures: every test starts from a plain machine and leaves distcomm finalised."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

import distcomm
from distcomm.registry import Registry, set_registry

#: Launcher variables read by distcomm's launch detection (plus the ones ``init`` exports).
LAUNCHER_VARIABLES = (
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "GROUP_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "TORCHELASTIC_RUN_ID",
)
LAUNCHER_PREFIXES = ("SLURM_", "OMPI_", "PMI_", "PMIX_", "MV2_", "MPI_LOCAL", "DISTCOMM_")


@pytest.fixture(autouse=True)
def plain_machine(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Remove every launcher and DISTCOMM_* variable, and finalize distcomm after the test."""
    for name in list(os.environ):
        if name in LAUNCHER_VARIABLES or name.startswith(LAUNCHER_PREFIXES):
            monkeypatch.delenv(name)
    try:
        yield
    finally:
        distcomm.finalize()


@pytest.fixture
def core_registry() -> Iterator[Registry]:
    """Make the process's registry hold the core's plugins only, whatever else is installed."""
    registry = Registry.load(entry_points=[], environ={})
    previous = set_registry(registry)
    try:
        yield registry
    finally:
        set_registry(previous)
