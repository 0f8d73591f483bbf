"""The mpi backend when things go wrong, inside a real MPI job (``mpirun -n N pytest
--with-mpi``): a Work waited for with a timeout names the rank that had not arrived and shows
where it is (both asked over the side channel), and an MPI error is a distcomm error that
leaves no watchdog mark behind.

Each test sacrifices a communicator of its own (a timed-out or failed one cannot be used again)
and leaves every request completed, so the job ends cleanly.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import pytest

import distcomm
from distcomm.errors import DistcommError, DistTimeoutError, EngineError
from distcomm.protocol import Communicator, NonMember

pytestmark = pytest.mark.mpi(min_size=2)

LATE = 1  # the rank that arrives late


def _sacrifice(world: Communicator) -> Communicator:
    group = distcomm.new_group(range(world.world_size))
    assert not isinstance(group, NonMember)
    # These tests leave ranks out of a collective on purpose: no mismatch check, whose
    # all-reduce would wait for them before the operation is even issued.
    group.debug = "off"  # type: ignore[attr-defined]
    return group


def _late_rank_sleeps_here(told: Any, others: int) -> None:
    """Asleep in Python (not in distcomm) until every other rank says it has timed out."""
    while others:
        if told.iprobe(tag=7):
            told.recv(tag=7)
            others -= 1
        time.sleep(0.02)


def test_a_timed_out_wait_names_the_rank_that_had_not_arrived(world: Communicator) -> None:
    group = _sacrifice(world)
    told = world.native.Dup()  # type: ignore[attr-defined]
    if world.rank != LATE:
        work = group.barrier(async_op=True)
        start = time.monotonic()
        with pytest.raises(DistTimeoutError) as info:
            assert work is not None
            work.wait(timeout=0.5)
        error = info.value
        assert (error.op, error.seq, error.missing_ranks) == ("barrier", 1, (LATE,))
        assert f"ranks that had not arrived: [{LATE}] (rank {LATE} has run no collective)" in (
            str(error)
        )
        assert list(error.stacks) == [LATE], error.stacks
        assert "in _late_rank_sleeps_here\n" in error.stacks[LATE], error.stacks
        assert error.stacks[LATE] in str(error).replace("\n  ", "\n")  # shown, indented
        assert time.monotonic() - start < 10
        told.send(None, dest=LATE, tag=7)
    else:
        _late_rank_sleeps_here(told, world.world_size - 1)
    told.Free()
    if world.rank == LATE:  # completes the others' pending barrier (MPI matches a
        late = group.barrier(async_op=True)  # non-blocking collective with its like only)
        assert late is not None and late.wait()
    else:
        deadline = time.monotonic() + 30
        while not work.is_completed():  # the request completes: nothing left in flight
            assert time.monotonic() < deadline, "the late barrier never completed"
            time.sleep(0.01)
        with pytest.raises(DistcommError, match="can no longer be used: barrier"):
            group.barrier()
    group.finalize()
    distcomm.barrier()


def test_an_mpi_error_is_a_distcomm_error_and_leaves_no_watchdog_mark(
    world: Communicator,
) -> None:
    group = _sacrifice(world)
    data = np.zeros(4)
    bad_root = world.world_size + 5  # past the checks: straight to the primitive, as a bug would
    with pytest.raises(EngineError) as info:
        group._call(group._broadcast, False, data, bad_root)  # type: ignore[attr-defined]
    assert type(info.value.__cause__).__name__ == "Exception"  # mpi4py's MPI.Exception
    assert "the engine failed" in str(info.value)
    assert group.blocked_seq == 0, "a failed MPI call left the watchdog's blocked mark set"  # type: ignore[attr-defined]
    group.finalize()
    distcomm.barrier()
