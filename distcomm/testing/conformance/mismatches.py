"""Checks of the mismatch check: ranks that call different collectives (another element count,
dtype, op or root) get :class:`~distcomm.errors.CollectiveMismatchError` on every rank, before
anything runs, and the communicator stays usable; nothing is checked under ``debug="off"``.

Each check switches its communicator's policy to ``"check"`` for its own calls (the default
samples by sequence number) and restores it. They need 2 ranks or more; in a world of 1 there
is nothing to disagree with.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import distcomm
from distcomm.errors import CollectiveMismatchError
from distcomm.testing.conformance.registry import check
from distcomm.testing.conformance.support import (
    cases,
    check_policy,
    comm,
    expect,
    expect_values,
    make,
)


def _mismatch(what: str, call: Callable[[int], object]) -> None:
    """``call(rank)`` differs on rank 0: every rank raises CollectiveMismatchError with the
    table; then an all_reduce still gives the right sum."""
    c: Any = comm()
    rank, world = c.rank, c.world_size
    with check_policy("check"):
        try:
            call(rank)
        except CollectiveMismatchError as exc:
            table = exc.table
            expect(len(table) == world, f"{what}: a table of {len(table)} rows for {world} ranks")
            expect(exc.seq == c.seq and bool(exc.op), f"{what}: op/seq {exc.op!r}/{exc.seq}")
            expect("HINT" in str(exc) and "rank 0:" in str(exc), f"{what}: message {exc}")
        else:
            raise AssertionError(f"{what}: rank {rank} returned instead of raising a mismatch")
    lib, dtype = next(cases(lambda d: d == "int64"))
    t = make(lib, dtype, [rank + 1])
    distcomm.all_reduce(t)
    expect_values(t, [world * (world + 1) // 2], f"{what}: all_reduce after the mismatch")


def _skip() -> bool:
    c: Any = comm()
    return c.world_size < 2 or not hasattr(c, "debug")


@check
def mismatched_sizes_raise_everywhere() -> None:
    """Rank 0 all-reduces 6 elements, the others 4."""
    if _skip():
        return
    lib, _ = next(cases(lambda d: d == "float32"))
    _mismatch(
        "sizes",
        lambda r: distcomm.all_reduce(make(lib, "float32", [1.0] * (6 if r == 0 else 4))),
    )


@check
def mismatched_dtypes_raise_everywhere() -> None:
    """Rank 0 broadcasts float32, the others int32, of the same element count."""
    if _skip():
        return
    lib, _ = next(cases(lambda d: d == "float32"))
    _mismatch(
        "dtypes",
        lambda r: distcomm.broadcast(make(lib, "float32" if r == 0 else "int32", [1, 2]), src=0),
    )


@check
def mismatched_ops_raise_everywhere() -> None:
    """Rank 0 broadcasts while the others all-reduce."""
    if _skip():
        return
    lib, _ = next(cases(lambda d: d == "float32"))

    def call(r: int) -> object:
        t = make(lib, "float32", [1.0, 2.0])
        return distcomm.broadcast(t, src=0) if r == 0 else distcomm.all_reduce(t)

    _mismatch("ops", call)


@check
def mismatched_roots_raise_everywhere() -> None:
    """Rank 0 broadcasts from rank 1, the others from rank 0."""
    if _skip():
        return
    lib, _ = next(cases(lambda d: d == "float32"))
    _mismatch(
        "roots",
        lambda r: distcomm.broadcast(make(lib, "float32", [1.0]), src=1 if r == 0 else 0),
    )


@check
def nothing_is_checked_when_off() -> None:
    """Under ``off`` a checked-looking call makes no extra engine call: seq moves by one per
    collective and matching calls work as ever."""
    if _skip():
        return
    lib, dtype = next(cases(lambda d: d == "int64"))
    with check_policy("off") as c:
        start = c.seq
        t = make(lib, dtype, [1])
        distcomm.all_reduce(t)
        expect(c.seq == start + 1, f"seq moved from {start} to {c.seq}")
        expect_values(t, [c.world_size], "all_reduce under off")
