"""distcomm.helpers: zero_first, main_process_only, run_on_main, rank_prefixed_message.

At world 1 directly; on 4 fakelink thread-ranks, 4 gloo processes and ``mpirun -n 4`` through
the scenarios below (one world per backend for the whole suite: tests/support/multirank.py). The
fault scenarios raise on one rank on purpose: the others must raise RankFailedError naming it, not
wait (a wait would end the whole world's run at its timeout, failing every test here).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from multirank import caught, outcome, scenario

import distcomm
from distcomm.errors import NotInitializedError

BACKENDS = ["threads", "gloo", "mpirun"]


# -- world of one -------------------------------------------------------------------------------
def test_world_of_one_runs_everything_here() -> None:
    with distcomm.zero_first():
        pass

    @distcomm.main_process_only
    def make() -> dict[str, int]:
        return {"made": 1}

    assert make() == {"made": 1}
    done: list[str] = []
    result = distcomm.run_on_main(
        lambda x: x * 2, args=[21], post_func=done.append, post_args=["post"]
    )
    assert result == 42 and done == []  # post_func runs on the non-main ranks: none here
    distcomm.run_on_main(
        lambda: None, post_func=done.append, post_args=["all"], run_post_on_main=True
    )
    assert done == ["all"]
    assert distcomm.rank_prefixed_message("hi") == "hi"
    distcomm.init(backend="fakelink")
    assert distcomm.rank_prefixed_message("hi") == "[rank: 0] hi"


def test_exceptions_pass_through_at_world_one() -> None:
    with pytest.raises(KeyError), distcomm.zero_first():
        raise KeyError("x")

    @distcomm.main_process_only
    def fails() -> None:
        raise OSError("disk")

    with pytest.raises(OSError, match="disk"):
        fails()


def test_unpicklable_result_is_a_clear_error_on_every_rank() -> None:
    def body() -> tuple[str, Any]:
        @distcomm.main_process_only
        def make() -> Any:
            return lambda: None  # a lambda cannot be pickled

        return caught(make)

    from distcomm.testing import run_threads

    results = run_threads(body, 2, timeout=30)
    assert results[0][0] == "InvalidArgumentError" and "cannot be pickled" in results[0][1]
    assert results[1] == ("RankFailedError", 0)


def test_multi_rank_launch_before_init_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert distcomm.rank_prefixed_message("hi") == "[rank: 1] hi"
    with pytest.raises(NotInitializedError, match=r"call distcomm\.init"), distcomm.zero_first():
        pass


# -- scenarios, on every backend ----------------------------------------------------------------
@scenario
def zero_first_order(workdir: str) -> bool:
    """Main writes a file in its block; the others must find it in theirs."""
    marker = Path(workdir, "zero_first")
    with distcomm.zero_first():
        if distcomm.get_rank() == 0:
            time.sleep(0.2)  # the others would overtake main here if they did not wait
            marker.write_text("ready")
            return True
        return marker.exists()


@scenario
def zero_first_with_is_main(workdir: str) -> bool:
    marker = Path(workdir, "zero_first_last")
    last = distcomm.get_rank() == distcomm.get_world_size() - 1
    with distcomm.zero_first(is_main=last):
        if last:
            time.sleep(0.2)
            marker.write_text("ready")
            return True
        return marker.exists()


@scenario
def zero_first_main_raises(workdir: str) -> tuple[str, Any]:
    def body() -> None:
        with distcomm.zero_first():
            if distcomm.get_rank() == 0:
                raise ValueError("preprocessing failed")

    return caught(body)


@scenario
def main_process_only_result(workdir: str) -> tuple[Any, int]:
    calls = Path(workdir, "main_only_calls")

    @distcomm.main_process_only
    def inner() -> int:  # nested: runs directly on main, no broadcast
        return 2

    @distcomm.main_process_only
    def outer(x: int) -> dict[str, Any]:
        with calls.open("a") as file:
            file.write(f"{distcomm.get_rank()}\n")
        with distcomm.zero_first():  # no one else is here: must not wait
            pass
        return {"x": x * inner(), "rank": distcomm.get_rank()}

    got = outer(21)
    distcomm.barrier()
    return got, len(calls.read_text().splitlines())


@scenario
def main_process_only_raises(workdir: str) -> tuple[str, Any]:
    @distcomm.main_process_only
    def save() -> None:
        raise OSError("no space left")

    return caught(save)


@scenario
def run_on_main_then_post(workdir: str) -> tuple[Any, list[str]]:
    folder = Path(workdir, "run_on_main")

    def prepare(name: str) -> str:
        folder.mkdir()
        (folder / name).write_text("vocabulary")
        return name

    def load(name: str, seen: list[str]) -> None:
        seen.append((folder / name).read_text())

    seen: list[str] = []
    result = distcomm.run_on_main(
        prepare, args=["vocab.txt"], post_func=load, post_args=["vocab.txt", seen]
    )
    also: list[str] = []
    distcomm.run_on_main(
        lambda: None, post_func=also.append, post_args=["all"], run_post_on_main=True
    )
    return result, seen + also


@scenario
def run_on_main_post_raises(workdir: str) -> tuple[str, Any]:
    def post() -> None:
        if distcomm.get_rank() == 2:
            raise FileNotFoundError("vocab.txt")

    return caught(distcomm.run_on_main, lambda: 1, None, None, post)


@scenario
def collectives_in_main_only_regions(workdir: str) -> list[tuple[str, Any]]:
    """A collective inside each kind of main-only region: the guard stops it on main (the
    others learn of it), and a group of main alone, made beforehand, is allowed."""
    import numpy as np

    alone = distcomm.new_group([0])

    @distcomm.main_process_only
    def save() -> None:
        distcomm.all_reduce(np.ones(2))

    @distcomm.main_process_only
    def save_alone() -> float:
        x = np.ones(2)
        distcomm.all_reduce(x, group=alone)
        return float(x[0])

    def in_zero_first() -> None:
        with distcomm.zero_first():
            if distcomm.get_rank() == 0:
                distcomm.broadcast_object("vocab", src=0)

    def guarded(fn: Any, *args: Any) -> tuple[str, Any]:
        kind, detail = caught(fn, *args)
        if kind == "MainOnlyCollectiveError":  # the sites, not the whole message
            detail = detail.split(" was called at ")[1].split(", which only")[0]
        return kind, detail

    return [
        guarded(save),
        guarded(distcomm.run_on_main, distcomm.barrier),
        guarded(in_zero_first),
        guarded(save_alone),
    ]


@scenario
def prefixed_message(workdir: str) -> str:
    return distcomm.rank_prefixed_message("hello")


@pytest.mark.parametrize("backend", BACKENDS)
def test_zero_first_runs_main_first(backend: str, scenario_worlds: Any) -> None:
    results = scenario_worlds(backend)
    assert results[outcome(zero_first_order)] == [True] * 4
    assert results[outcome(zero_first_with_is_main)] == [True] * 4


@pytest.mark.parametrize("backend", BACKENDS)
def test_main_process_only_shares_main_result(backend: str, scenario_worlds: Any) -> None:
    results = scenario_worlds(backend)[outcome(main_process_only_result)]
    assert results == [({"x": 42, "rank": 0}, 1)] * 4  # ran once, on rank 0


@pytest.mark.parametrize("backend", BACKENDS)
def test_run_on_main_runs_post_after_main(backend: str, scenario_worlds: Any) -> None:
    results = scenario_worlds(backend)[outcome(run_on_main_then_post)]
    assert results[0] == ("vocab.txt", ["all"])  # post_func not on main, unless asked
    assert results[1:] == [("vocab.txt", ["vocabulary", "all"])] * 3


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_raise_on_one_rank_ends_the_others(backend: str, scenario_worlds: Any) -> None:
    results = scenario_worlds(backend)
    assert results[outcome(zero_first_main_raises)] == [
        ("ValueError", "preprocessing failed"),
        *[("RankFailedError", 0)] * 3,
    ]
    assert results[outcome(main_process_only_raises)] == [
        ("OSError", "no space left"),
        *[("RankFailedError", 0)] * 3,
    ]
    post = results[outcome(run_on_main_post_raises)]
    assert post[2] == ("FileNotFoundError", "vocab.txt")
    assert [post[r] for r in (0, 1, 3)] == [("RankFailedError", 2)] * 3


@pytest.mark.parametrize("backend", BACKENDS)
def test_rank_prefixed_message(backend: str, scenario_worlds: Any) -> None:
    results = scenario_worlds(backend)[outcome(prefixed_message)]
    assert results == [f"[rank: {r}] hello" for r in range(4)]


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_collective_in_a_main_only_region_raises_instead_of_hanging(
    backend: str, scenario_worlds: Any
) -> None:
    results = scenario_worlds(backend)[outcome(collectives_in_main_only_regions)]
    here = Path(__file__).name
    save, run_on_main, zero_first, alone = results[0]
    assert save[0] == "MainOnlyCollectiveError"
    assert (
        here in save[1] and "inside main_process_only 'collectives_in_main_only_regions." in save[1]
    )
    assert run_on_main[0] == "MainOnlyCollectiveError"
    assert "inside run_on_main's func 'barrier'" in run_on_main[1]
    assert zero_first[0] == "MainOnlyCollectiveError"
    assert "inside zero_first's block on the main rank (" + str(Path(__file__)) in zero_first[1]
    assert alone == ("ok", 1.0)
    for rank in range(1, 4):
        assert results[rank] == [("RankFailedError", 0)] * 3 + [("ok", 1.0)]


def test_the_guard_is_off_under_debug_off() -> None:
    from distcomm.testing import run_threads

    def body() -> str:
        distcomm.get_communicator().debug = "off"

        @distcomm.main_process_only
        def save() -> None:
            distcomm.barrier()  # meets the others' broadcast of main's result: the engine says so

        kind, _ = caught(save)
        return kind

    kinds = run_threads(body, 2)
    assert "MainOnlyCollectiveError" not in kinds and kinds != ["ok", "ok"]
