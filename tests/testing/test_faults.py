"""distcomm.testing.faults: a user's unit test reproduces a hang or a mismatch in milliseconds."""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import pytest

import distcomm
from distcomm.errors import (
    CollectiveMismatchError,
    DistTimeoutError,
    InvalidArgumentError,
    RankFailedError,
)
from distcomm.testing import faults, run_threads


def steps(n: int = 5) -> list[float]:
    """What a training loop does: n all_reduces of 4 elements."""
    x = np.ones(4)
    for _ in range(n):
        x = np.ones(4)
        distcomm.all_reduce(x)
    return x.tolist()


def failure(fault: faults.Fault, world: int = 4) -> tuple[RankFailedError, float]:
    start = time.monotonic()
    with pytest.raises(RankFailedError) as info:
        run_threads(steps, world, timeout=30, faults=[fault])
    return info.value, time.monotonic() - start


def test_resize_makes_every_rank_raise_the_mismatch() -> None:
    error, took = failure(faults.resize(rank=2, at=3))
    assert "CollectiveMismatchError" in error.traceback and took < 5
    assert "rank 2: all_reduce, shape (5,), float64, 5 elements" in error.traceback
    assert "collective mismatch at operation #3" in error.traceback


def test_skip_ends_at_once_naming_the_rank_that_left() -> None:
    error, took = failure(faults.skip(rank=1, at=2))
    assert took < 5  # not the run's 30 s timeout: every rank left waits and none can go on
    lines = error.traceback.strip().splitlines()
    first = next(i for i, line in enumerate(lines) if line.startswith("distcomm.errors."))
    assert lines[first].startswith("distcomm.errors.DistTimeoutError: all_reduce (operation #5)")
    assert "ranks that had not arrived: [1]" in lines[first]
    assert "returned without calling it" in lines[first]
    assert lines[first + 2 : first + 4] == [
        "  rank 1:",
        "    (no Python frame: the thread has ended)",
    ], "the stack of a rank that returned"


def test_raise_at_fails_that_rank_with_the_given_error() -> None:
    error, _ = failure(faults.raise_at(rank=3, at=4, error=KeyError("batch 17")))
    assert error.rank == 3 and "KeyError: 'batch 17'" in error.traceback


def test_delay_makes_a_slow_rank_and_the_result_is_right() -> None:
    start = time.monotonic()
    results = run_threads(steps, 2, faults=[faults.delay(rank=1, seconds=0.1)])
    assert results == [[2.0] * 4] * 2
    assert time.monotonic() - start >= 0.5  # 0.1 s before each of the 5 collectives


def test_a_skipped_call_returns_at_once_and_fires_once() -> None:
    def body() -> tuple[str, str, int]:
        work = distcomm.all_reduce(np.ones(1), async_op=True)  # skipped: a completed Work
        x = np.ones(1)
        distcomm.all_reduce(x)  # the same seq again: the fault fired already
        return type(work).__name__, str(work.is_completed()), distcomm.get_communicator().seq

    assert run_threads(body, 1, faults=[faults.skip(rank=0, at=1)]) == [
        ("CompletedWork", "True", 1)
    ]


def test_a_user_asserts_on_the_mismatch_inside_the_ranks() -> None:
    def body() -> str:
        with pytest.raises(CollectiveMismatchError) as info:
            steps(3)
        return info.value.op or ""

    assert run_threads(body, 2, faults=[faults.resize(rank=0, at=2, by=-1)]) == ["all_reduce"] * 2


def test_timeout_error_type_for_a_skip() -> None:
    def body() -> str:
        try:
            steps(2)
        except DistTimeoutError as exc:
            return f"timeout {exc.missing_ranks}"
        return "done"

    assert run_threads(body, 2, faults=[faults.skip(rank=0, at=1)]) == ["done", "timeout (0,)"]


@pytest.mark.parametrize(
    ("make", "match"),
    [
        (lambda: faults.skip(rank=-1, at=1), "rank=-1 must be a rank"),
        (lambda: faults.skip(rank=0, at=0), "at=0 must be a collective's sequence number"),
        (lambda: faults.delay(rank=0, seconds=-1), "seconds=-1 must be a number >= 0"),
        (lambda: faults.raise_at(rank=0, at=1, error="boom"), "must be an exception instance"),
        (lambda: faults.resize(rank=0, at=1, by=0), "by=0 must be a non-zero int"),
        (lambda: run_threads(steps, 2, faults=[faults.skip(rank=2, at=1)]), "valid: 0..1"),
        (lambda: run_threads(steps, 2, faults=["skip"]), "is not a fault"),
    ],
)
def test_bad_faults_are_refused(make: Any, match: str) -> None:
    with pytest.raises((InvalidArgumentError, RankFailedError), match=match):
        make()


# -- the example of docs/testing.md, as it is there ----------------------------------------------
def train_step(steps: int = 3) -> None:
    for _ in range(steps):
        grads = np.ones(4)
        distcomm.all_reduce(grads)


def test_a_larger_batch_on_one_rank_is_a_mismatch_on_every_rank() -> None:
    def rank() -> tuple[Any, list[Any]]:
        with pytest.raises(distcomm.CollectiveMismatchError) as info:
            train_step()
        return info.value.seq, [row["numel"] for row in info.value.table]

    got = run_threads(rank, 4, faults=[faults.resize(rank=2, at=2)])
    assert got == [(2, [4, 4, 5, 4])] * 4


def test_a_skipped_collective_ends_at_once_naming_the_rank() -> None:
    def rank() -> Any:
        try:
            train_step()
        except distcomm.DistTimeoutError as exc:
            return exc.missing_ranks
        return "done"

    got = run_threads(rank, 2, faults=[faults.skip(rank=1, at=3)])
    assert got == [(1,), "done"]
