"""Tests of distcomm._traces (``distcomm trace DIR``) on made-up flight-recorder dumps: rings that
start at #1 and rings that have wrapped, diverging at the first operation every rank holds."""

from __future__ import annotations

from typing import Any

from distcomm._traces import analyse


def ring(rank: int, ops: dict[int, str], world_size: int = 2) -> dict[str, Any]:
    """A rank's dump: one entry per ``seq: op`` on the world, every one completed."""
    entries = [
        {
            "op": op,
            "seq": seq,
            "group": list(range(world_size)),
            "site": f"train.py:{seq}",
            "issued": 1.0,
            "completed": 2.0,
            "error": None,
        }
        for seq, op in sorted(ops.items())
    ]
    return {"rank": rank, "world_size": world_size, "entries": entries}


def test_rings_from_the_first_operation_diverge_there() -> None:
    lines = analyse(
        {
            0: ring(0, {1: "all_reduce", 2: "barrier"}),
            1: ring(1, {1: "broadcast", 2: "barrier"}),
        }
    )
    said = [line for line in lines if "diverge" in line]
    assert said == [
        "the world: the ranks diverge at operation #1: ranks [0] called all_reduce; rank 1 "
        "called broadcast (train.py:1). The odd rank(s) skipped or added a collective before "
        "this one."
    ], lines


def test_wrapped_rings_diverge_at_the_first_operation_both_hold() -> None:
    # rank 0's ring holds #3-#8, rank 1's #5-#8: they part at #5, the first one both hold
    zero = {seq: "all_reduce" for seq in range(3, 9)}
    one = {5: "broadcast", **{seq: "all_reduce" for seq in range(6, 9)}}
    lines = analyse({0: ring(0, zero), 1: ring(1, one)})
    assert any("diverge at operation #5:" in line for line in lines), lines


def test_equal_rings_and_a_rank_that_stopped_early() -> None:
    same = {seq: "all_reduce" for seq in range(1, 4)}
    assert "the world: every rank called the same 3 operations" in analyse(
        {0: ring(0, same), 1: ring(1, same)}
    )
    lines = analyse({0: ring(0, same), 1: ring(1, {1: "all_reduce", 2: "all_reduce"})})
    assert any("rank 1 stopped early: its last operation was #2" in line for line in lines), lines
