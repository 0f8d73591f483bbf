"""Checks of the mismatch check: ranks that call different collectives (another element count,
dtype, op or root) get :class:`~distcomm.errors.CollectiveMismatchError` on every rank, before
anything runs, and the communicator stays usable; nothing is checked under ``debug="off"``.
Under the default policy nothing slips through either: between its check points, a kind of call
the ranks never agreed on is confirmed before it runs (a communicator's first barrier too), and
so is a call that follows the one before in a way they never agreed on, or after which they
agreed on calls of its op in more than one size; the split tables of uneven all-to-alls that
disagree are named at the next barrier, check point or ``finalize()``, with the operations that
ran after them.

Each check pins its communicator's policy for its own calls (``"check"``, or the default
``"sample"`` on a group of its own, whatever ``DISTCOMM_DEBUG`` says) and restores it. They
need 2 ranks or more; in a world of 1 there is nothing to disagree with.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import distcomm
from distcomm.errors import CollectiveMismatchError, DistcommError
from distcomm.protocol import NonMember
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
def mismatched_split_tables_raise_everywhere() -> None:
    """Rank 0 sends rank 1 a row more than rank 1 expects (an uneven all_to_all_single): every
    rank raises with both ranks' split sizes, before anything is sent."""
    if _skip():
        return
    lib, _ = next(cases(lambda d: d == "float32"))
    world = comm().world_size

    def call(rank: int) -> None:
        sent = [1] * world
        if rank == 0:
            sent[1] = 2
        out = make(lib, "float32", [0.0] * world)
        distcomm.all_to_all_single(out, make(lib, "float32", [1.0] * sum(sent)), [1] * world, sent)

    _mismatch("split tables", call)


def _uneven_rows(group: Any, lib: str, width: int) -> None:
    """An uneven all_to_all_single on ``group`` moving 2 elements to every rank in rows of
    ``width`` (1 or 2): the engine sees the same counts whatever the width, the tables do not."""
    world, rows = group.world_size, 2 // width
    out = make(lib, "float32", [0.0] * 2 * world, (rows * world, width))
    inp = make(lib, "float32", [1.0] * 2 * world, (rows * world, width))
    group.all_to_all_single(out, inp, [rows] * world, [rows] * world)


@check
def the_default_names_split_tables_that_disagreed_between_check_points() -> None:
    """Under the default policy, between its check points, rank 1 moves its uneven all-to-all
    in rows of 1 element where the others use rows of 2: every rank sends and receives 2
    elements a pair (the engine cannot tell), but rank 0 sends rank 1 one row and rank 1
    expects two. The next barrier, the next check point (#1088) and ``finalize()`` each raise
    CollectiveMismatchError on every rank naming that operation (#66) and the ranks' split
    sizes; the group is retired."""
    lib, _ = next(cases(lambda d: d == "float32"))
    for found_by in ("barrier", "check point", "finalize"):
        group = _group_past_the_first_checks()
        if group is None:
            return
        with check_policy("sample", group):
            _uneven_rows(group, lib, 2)  # #65: the tables agree
            _uneven_rows(group, lib, 1 if group.rank == 1 else 2)  # #66: they do not
            t = make(lib, "float32", [0.0])  # stays 0 however often it is summed
            try:
                if found_by == "barrier":
                    group.barrier()
                elif found_by == "check point":
                    while True:  # #67 to #1087 run; #1088, a check point, raises
                        group.all_reduce(t)
                else:
                    group.finalize()
            except CollectiveMismatchError as exc:
                what = f"split tables found at the {found_by}"
                expect(exc.seq == 66, f"{what}: operation #{exc.seq} named, not #66: {exc}")
                expect(exc.ran is not None and exc.ran[0] == 66, f"{what}: ran {exc.ran}")
                expect(len(exc.table) == group.world_size, f"{what}: table {exc.table}")
                expect(
                    "rank 0 sent rank 1 1 rows, rank 1 expected 2" in str(exc)
                    and "HINT" in str(exc),
                    f"{what}: message {exc}",
                )
                expect(found_by != "check point" or group.seq == 1088, f"at #{group.seq}")
            else:
                raise AssertionError(f"rank {group.rank}: the {found_by} did not raise")
            if found_by != "finalize":
                try:
                    group.all_reduce(t)
                except DistcommError:
                    pass
                else:
                    raise AssertionError(f"rank {group.rank}: the group was not retired")
        group.finalize()


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


def _group_past_the_first_checks() -> Any:
    """A new group of every rank whose next collective is not a check point of the default
    policy (its first 64 calls made under ``off``), or None where there is nothing to check: a
    world of 1, or a backend that cannot confirm a call before it runs (no point-to-point
    messages for its votes)."""
    c: Any = comm()
    if _skip() or not getattr(c, "_can_confirm", lambda: False)():
        return None
    group = distcomm.new_group(range(c.world_size))
    assert not isinstance(group, NonMember), "every rank is a member"
    lib, dtype = next(cases(lambda d: d == "int64"))
    with check_policy("off", group):
        for _ in range(64):
            group.all_reduce(make(lib, dtype, [1]))
    return group


@check
def the_default_stops_a_new_call_that_differs() -> None:
    """Under the default policy, between its check points, rank 0 all-reduces 6 elements where
    the others reduce 4, a call none of them made before: every rank raises
    CollectiveMismatchError before the call runs, again when they repeat it (a call refused is
    no call agreed on: never the engine's plan), and the group stays usable."""
    group = _group_past_the_first_checks()
    if group is None:
        return
    lib, _ = next(cases(lambda d: d == "float32"))
    with check_policy("sample", group):
        size = 6 if group.rank == 0 else 4
        for seq in (65, 66):
            _stopped_before_it_ran(
                group, seq, lambda: group.all_reduce(make(lib, "float32", [1.0] * size))
            )
        _still_usable(group, lib)
    group.finalize()


@check
def the_default_stops_a_mismatch_of_calls_made_before() -> None:
    """Under the default policy, between its check points, rank 1 all-reduces with MAX where the
    others use SUM, two calls every rank made before, but never one after the other: each rank's
    call is a step the ranks never made, confirmed before it runs, so every rank raises
    CollectiveMismatchError naming that operation before the engine sees it, and the group stays
    usable."""
    group = _group_past_the_first_checks()
    if group is None:
        return
    lib, _ = next(cases(lambda d: d == "float32"))
    with check_policy("sample", group):
        group.all_reduce(make(lib, "float32", [1.0]))  # #65 and #66: agreed
        group.all_reduce(make(lib, "float32", [1.0]), op="max")
        op = "max" if group.rank == 1 else "sum"
        exc = _stopped_before_it_ran(
            group, 67, lambda: group.all_reduce(make(lib, "float32", [1.0]), op=op)
        )
        expect("op MAX" in str(exc) and "op SUM" in str(exc), f"message {exc}")
        _still_usable(group, lib)
    group.finalize()


def _stopped_before_it_ran(group: Any, seq: int, call: Callable[[], object]) -> Exception:
    """``call()``'s CollectiveMismatchError, naming operation ``seq`` (the group's latest) and
    raised before the call ran; an AssertionError if it was not stopped."""
    try:
        call()
    except CollectiveMismatchError as exc:
        expect(exc.seq == group.seq == seq, f"caught at #{exc.seq} ({group.seq}), not #{seq}")
        expect(exc.ran is None, f"it ran: {exc.ran} ({exc})")
        return exc
    raise AssertionError(f"rank {group.rank}: mismatched call #{seq} was not stopped")


def _still_usable(group: Any, lib: str) -> None:
    """After a stopped mismatch, the group's next all-reduce is right."""
    t = make(lib, "float32", [1.0])
    group.all_reduce(t)
    expect_values(t, [group.world_size], "all_reduce after the stopped mismatch")


@check
def the_default_stops_a_late_mismatch_where_sizes_vary() -> None:
    """Under the default policy, all-reduces whose sizes vary in a pattern (3, 5, 3, 8 elements
    in turn: a call of 3 is followed by calls of two sizes), every size and step agreed on
    long before: between check points, rank 1 passes 8 elements where 5 follow the 3 (#69),
    and later 3 again where 8 follow (#71), calls the engine would get in different sizes
    from different ranks (ending the process or hanging). Every rank checks such a call
    before it runs: every rank raises CollectiveMismatchError naming both calls, and the group
    stays usable."""
    c: Any = comm()
    if _skip():
        return
    group = distcomm.new_group(range(c.world_size))
    assert not isinstance(group, NonMember), "every rank is a member"
    lib, _ = next(cases(lambda d: d == "float32"))
    pattern = [3, 5, 3, 8]
    odd = {69: 8, 71: 3}  # rank 1's sizes there
    with check_policy("sample", group):
        for seq in range(1, 81):
            size = odd.get(seq, pattern[seq % 4]) if group.rank == 1 else pattern[seq % 4]
            t = make(lib, "float32", [1.0] * size)
            try:
                group.all_reduce(t)
            except CollectiveMismatchError as exc:
                what = f"rank {group.rank}, operation #{seq}"
                expect(seq in odd, f"{what}: a mismatch where the calls agree: {exc}")
                expect(exc.seq == seq, f"{what}: named operation #{exc.seq}")
                expect(exc.ran is None, f"{what}: it ran: {exc.ran} ({exc})")
                expect(len(exc.table) == group.world_size, f"{what}: table {exc.table}")
                named = (f"{pattern[seq % 4]} elements", f"{odd.get(seq)} elements")
                expect(all(n in str(exc) for n in named), f"{what}: both calls not named: {exc}")
            else:
                expect(seq not in odd, f"rank {group.rank}: mismatched #{seq} was not stopped")
                expect_values(t, [float(group.world_size)] * size, f"all_reduce #{seq}")
    group.finalize()
