"""Tests of distcomm.backend._pipeline.engine_failures: timeouts that name names, engine failures as
distcomm errors, Works that own their buffers, and finalize with operations pending (in one
process: fakelink thread-ranks and small stand-in engines; the real engines have their own
tests). The policies that end a job: test_aborts.py; the monitor thread: test_monitor.py.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import numpy as np
import pytest
from kit_engines import Idle, over
from skipped_ranks import TIMEOUT, skipped_barrier, skipped_group_barrier

import distcomm
from distcomm.backend.communicator import BaseCommunicator
from distcomm.backend.work import EngineWork, retained
from distcomm.environment import LaunchInfo
from distcomm.errors import DistcommError, DistTimeoutError, EngineError
from distcomm.fakelink import FabricAborted, FakeLinkEngine
from distcomm.testing import run_threads

LAUNCH = LaunchInfo("env", 0, 2, 0, 2, 0, 1)


def test_a_skipped_group_barrier_names_the_missing_rank_of_the_group(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("DISTCOMM_TIMEOUT", "1")
    assert run_threads(skipped_group_barrier, 3, timeout=30)[0] == (
        "DistTimeoutError",
        "barrier",
        1,
        (1,),
    )


def test_a_skipped_barrier_names_the_op_its_seq_and_the_missing_rank_on_threads(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("DISTCOMM_TIMEOUT", str(TIMEOUT))
    results = run_threads(skipped_barrier, 3, timeout=30)
    assert results[1][0] == "slept"
    for rank in (0, 2):
        kind, op, seq, missing, message, elapsed = results[rank]
        assert (kind, op, seq, missing) == ("DistTimeoutError", "barrier", 2, (1,))
        assert "barrier (operation #2) on fakelink 'world' (3 ranks)" in message
        assert "ranks that had not arrived: [1] (rank 1 is at operation #1)" in message
        assert "HINT:" in message
        assert elapsed < 2 * TIMEOUT, f"rank {rank} waited {elapsed:.1f} s"


def test_run_threads_operations_use_the_run_timeout_without_distcomm_timeout() -> None:
    def timeout_seen() -> float:
        return distcomm.get_communicator().timeout  # type: ignore[attr-defined, no-any-return]

    assert run_threads(timeout_seen, 2, timeout=7) == [12.0, 12.0]


def test_abort_policy_on_threads_ends_the_fabric_not_the_process(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("DISTCOMM_TIMEOUT", "1")
    monkeypatch.setenv("DISTCOMM_ON_TIMEOUT", "abort")

    def body() -> str:
        if distcomm.get_rank() == 1:
            try:
                time.sleep(2)  # past rank 0's timeout, outside distcomm: it cannot be stopped
                distcomm.barrier()
            except FabricAborted:
                return "aborted"
            return "not aborted"
        distcomm.barrier()
        return "passed"

    start = time.monotonic()
    with pytest.raises(distcomm.RankFailedError) as info:
        run_threads(body, 2, timeout=30)
    assert time.monotonic() - start < 5, "the abort did not end the run"
    assert info.value.rank == 0
    assert "barrier (operation #1)" in str(info.value)
    assert "ranks that had not arrived: [1]" in str(info.value)


# -- Works and their engines ---------------------------------------------------------------------
class Request:
    """A stand-in engine's request: complete when the test says so (``done``), or failing with
    ``error`` when tested or waited for."""

    def __init__(self) -> None:
        self.done = False
        self.error: Exception | None = None

    def test(self) -> bool:
        if self.error is not None:
            raise self.error
        return self.done


class StandInEngine(Idle):
    """A 2-rank engine whose async operations complete when the test says so: ``requests``,
    one per operation, in order; ``finalized`` once the kit finalized it."""

    def __init__(self) -> None:
        self.requests: list[Request] = []
        self.finalized = False

    def bind(self, comm: BaseCommunicator) -> None:
        self.comm = comm

    def all_reduce(self, tensor: Any, op: Any, async_op: bool) -> EngineWork:
        self.requests.append(Request())
        return EngineWork(self.comm, self.requests[-1], tensor)

    def isend(self, tensor: Any, dst: int, tag: int) -> EngineWork:
        self.requests.append(Request())
        return EngineWork(self.comm, self.requests[-1], tensor)

    def finalize(self) -> None:
        self.finalized = True


def stand_in(**kwargs: Any) -> BaseCommunicator:
    """Rank 0 of 2 over a :class:`StandInEngine` (``kwargs``: the communicator's, timeout)."""
    comm = over(StandInEngine(), backend="standin", launch=LAUNCH, **kwargs)
    comm.debug = "off"  # no mismatch check: its all-reduce would wait on a stand-in engine
    return comm


def test_an_engine_exception_becomes_an_engine_error_with_the_cause() -> None:
    comm = stand_in()
    work = comm.all_reduce(np.ones(3), async_op=True)
    lost = RuntimeError("[pair.cc:553] Connection closed by peer [127.0.0.1]:4242")
    comm.engine.requests[0].error = lost
    with pytest.raises(EngineError) as info:
        work.wait()
    error = info.value
    assert error.__cause__ is lost and isinstance(error, RuntimeError)
    assert (error.op, error.seq) == ("all_reduce", 1)
    assert "all_reduce (operation #1) on standin 'world' (2 ranks) failed: a peer went away" in (
        str(error)
    )
    assert "the ranks that had not arrived are unknown" in str(error)
    with pytest.raises(DistcommError, match="can no longer be used: all_reduce"):
        comm.all_reduce(np.ones(3))


def test_a_timed_out_work_keeps_its_buffers_until_exit() -> None:
    comm = stand_in(timeout=0.05)
    work = comm.all_reduce(np.ones(3), async_op=True)
    with pytest.raises(DistTimeoutError, match=r"within 0\.05 s") as info:
        work.wait()
    assert info.value.missing_ranks is None, "this backend cannot tell: unknown, not a guess"
    assert "unknown (this backend cannot tell)" in str(info.value)
    assert work in retained(), "the engine may still write into a timed-out Work's buffers"


def test_works_nobody_waits_for_do_not_pile_up() -> None:
    comm = stand_in()
    for _ in range(200):
        comm.isend(np.ones(2), 1)
        comm.engine.requests[-1].done = True
    assert len(comm._pending) <= 64


def test_finalize_waits_for_a_pending_work() -> None:
    comm = stand_in(timeout=5)
    data = np.ones(3)
    work = comm.all_reduce(data, async_op=True)
    threading.Timer(0.2, lambda: setattr(comm.engine.requests[0], "done", True)).start()
    comm.finalize()
    assert comm.engine.finalized and work.is_completed()


def test_finalize_keeps_a_communicator_whose_work_never_completes() -> None:
    comm = stand_in(timeout=0.1)
    work = comm.all_reduce(np.ones(3), async_op=True)
    with pytest.warns(distcomm.DistcommWarning, match="had not completed"):
        comm.finalize()
    assert not comm.engine.finalized, "freed under a pending operation"
    assert comm in retained() and work in retained()


def test_finalize_of_a_fakelink_world_with_a_work_in_flight() -> None:
    def body() -> list[float]:
        comm = distcomm.get_communicator()
        data = np.full(2, comm.rank + 1.0)
        if comm.rank == 1:
            time.sleep(0.3)
        work = distcomm.all_reduce(data, async_op=True)
        assert isinstance(comm.engine, FakeLinkEngine)
        comm.finalize()  # rank 0's waits for rank 1 to join the all_reduce
        assert work.is_completed()
        work.wait()
        return data.tolist()

    assert run_threads(body, 2) == [[3.0, 3.0], [3.0, 3.0]]


#: What torch raises when two ranks of one node pick the same GPU (torch's DistBackendError text
#: around NCCL's "Last error", as users report it; NCCL's reason is never on the first line).
NCCL_DUPLICATE_GPU = (
    "NCCL error in: /pytorch/torch/csrc/distributed/c10d/NCCLUtils.cpp:77, invalid usage (run "
    "with NCCL_DEBUG=WARN for details), NCCL version 2.21.5\n"
    "ncclInvalidUsage: This usually reflects invalid usage of NCCL library.\n"
    "Last error:\n"
    "Duplicate GPU detected : rank 1 and rank 0 both on CUDA device 1000\n"
    "Exception raised from getNcclComm at /pytorch/torch/csrc/distributed/c10d/x.cpp:1 (most "
    "recent call first):\nframe #0: c10::Error::Error() + 0x1\n"
)


def test_an_engine_error_keeps_the_engines_reason_after_its_first_line() -> None:
    """NCCL's reason comes after torch's first line: an EngineError that kept only the first
    line said "invalid usage" and hid "Duplicate GPU detected"."""
    comm = stand_in()
    work = comm.all_reduce(np.ones(3), async_op=True)
    comm.engine.requests[0].error = RuntimeError(NCCL_DUPLICATE_GPU)
    with pytest.raises(EngineError) as info:
        work.wait()
    said = str(info.value)
    assert "failed: the engine failed (RuntimeError: NCCL error in: " in said
    assert "\nThe engine said:\n  ncclInvalidUsage: This usually" in said, said
    assert "\n  Duplicate GPU detected : rank 1 and rank 0 both on CUDA device 1000" in said
    assert "Exception raised from" not in said and "frame #0" not in said, "a C++ stack trace"


def test_a_check_on_the_object_channel_that_times_out_names_the_collective_it_checked(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """On nccl the mismatch check's all-reduce runs on the Gloo side group (the object
    channel). Rank 1 skips the third all_reduce (a check point): rank 0's check times out
    there, and the error names the all_reduce it checked (#4 of the world, whose #1 made the
    side group; rank 1 not there),
    not the side group's own operation ("every rank had arrived"). Thread-ranks on fakelink,
    whose world is given a second communicator as its object channel, as nccl's is."""
    monkeypatch.setenv("DISTCOMM_TIMEOUT", "1")

    def body() -> Any:
        world = distcomm.get_communicator()
        side = distcomm.new_group([0, 1])
        world._object_channel = lambda: side  # type: ignore[method-assign]
        side.all_gather_object(None)  # the side group's own operations, numbered apart
        distcomm.all_reduce(np.ones(2))
        distcomm.all_reduce(np.ones(2))
        if world.rank == 1:
            time.sleep(4)
            return None
        with pytest.raises(DistTimeoutError) as info:
            distcomm.all_reduce(np.ones(2))
        error = info.value
        return error.op, error.seq, error.missing_ranks, error.group, str(error), side.unusable

    op, seq, missing, group, said, side_state = run_threads(body, 2, timeout=60)[0]
    assert (op, seq, tuple(missing)) == ("all_reduce", 4, (1,)), said
    assert "'world'" in group and said.startswith("all_reduce (operation #4) on fakelink "), said
    assert "time.sleep(4)" in said, "where rank 1 was"
    assert side_state and "the check of all_reduce #4" in side_state, side_state
