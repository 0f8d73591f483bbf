"""Tests of distcomm.backend._pipeline.defaults: the kit's defaults of an engine's optional
operations.

:class:`Recording` is fakelink's engine without its own ``reduce``, ``reduce_scatter``,
``gather``, ``scatter``, ``all_to_all`` and ``barrier`` (``Minimal``, tests/support/kit_engines.py:
it defines the required methods only), so that the kit's defaults run over fakelink's required
methods, which it records. Its ranks are thread-ranks of ``run_threads``, on the fabric of the
run (see :func:`on_defaults`). The whole conformance suite also runs on such an engine
(tests/fakelink/test_conformance_fakelink.py, "minimal"); these tests check each default alone,
blocking and with ``async_op=True``.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

import numpy as np
import pytest
from kit_engines import Minimal

import distcomm
from distcomm.backend import INTERNAL_TAG, BaseCommunicator
from distcomm.backend._pipeline.defaults import Defaults
from distcomm.environment import LaunchInfo
from distcomm.errors import NotSupportedError
from distcomm.fakelink import CAPABILITIES, Fabric, FakeLinkEngine, world
from distcomm.protocol import ReduceOp, Work
from distcomm.testing import run_threads

T = TypeVar("T")
#: fakelink's capabilities without node memory, whose proof would add its engine calls to the
#: ones each test expects of the kit.
KIT_ONLY = dataclasses.replace(CAPABILITIES, node_memory=False)
DEFAULTED = ("_reduce", "_reduce_scatter", "_gather", "_scatter", "_all_to_all", "_barrier")


class Recording(Minimal):  # type: ignore[misc, valid-type]
    """fakelink's engine reduced to its required methods; ``calls`` lists those its
    communicator called, in order, by the communicator's names of them (``_all_reduce`` is the
    engine's ``all_reduce``)."""

    def __init__(self, fabric: Fabric, uid: int) -> None:
        super().__init__(fabric, uid)
        self.calls: list[Any] = []

    def all_reduce(self, tensor: Any, op: ReduceOp, async_op: bool) -> Work | None:
        self.calls.append("_all_reduce")
        return super().all_reduce(tensor, op, async_op)

    def broadcast(self, tensor: Any, src: int, async_op: bool) -> Work | None:
        self.calls.append("_broadcast")
        return super().broadcast(tensor, src, async_op)

    def all_gather_into(self, output: Any, tensor: Any, async_op: bool) -> Work | None:
        self.calls.append(("_all_gather_into", type(output).__name__))
        return super().all_gather_into(output, tensor, async_op)

    def isend(self, tensor: Any, dst: int, tag: int) -> Work:
        self.calls.append(("_isend", dst, tag))
        return super().isend(tensor, dst, tag)

    def irecv(self, tensor: Any, src: int | None, tag: int) -> Work:
        self.calls.append(("_irecv", src, tag))
        return super().irecv(tensor, src, tag)


def on_defaults(fn: Callable[[BaseCommunicator], T], world_size: int = 2) -> list[T]:
    """``fn(comm)`` on every rank of a world of thread-ranks over :class:`Recording` engines
    (backend ``defaults``; the engine's ``calls``: ``comm.engine.calls``)."""

    def body() -> T:
        base = distcomm.get_communicator()
        assert isinstance(base, BaseCommunicator) and isinstance(base.engine, FakeLinkEngine)
        comm = BaseCommunicator(
            Recording(base.engine.fabric, 1000),  # a communicator of the run's fabric of its own
            backend="defaults",  # (the run's is uid 0)
            capabilities=KIT_ONLY,
            rank=base.rank,
            world_size=base.world_size,
            launch=base.launch,
            timeout=10.0,
        )
        comm.debug = "off"  # the mismatch check's own all-reduce would show in calls
        return fn(comm)

    return run_threads(body, world_size, timeout=60)


def test_the_defaults_are_the_base_classes() -> None:
    """A communicator's optional operations are the kit's defaults where its engine has none,
    else the engine's own."""
    launch = LaunchInfo("single_node", 0, 1, 0, 1, 0, 1)
    reduced = world(Fabric(1), launch, engine=Recording)
    native = world(Fabric(1), launch)
    for name in DEFAULTED:
        assert getattr(reduced, name).__func__ is getattr(Defaults, name), name
        assert getattr(native, name).__self__ is native.engine, name
        assert getattr(native, name).__func__ is not getattr(Defaults, name), name


@pytest.mark.parametrize("async_op", [False, True], ids=["blocking", "async"])
def test_reduce_all_reduces_a_scratch_copy_off_the_destination(async_op: bool) -> None:
    def body(comm: BaseCommunicator) -> tuple[list[float], list[Any]]:
        data = np.array([comm.rank + 1.0, 10.0 * (comm.rank + 1)])
        work = comm.reduce(data, dst=1, op="max", async_op=async_op)
        if async_op:
            assert work is not None and work.wait()
        return data.tolist(), comm.engine.calls

    (data0, calls0), (data1, calls1) = on_defaults(body)
    assert data1 == [2.0, 20.0], "dst gets the reduction"
    assert data0 == [1.0, 10.0], "the others keep their data: the default reduces a copy"
    assert calls0 == calls1 == ["_all_reduce"]


@pytest.mark.parametrize("async_op", [False, True], ids=["blocking", "async"])
def test_reduce_scatter_keeps_this_ranks_chunk_of_an_all_reduce(async_op: bool) -> None:
    def body(comm: BaseCommunicator) -> tuple[list[int], list[int], list[Any]]:
        data = np.arange(6, dtype=np.int64) + 100 * comm.rank  # rank r: 100r, ..., 100r + 5
        out = np.zeros(2, dtype=np.int64)
        work = comm.reduce_scatter_tensor(out, data, async_op=async_op)
        if async_op:
            assert work is not None and work.wait()
        return out.tolist(), data.tolist(), comm.engine.calls

    results = on_defaults(body, 3)
    # the sum of the three ranks' inputs: 300 + 3i for element i; rank r gets elements 2r, 2r + 1
    assert [out for out, _, _ in results] == [[300, 303], [306, 309], [312, 315]]
    for rank, (_, data, calls) in enumerate(results):
        assert data == [100 * rank + i for i in range(6)], "the input is left alone"
        assert calls == ["_all_reduce"]


@pytest.mark.parametrize("async_op", [False, True], ids=["blocking", "async"])
def test_gather_is_an_all_gather(async_op: bool) -> None:
    def body(comm: BaseCommunicator) -> tuple[Any, list[Any]]:
        mine = np.full(2, comm.rank, dtype=np.int32)
        parts = [np.zeros(2, dtype=np.int32) for _ in range(3)] if comm.rank == 2 else None
        work = comm.gather(mine, parts, dst=2, async_op=async_op)
        if async_op:
            assert work is not None and work.wait()
        return None if parts is None else [p.tolist() for p in parts], comm.engine.calls

    results = on_defaults(body, 3)
    assert [parts for parts, _ in results] == [None, None, [[0, 0], [1, 1], [2, 2]]]
    assert all(calls == [("_all_gather_into", "ndarray")] for _, calls in results)


@pytest.mark.parametrize("async_op", [False, True], ids=["blocking", "async"])
def test_scatter_broadcasts_the_whole_and_keeps_a_slice(async_op: bool) -> None:
    def body(comm: BaseCommunicator) -> tuple[list[float], list[Any]]:
        out = np.zeros(2)
        parts = [np.full(2, 10.0 * r) for r in range(3)] if comm.rank == 0 else None
        work = comm.scatter(out, parts, src=0, async_op=async_op)
        if async_op:
            assert work is not None and work.wait()
        return out.tolist(), comm.engine.calls

    results = on_defaults(body, 3)
    assert [out for out, _ in results] == [[0.0, 0.0], [10.0, 10.0], [20.0, 20.0]]
    assert all(calls == ["_broadcast"] for _, calls in results)


@pytest.mark.parametrize("async_op", [False, True], ids=["blocking", "async"])
def test_all_to_all_is_point_to_point_on_the_internal_tag(async_op: bool) -> None:
    def body(comm: BaseCommunicator) -> tuple[list[int], list[Any]]:
        data = np.array([10 * comm.rank + r for r in range(3)], dtype=np.int64)  # chunk r to r
        out = np.full(3, -1, dtype=np.int64)
        work = comm.all_to_all_single(out, data, async_op=async_op)
        if async_op:
            assert work is not None and work.wait()
        return out.tolist(), comm.engine.calls

    results = on_defaults(body, 3)
    for rank, (out, calls) in enumerate(results):
        assert out == [10 * s + rank for s in range(3)], f"rank {rank}: one chunk from each"
        peers = [r for r in range(3) if r != rank]
        assert sorted(calls) == sorted(
            [("_irecv", r, INTERNAL_TAG) for r in peers]
            + [("_isend", r, INTERNAL_TAG) for r in peers]
        )


def test_barrier_waits_for_every_rank() -> None:
    arrived = threading.Event()

    def body(comm: BaseCommunicator) -> tuple[bool, list[Any]]:
        if comm.rank == 1:
            time.sleep(0.2)
            arrived.set()
            comm.barrier()
            return True, comm.engine.calls
        comm.barrier()
        return arrived.is_set(), comm.engine.calls

    results = on_defaults(body)
    assert results[0][0], "rank 0 left the barrier before rank 1 arrived"
    assert all(calls == [("_all_gather_into", "bytearray")] for _, calls in results)


def test_an_async_default_finishes_its_result_only_when_complete() -> None:
    """The default _reduce_scatter's Work copies the chunk out once the all-reduce completes."""
    started = threading.Event()

    def body(comm: BaseCommunicator) -> list[float]:
        data = np.arange(4.0) + comm.rank
        out = np.full(2, -1.0)
        if comm.rank == 1:
            started.wait(10)  # rank 0 checks its Work before this rank joins
            comm._reduce_scatter(out, data, ReduceOp.SUM, False)
            return out.tolist()
        work = comm._reduce_scatter(out, data, ReduceOp.SUM, True)
        assert work is not None and not work.is_completed()
        assert out.tolist() == [-1.0, -1.0], "nothing is written before the engine completes"
        started.set()
        assert work.wait()
        return out.tolist()

    assert on_defaults(body) == [[1.0, 3.0], [5.0, 7.0]]


def test_adopting_a_foreign_group_is_not_supported_by_default() -> None:
    def body(comm: BaseCommunicator) -> str:
        with pytest.raises(NotSupportedError) as info:
            comm._adopt(object())
        return str(info.value)

    assert (
        on_defaults(body)
        == [
            "the defaults backend cannot use 'object' as a group. HINT: make the group with "
            "distcomm.new_group(ranks) instead."
        ]
        * 2
    )
