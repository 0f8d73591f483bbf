"""The conformance suite as pytest tests inside a real MPI job.

Run by the test command as ``mpirun -n N python -m pytest --with-mpi`` on this folder (N = 1, 2,
4): every rank runs every test; one ``distcomm.init()`` serves the whole module. A rank that
fails a test ends the job at once (distcomm's pytest plugin) instead of leaving the others
waiting in a collective.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

import distcomm
from distcomm.protocol import Communicator
from distcomm.testing.conformance import CHECKS, run_check

pytestmark = pytest.mark.mpi


@pytest.fixture(scope="module")
def world() -> Iterator[Communicator]:
    comm = distcomm.init()  # automatic selection: mpi under mpirun
    yield comm
    distcomm.finalize()


def test_mpirun_selects_mpi(world: Communicator) -> None:
    from mpi4py import MPI

    assert (world.backend, world.launch.method) == ("mpi", "mpi")
    assert (world.rank, world.world_size) == (MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size())


@pytest.mark.parametrize("name", list(CHECKS))
def test_conformance(world: Communicator, name: str) -> None:
    run_check(name)


@pytest.mark.mpi(min_size=2)
def test_reinit_after_finalize(world: Communicator) -> None:
    """MPI is never finalised by distcomm, so a second world can follow the first."""
    distcomm.finalize()
    again = distcomm.init(backend="mpi")
    assert again.world_size == world.world_size and again is not world
    assert distcomm.all_reduce(1) == world.world_size
