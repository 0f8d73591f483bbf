"""The world every MPI test module shares: one ``distcomm.init()`` per module, on every rank."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

import distcomm
from distcomm.protocol import Communicator


@pytest.fixture(scope="module")
def world() -> Iterator[Communicator]:
    comm = distcomm.init()  # automatic selection: mpi under mpirun
    yield comm
    distcomm.finalize()
