"""The uneven all-to-all between check points: its shortcut (taken, right, refused where it must
be) and the ledger of split tables settled at the next check point, on fakelink thread-ranks."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

import distcomm
from distcomm.backend._pipeline import routing_ledger
from distcomm.backend._pipeline.mismatch_check import SAMPLED_FIRST
from distcomm.testing import run_threads


def _past_the_first_checks(comm: Any) -> None:
    """Move ``comm`` past the first check points of the default policy."""
    while comm.seq < SAMPLED_FIRST:
        distcomm.all_reduce(np.zeros(1))


def _counting(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """Count the shortcut's outcomes and the calls that reached the pipeline's steps."""
    counts = {"shortcut": 0, "refused": 0, "steps": 0}
    shortcut, steps = (
        distcomm.backend.BaseCommunicator._uneven_planned,
        distcomm.backend.BaseCommunicator._all_to_all_single_steps,
    )

    def counted(self: Any, *args: Any) -> bool:
        taken = shortcut(self, *args)
        counts["shortcut" if taken else "refused"] += 1
        return taken

    def counted_steps(self: Any, *args: Any, **kwargs: Any) -> Any:
        counts["steps"] += 1
        return steps(self, *args, **kwargs)

    monkeypatch.setattr(distcomm.backend.BaseCommunicator, "_uneven_planned", counted)
    monkeypatch.setattr(
        distcomm.backend.BaseCommunicator, "_all_to_all_single_steps", counted_steps
    )
    return counts


def _rows(rank: int, world: int, step: int) -> list[int]:
    """Rows rank sends each rank at ``step``: they change every step, 0 among them."""
    return [(rank + s + step) % 3 for s in range(world)]


@pytest.mark.parametrize(
    "make",
    [
        lambda n, d: np.zeros((n, 3), dtype=d),
        lambda n, d: torch.zeros((n, 3), dtype=getattr(torch, d)),
    ],
    ids=["numpy", "torch"],
)
@pytest.mark.parametrize("dtype", ["float32", "int64", "float64"])
def test_calls_past_the_first_checks_take_the_shortcut_and_are_right(
    make: Any, dtype: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    counts = _counting(monkeypatch)

    def body() -> list[bool]:
        comm = distcomm.get_communicator()
        rank, world = comm.rank, comm.world_size
        _past_the_first_checks(comm)
        right = []
        for step in range(20):
            sent = _rows(rank, world, step)
            expected = [r for r in (_rows(s, world, step)[rank] for s in range(world))]
            inp = make(sum(sent), dtype)
            for s in range(world):  # the rows for rank s hold 100 * rank + s
                start = sum(sent[:s])
                inp[start : start + sent[s]] = 100 * rank + s
            out = make(sum(expected), dtype) - 1
            distcomm.all_to_all_single(out, inp, expected, sent)
            want = [100 * s + rank for s in range(world) for _ in range(expected[s] * 3)]
            right.append(np.asarray(out).reshape(-1).tolist() == want)
        return right

    for right in run_threads(body, 3):
        assert all(right), f"wrong results at steps {[i for i, ok in enumerate(right) if not ok]}"
    # 20 calls a rank: the first starts the run and the second is its first repeat, a step the
    # ranks confirm once (the pipeline records both); 18 take the shortcut
    assert counts["shortcut"] == 3 * 18, counts
    assert counts["steps"] == 3 * 2, counts


class _NoArray:
    """Not an array, though it has a shape and a dtype (one that is no key: a list)."""

    shape = (2, 2)

    def __init__(self) -> None:
        self.dtype: list[str] = []


@pytest.mark.parametrize(
    ("what", "change"),
    [
        ("a tuple of splits", lambda out, inp, e, s: (out, inp, e, tuple(s))),
        ("numpy ints", lambda out, inp, e, s: (out, inp, e, [np.int64(n) for n in s])),
        ("a transposed input", lambda out, inp, e, s: (out, inp.T.copy().T, e, s)),
        (
            "another dtype",
            lambda out, inp, e, s: (out.astype(np.int32), inp.astype(np.int32), e, s),
        ),
        ("rows that differ", lambda out, inp, e, s: (out.reshape(-1, 1), inp, e, s)),
        ("an input that is no array", lambda out, inp, e, s: (out, _NoArray(), e, s)),
    ],
)
def test_what_needs_more_than_a_look_goes_through_the_pipeline(
    what: str, change: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    counts = _counting(monkeypatch)

    def body() -> str:
        comm = distcomm.get_communicator()
        world = comm.world_size
        _past_the_first_checks(comm)
        out, inp = np.zeros((world, 2), np.float32), np.ones((world, 2), np.float32)
        distcomm.all_to_all_single(out, inp, [1] * world, [1] * world)  # starts the run
        try:
            distcomm.all_to_all_single(*change(out, inp, [1] * world, [1] * world))
        except distcomm.errors.DistcommError as exc:
            return type(exc).__name__
        return "ok"

    outcomes = run_threads(body, 2)
    assert counts["shortcut"] == 0, f"{what}: {counts}"
    assert counts["steps"] == 2 * 2, f"{what}: {counts}"
    if what in ("rows that differ", "an input that is no array"):  # the pipeline explains it
        assert outcomes == ["InvalidArgumentError"] * 2, outcomes
    else:
        assert outcomes == ["ok"] * 2, f"{what}: {outcomes}"


def test_hooks_see_every_call() -> None:
    def body() -> int:
        comm = distcomm.get_communicator()
        _past_the_first_checks(comm)
        seen: list[str] = []
        out, inp = np.zeros((2, 1), np.float32), np.ones((2, 1), np.float32)
        with distcomm.add_hook(before=lambda e: seen.append(e.op) if e.group is comm else None):
            for _ in range(5):
                distcomm.all_to_all_single(out, inp, [1, 1], [1, 1])
        return seen.count("all_to_all_single")

    assert run_threads(body, 2) == [5, 5]


def _balances(tables: list[list[tuple[list[int], list[int]]]]) -> int:
    """The sum of every rank's balance for calls whose (sent, expected) per rank are given."""
    world = len(tables[0])
    total = 0
    for rank in range(world):
        kept = routing_ledger.Ledger(rank, world)
        for seq, call in enumerate(tables, start=100):
            kept.keep(seq, call[rank][0], call[rank][1])
        total += kept.balance()
    return total % ((1 << 61) - 1)


def _call(sent: list[list[int]]) -> list[tuple[list[int], list[int]]]:
    """Every rank's (sent, expected) where the tables agree (``sent[r][s]``: r to s)."""
    world = len(sent)
    return [(sent[r], [sent[s][r] for s in range(world)]) for r in range(world)]


def test_the_balance_cancels_when_the_tables_agree_and_only_then() -> None:
    calls = [_call([[1, 4, 0], [2, 2, 2], [0, 7, 1]]), _call([[3, 0, 1], [5, 5, 0], [1, 1, 1]])]
    assert _balances(calls) == 0
    wrong = [list(map(list, call)) for call in calls]
    wrong[1][2] = ([1, 1, 1], [1, 0, 2])  # rank 2 expects 2 rows from itself, sends itself 1
    assert _balances(wrong) != 0
    # one row too many to a pair in one call and one too few in the next: still shows
    plus = _call([[1, 4, 0], [2, 2, 2], [0, 7, 1]])
    plus[0] = ([1, 5, 0], plus[0][1])
    minus = _call([[1, 4, 0], [2, 2, 2], [0, 7, 1]])
    minus[0] = ([1, 3, 0], minus[0][1])
    assert _balances([plus, minus]) != 0
