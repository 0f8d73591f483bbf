"""The store's side of a timeout on gloo and nccl (distcomm_torch.progress): "where are you?"
asked and answered through a real torch store (HashStore, in this process; whole jobs:
tests/processes/test_straggler_stacks.py). A rank answers from the monitor thread, only while
it has entered no collective for 2 s (or half its timeout) or one of its communicators failed,
and stops asking a store that failed."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import torch.distributed as dist
from distcomm_torch.progress import StoreProgress

from distcomm.backend import monitor, stacks


class World:
    """What the answering rank's StoreProgress needs of its world communicator."""

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        self._thread = threading.get_ident()  # the thread that uses it (the kit's name)


def sleep_in_the_data_loader(release: threading.Event) -> None:
    release.wait(30)


@pytest.fixture
def late_rank() -> Iterator[tuple[StoreProgress, Any, World]]:
    """Rank 1 answering over a HashStore from a thread asleep in ``sleep_in_the_data_loader``;
    the store and rank 0's StoreProgress."""
    store = dist.HashStore()
    release = threading.Event()
    made: list[World] = []
    ready = threading.Event()

    def rank_1() -> None:
        made.append(World(timeout=0.0))
        ready.set()
        sleep_in_the_data_loader(release)

    thread = threading.Thread(target=rank_1, daemon=True)
    thread.start()
    ready.wait(10)
    answering = StoreProgress(store, 1)
    answering.answer_for(made[0])
    yield StoreProgress(store, 0), store, made[0]
    answering.release(made[0])
    release.set()
    thread.join(10)


def test_a_late_rank_answers_with_where_it_sleeps(late_rank: Any) -> None:
    asking, _, _ = late_rank
    answers = asking.where({3: 1})
    assert list(answers) == [3], "answers come back under the member's rank"
    where = stacks.split(answers[3])[0]  # the stack (the rank's calls follow it)
    assert "in sleep_in_the_data_loader\n" in where
    assert where.rstrip().endswith("release.wait(30)")


def test_two_ranks_asking_at_once_both_get_the_answer(late_rank: Any) -> None:
    asking, store, _ = late_rank
    other = StoreProgress(store, 2)
    results: list[dict[int, str] | None] = []
    askers = [
        threading.Thread(target=lambda p=p: results.append(p.where({1: 1})))
        for p in (asking, other)
    ]
    for thread in askers:
        thread.start()
    for thread in askers:
        thread.join(30)
    assert len(results) == 2 and all(r and "sleep_in_the_data_loader" in r[1] for r in results), (
        results
    )


def test_a_busy_rank_does_not_read_the_store() -> None:
    store = dist.HashStore()
    busy = StoreProgress(store, 1)
    world = World(timeout=3600.0)
    busy.answer_for(world)
    try:
        busy.active(time.monotonic())
        assert StoreProgress(store, 0).where({1: 1}) == {}, "answered although busy"
    finally:
        busy.release(world)


class Broken:
    """A store whose server is gone."""

    def __init__(self) -> None:
        self.calls = 0

    def add(self, key: str, value: int) -> int:
        self.calls += 1
        raise RuntimeError("Broken pipe")


def test_a_rank_stops_asking_a_store_that_failed() -> None:
    store = Broken()
    progress = StoreProgress(store, 1)
    world = World(timeout=0.0)
    progress.answer_for(world)
    deadline = time.monotonic() + 10
    while store.calls == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(4 * monitor.interval())
    assert store.calls == 1, "the monitor kept asking a store that had failed"
    assert StoreProgress(store, 0).where({1: 1}) is None, "a store that fails: unknown"  # type: ignore[arg-type]


def test_rank_0_leaving_stops_the_listening_ranks_before_its_server_goes(late_rank: Any) -> None:
    """Rank 0's process serves the store: when it leaves it says so, and waits for the ranks
    that read the store (idle ones) to stop, so that none sends a request to a dead server."""
    asking, store, _ = late_rank
    deadline = time.monotonic() + 10
    while int(store.add("distcomm/where/listening", 0)) < 1 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert int(store.add("distcomm/where/listening", 0)) == 1, "the idle rank is not listening"
    world = World(timeout=3600.0)
    asking.answer_for(world)
    start = time.monotonic()
    asking.release(world)
    assert int(store.add("distcomm/where/listening", 0)) == 0, "rank 0 left before the others"
    assert time.monotonic() - start < 2 * monitor.interval() + 1
    assert StoreProgress(store, 2).where({1: 1}) == {}, "a rank answered after rank 0 left"


@pytest.fixture
def exiting() -> Iterator[None]:
    """The process's exit as distcomm's atexit handler sees it (``monitor.stop``), undone."""
    yield
    monitor._stopping.clear()  # this test process goes on: helpers run again


def test_at_exit_no_store_read_is_left_running(exiting: None) -> None:
    """A "where are you?" still waiting for an answer when the program ends (a rank that left
    its last vote while its lookout asked) stops at exit, and the exit waits for it: a thread
    that comes back from torch's C++ store while Python finalises aborts the process
    ("terminate called without an active exception")."""
    progress = StoreProgress(dist.HashStore(), 0)
    asked: list[Any] = []
    asking = threading.Thread(target=lambda: asked.append(progress.where({1: 7})))
    asking.start()  # rank 7 never answers: the question waits a few monitor ticks
    time.sleep(0.3)
    start = time.monotonic()
    monitor.stop()  # what atexit calls
    stopped = time.monotonic() - start
    readers = [t.name for t in threading.enumerate() if t.name == "distcomm-store-read"]
    assert not readers, "a store read still runs when the interpreter finalises"
    assert stopped < 1.0, f"the exit waited {stopped:.2f} s for a question that stops at once"
    asking.join(10)
    assert asked == [{}], asked
