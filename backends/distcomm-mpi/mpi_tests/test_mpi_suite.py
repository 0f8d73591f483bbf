"""The conformance suite as pytest tests inside a real MPI job.

Run by the test command as ``mpirun -n N python -m pytest --with-mpi`` on this folder (N = 1, 2,
4): every rank runs every test; one ``distcomm.init()`` serves the whole module (conftest.py). A
rank that fails a test ends the job at once (distcomm's pytest plugin) instead of leaving the
others waiting in a collective.
"""

from __future__ import annotations

import pytest

import distcomm
from distcomm.protocol import Communicator
from distcomm.testing.conformance import CHECKS, run_check

pytestmark = pytest.mark.mpi


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


@pytest.mark.mpi(min_size=2)
def test_objects_larger_than_2_gib(world: Communicator) -> None:
    """A broadcast object of more than 2 GiB (MPI counts are 32-bit ints without MPI-4's large
    counts). On 2 ranks only: it needs about 6 GiB of memory per rank."""
    import numpy as np

    if world.world_size != 2:
        pytest.skip(f"needs world size 2 (memory), not {world.world_size}")
    n = (2**31 + 2**20) // 8
    obj = {"big": np.arange(n, dtype=np.float64), "tag": "x"} if world.rank == 0 else None
    got = distcomm.broadcast_object(obj, src=0)
    big = got["big"]
    assert got["tag"] == "x" and big.nbytes > 2**31
    assert big[0] == 0 and big[-1] == n - 1 and big[n // 3] == n // 3
    assert float(big[:: 2**16].sum()) == float(np.arange(0, n, 2**16, dtype=np.float64).sum())
