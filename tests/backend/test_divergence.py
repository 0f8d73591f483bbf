"""Tests of distcomm._divergence: the first operation where ranks parted, found
from made-up timelines and history dumps (rings that start at #1, rings that have wrapped,
ranks that are behind or ended), and the error that names it."""

from __future__ import annotations

from typing import Any

import pytest

from distcomm._divergence import (
    ENDED,
    Timeline,
    first_divergence,
    mismatch_error,
    timeline,
)


def calls(start: int, *keys: str, ended: bool = False, agreed: int = 0) -> Timeline:
    """A timeline of one call per key, the first at ``start``."""
    runs = [(start + i, key) for i, key in enumerate(keys)]
    return Timeline(runs=runs, end=start + len(keys) - 1, ended=ended, agreed=agreed)


def test_rings_from_1_that_differ_at_the_first_operation() -> None:
    found = first_divergence({0: calls(1, "a", "b"), 1: calls(1, "x", "b")})
    assert found is not None
    assert (found.seq, found.keys, found.exact) == (1, {0: "a", 1: "x"}, True)


def test_rings_that_wrapped_differ_at_the_first_operation_both_hold() -> None:
    # rank 0 holds #10-#15, rank 1 #12-#15 (its ring wrapped further): #12 is the first
    # shared operation, and the first difference; an off-by-one there finds #13 or nothing
    zero = calls(10, "a", "a", "a", "b", "b", "b")
    one = calls(12, "z", "b", "b", "b")
    found = first_divergence({0: zero, 1: one})
    assert found is not None
    assert (found.seq, found.keys) == (12, {0: "a", 1: "z"})
    assert not found.exact  # rank 1 no longer holds #10 and #11: they may have parted earlier


def test_wrapped_rings_known_agreed_up_to_their_start_are_exact() -> None:
    zero = calls(10, "a", "a", "b", agreed=9)
    one = calls(10, "a", "c", "b", agreed=9)
    found = first_divergence({0: zero, 1: one})
    assert found is not None and (found.seq, found.exact) == (11, True)


def test_runs_cover_the_calls_between_their_starts() -> None:
    zero = Timeline(runs=[(1, "a"), (101, "b")], end=150)
    one = Timeline(runs=[(1, "a"), (100, "c")], end=150)
    found = first_divergence({0: zero, 1: one})
    assert found is not None and (found.seq, found.keys) == (100, {0: "a", 1: "c"})
    assert zero.key_at(100) == "a" and zero.key_at(101) == "b" and zero.key_at(151) is None


def test_a_rank_behind_is_no_difference_a_rank_that_ended_is() -> None:
    ahead = calls(1, "a", "a", "a")
    behind = calls(1, "a", "a")
    assert first_divergence({0: ahead, 1: behind}) is None
    ended = calls(1, "a", "a", ended=True)
    found = first_divergence({0: ahead, 1: ended})
    assert found is not None and (found.seq, found.keys) == (3, {0: "a", 1: ENDED})


def test_three_ranks_one_odd_and_one_behind() -> None:
    found = first_divergence(
        {0: calls(1, "a", "a", "b"), 1: calls(1, "a", "a", "c"), 2: calls(1, "a")}
    )
    assert found is not None and (found.seq, found.keys) == (3, {0: "b", 1: "c", 2: None})


def test_one_rank_or_equal_calls_are_no_divergence() -> None:
    assert first_divergence({0: calls(1, "a")}) is None
    assert first_divergence({0: calls(5, "a", "b"), 1: calls(5, "a", "b")}) is None


def dump(seq: int, first: int, runs: list[list[int]], issued: int | None = None) -> dict[str, Any]:
    """A history dump (MismatchCheck.dump's shape) over two known calls: 0 is 4 float32 elements,
    1 is 6."""
    return {
        "ranks": [0, 1],
        "name": "world",
        "seq": seq,
        "op": "all_reduce",
        "agreed": first - 1,
        "issued": seq if issued is None else issued,
        "ended": False,
        "first": first,
        "runs": runs,
        "fps": [111, 222],
        "calls": [
            ["all_reduce", "float32", 4, None, "SUM", "train.py:7", [4]],
            ["all_reduce", "float32", 6, None, "SUM", "train.py:9", [6]],
        ],
    }


def test_a_dump_s_timeline_and_the_error_it_gives() -> None:
    # both ranks agreed up to #100; rank 1 made #101 with 6 elements, then went on to #150
    zero = dump(150, 101, [[0, 50]])
    one = dump(150, 101, [[1, 1], [0, 49]])
    assert timeline(one).key_at(101) == 222 and timeline(one).key_at(102) == 111
    found = first_divergence({0: timeline(zero), 1: timeline(one)})
    assert found is not None and found.seq == 101
    error = mismatch_error("mpi 'world' (2 ranks)", found, {0: zero, 1: one})
    assert error.seq == 101 and error.ran == (101, 150)
    assert [row["numel"] for row in error.table] == [4, 6]
    assert error.table[1]["site"] == "train.py:9"
    text = str(error)
    assert "operation #101" in text and "Operations #101 to #150 ran" in text
    assert "rank 1: all_reduce, shape (6,), float32, 6 elements, op SUM  at train.py:9" in text


@pytest.mark.parametrize(
    ("issued", "said", "ran"),
    [
        (100, "The operation was not run; the communicator can still be used.", None),
        (101, "had already issued it: the communicator can no longer be used.", (101, 101)),
    ],
)
def test_the_error_says_whether_the_operation_ran(
    issued: int, said: str, ran: tuple[int, int] | None
) -> None:
    zero = dump(101, 101, [[0, 1]], issued=issued)
    one = dump(101, 101, [[1, 1]], issued=100)
    found = first_divergence({0: timeline(zero), 1: timeline(one)})
    assert found is not None
    error = mismatch_error("gloo 'world' (2 ranks)", found, {0: zero, 1: one})
    assert said in str(error) and error.ran == ran
