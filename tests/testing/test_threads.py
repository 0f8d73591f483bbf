"""Tests of distcomm.testing.run_threads: thread-ranks of one fakelink world."""

from __future__ import annotations

import threading
from typing import Any

import pytest

import distcomm
from distcomm.errors import DistTimeoutError, InvalidArgumentError, RankFailedError
from distcomm.testing import run_threads


def test_results_come_back_in_rank_order() -> None:
    def fn(scale: int, offset: int) -> tuple[int, int]:
        return distcomm.get_rank() * scale + offset, distcomm.get_world_size()

    assert run_threads(fn, 4, 10, 1) == [(1, 4), (11, 4), (21, 4), (31, 4)]


def test_each_thread_is_its_own_rank_of_one_world() -> None:
    def fn() -> tuple[int, list[int], str | None]:
        gathered = distcomm.all_gather_object(distcomm.get_rank())
        return distcomm.get_communicator().rank, gathered, distcomm.get_backend()

    assert run_threads(fn, 3) == [(r, [0, 1, 2], "fakelink") for r in range(3)]


@pytest.mark.timeout(30)
def test_a_failing_rank_ends_the_run_and_releases_the_others() -> None:
    ranks: dict[int, threading.Thread] = {}

    def fn() -> None:
        ranks[distcomm.get_rank()] = threading.current_thread()
        if distcomm.get_rank() == 2:
            raise ValueError("rank two gives up")
        distcomm.barrier()

    with pytest.raises(RankFailedError) as info:
        run_threads(fn, 4, timeout=60)
    assert info.value.rank == 2
    assert "ValueError: rank two gives up" in info.value.traceback
    assert "rank 2 of 4 failed" in str(info.value)
    assert "failed too" not in str(info.value)
    for thread in ranks.values():
        thread.join(timeout=30)
    assert sorted(ranks) == [0, 1, 2, 3]
    assert not any(thread.is_alive() for thread in ranks.values()), (
        "a rank stayed blocked in barrier()"
    )


@pytest.mark.timeout(30)
def test_ranks_that_only_wrap_the_abort_are_not_reported() -> None:
    def fn() -> None:
        if distcomm.get_rank() == 1:
            raise KeyError("the real failure")
        try:
            distcomm.all_reduce(1)
        except Exception as exc:
            raise RuntimeError("wrapped by the caller") from exc

    with pytest.raises(RankFailedError) as info:
        run_threads(fn, 3, timeout=60)
    assert info.value.rank == 1
    assert "the real failure" in info.value.traceback
    assert "failed too" not in str(info.value)


def test_ranks_failing_on_their_own_are_all_named() -> None:
    def fn() -> None:
        raise ValueError(f"rank {distcomm.get_rank()}")

    with pytest.raises(RankFailedError, match=r"failed too") as info:
        run_threads(fn, 3)
    assert info.value.rank in (0, 1, 2)


@pytest.mark.timeout(30)
def test_a_run_past_its_timeout_names_the_unfinished_ranks() -> None:
    release = threading.Event()
    threads: dict[int, threading.Thread] = {}

    def fn() -> None:
        threads[distcomm.get_rank()] = threading.current_thread()
        if distcomm.get_rank() == 2:
            release.wait()  # stuck outside distcomm
        elif distcomm.get_rank() == 1:
            distcomm.barrier()  # stuck inside distcomm: the timeout's abort releases it

    try:
        with pytest.raises(DistTimeoutError) as info:
            run_threads(fn, 3, timeout=0.5)
    finally:
        release.set()
    assert info.value.missing_ranks is not None
    assert 2 in info.value.missing_ranks
    assert 0 not in info.value.missing_ranks
    assert "did not finish" in str(info.value)
    assert "release.wait()" in str(info.value), "the message does not show where rank 2 is stuck"
    threads[1].join(timeout=30)
    assert not threads[1].is_alive(), "the rank in barrier() was not released by the timeout"


def test_init_returns_the_thread_communicator_and_finalize_is_a_no_op() -> None:
    def fn() -> tuple[bool, bool, bool, tuple[int, int]]:
        comm = distcomm.get_communicator()
        same = distcomm.init() is comm
        distcomm.finalize()
        still = distcomm.is_initialized() and distcomm.get_communicator() is comm
        pair = distcomm.dist_init()
        distcomm.dist_finalize()
        after = distcomm.all_reduce(1) == distcomm.get_world_size()
        return same, still, after, pair

    assert run_threads(fn, 2) == [(True, True, True, (r, 2)) for r in range(2)]
    assert not distcomm.is_initialized(), "run_threads leaked its world into the main thread"


def test_init_with_other_arguments_inside_a_thread_is_refused() -> None:
    def fn() -> None:
        distcomm.init(backend="gloo")

    with pytest.raises(RankFailedError, match="AlreadyInitializedError"):
        run_threads(fn, 2)


@pytest.mark.parametrize("world_size", [0, -1, True, 2.0, "2", None])
def test_world_size_must_be_a_positive_int(world_size: Any) -> None:
    with pytest.raises(InvalidArgumentError, match="world_size"):
        run_threads(lambda: None, world_size)


def test_fn_must_be_callable() -> None:
    with pytest.raises(InvalidArgumentError, match="callable"):
        run_threads("not a function", 2)  # type: ignore[arg-type]


@pytest.mark.timeout(30)
def test_mismatched_collectives_raise_instead_of_hanging() -> None:
    import numpy as np

    def fn() -> None:
        t = np.ones(3)
        if distcomm.get_rank() == 0:
            distcomm.all_reduce(t)
        else:
            distcomm.broadcast(t, src=0)

    with pytest.raises(RankFailedError, match="collective mismatch") as info:
        run_threads(fn, 2, timeout=60)
    assert "all_reduce" in str(info.value) and "broadcast" in str(info.value)


def test_a_world_of_one_runs_in_a_thread() -> None:
    assert run_threads(lambda: (distcomm.get_rank(), distcomm.is_distributed()), 1) == [(0, False)]
