"""The conformance suite on gloo: one spawn per world size runs every check in real processes."""

from __future__ import annotations

import pytest

import distcomm
from distcomm.testing import spawn
from distcomm.testing.conformance import CHECKS, run_all


def run_every_check() -> list[str]:
    return run_all()


@pytest.mark.timeout(240)
@pytest.mark.parametrize("world_size", [2, 3, 4])
def test_gloo_passes_every_check(world_size: int) -> None:
    results = spawn(run_every_check, world_size, backend="gloo", timeout=200)
    assert results == [list(CHECKS)] * world_size


def test_gloo_world_of_one_passes_every_check() -> None:
    comm = distcomm.init(backend="gloo")
    assert comm.backend == "gloo" and comm.world_size == 1
    assert run_all() == list(CHECKS)
