"""Checks of long runs of calls: past the mismatch check's check points a blocking call of a
kind the pipeline took before skips the pipeline and runs the backend's plan for that kind
(its engine's ``plan``, where it has one: :meth:`distcomm.backend.engine.Engine.plan`).

The calls interleave the collectives that may be planned (gather and scatter with the root's
list as views of one buffer and as arrays of their own), with values that depend on the rank,
the root and the round, so that a plan that moves the wrong data, the wrong reduction or from
the wrong root is caught. Where the backend plans an op, the check also proves that its plans
take calls.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import distcomm
from distcomm.backend import CallKind
from distcomm.testing.conformance.registry import check
from distcomm.testing.conformance.support import (
    check_policy,
    comm,
    empty,
    expect,
    expect_values,
    libraries,
    make,
)

N = 4
ROUNDS = 6


def _values(dtype: str, rank: int, round_: int, n: int) -> list[Any]:
    """``n`` small values of ``dtype`` that differ by rank and round (sums stay exact)."""
    vs = [(rank * 5 + round_ * 3 + i) % 11 for i in range(n)]
    return [v + 0.5 for v in vs] if dtype.startswith("float") else vs


@contextmanager
def _counting(c: Any) -> Iterator[tuple[set[str], dict[str, int]]]:
    """The ops ``c``'s engine gave a plan for (its ``plan`` returned one for a kind of them)
    and the calls each op's plans took (a plan that raised NotPlanned took none), meanwhile.

    The kit reads the engine's ``plan`` when it makes the communicator, into its table of kinds
    (``_plans``); the table asks a counting wrapper of it here (``ask_through``, which forgets
    the kinds, so that the engine is asked again), and the engine's own again on the way out.
    A communicator without that table, or whose engine has no ``plan``, plans nothing."""
    planned: set[str] = set()
    taken: dict[str, int] = {}
    table: Any = getattr(c, "_plans", None)
    engine = getattr(table, "engine_plan", None)
    if engine is None:
        yield planned, taken
        return

    def counting(kind: CallKind) -> Callable[[Any, Any], Any] | None:
        run = engine(kind)
        if run is None:
            return None
        op = kind.op
        planned.add(op)

        def counted(x: Any, y: Any) -> Any:
            result = run(x, y)  # NotPlanned passes: no call taken
            taken[op] = taken.get(op, 0) + 1
            return result

        return counted

    table.ask_through(counting)
    try:
        yield planned, taken
    finally:
        table.ask_through(engine)


def _round(lib: str, dtype: str, r: int) -> None:
    """One round of every collective that may be planned, each result checked."""
    rank, world = distcomm.get_rank(), distcomm.get_world_size()
    root, what = r % world, f"round {r}, {lib} {dtype}"
    every = [_values(dtype, s, r, N * world) for s in range(world)]
    t = make(lib, dtype, _values(dtype, rank, r, N))
    distcomm.all_reduce(t)
    expect_values(
        t, [sum(col) for col in zip(*(e[:N] for e in every), strict=True)], f"all_reduce, {what}"
    )
    t = make(lib, dtype, _values(dtype, rank, r, N))
    distcomm.broadcast(t, root)
    expect_values(t, every[root][:N], f"broadcast from {root}, {what}")
    t = make(lib, dtype, _values(dtype, rank, r, N))
    distcomm.reduce(t, root)
    if rank == root:
        want = [sum(col) for col in zip(*(e[:N] for e in every), strict=True)]
        expect_values(t, want, f"reduce to {root}, {what}")
    out = empty(lib, dtype, (N * world,))
    distcomm.all_gather_into_tensor(out, make(lib, dtype, _values(dtype, rank, r, N)))
    expect_values(out, [v for e in every for v in e[:N]], f"all_gather_into_tensor, {what}")
    out = empty(lib, dtype, (N,))
    distcomm.reduce_scatter_tensor(out, make(lib, dtype, every[rank]))
    mine = [sum(col) for col in zip(*every, strict=True)][rank * N : (rank + 1) * N]
    expect_values(out, mine, f"reduce_scatter_tensor, {what}")
    out = empty(lib, dtype, (N * world,))
    distcomm.all_to_all_single(out, make(lib, dtype, every[rank]))
    got = [v for e in every for v in e[rank * N : (rank + 1) * N]]
    expect_values(out, got, f"all_to_all_single, {what}")
    _rooted(lib, dtype, root, what, every)


def _rooted(lib: str, dtype: str, root: int, what: str, every: list[list[Any]]) -> None:
    """gather to and scatter from ``root``, each twice: the root's list views of one buffer,
    then arrays of their own (the plans' two cases); each result checked."""
    rank, world = distcomm.get_rank(), distcomm.get_world_size()
    for shared in (True, False):
        how = f"{what}, {'views of one buffer' if shared else 'arrays of their own'}"
        parts = _parts(lib, dtype, [[0] * N] * world, shared)
        distcomm.gather(make(lib, dtype, every[rank][:N]), parts if rank == root else None, root)
        if rank == root:
            for s, part in enumerate(parts):
                expect_values(part, every[s][:N], f"gather to {root}, rank {s}'s, {how}")
        chunks = [every[root][s * N : (s + 1) * N] for s in range(world)]
        parts = _parts(lib, dtype, chunks, shared)
        t = empty(lib, dtype, (N,))
        distcomm.scatter(t, parts if rank == root else None, root)
        expect_values(t, chunks[rank], f"scatter from {root}, {how}")


def _parts(lib: str, dtype: str, chunks: list[list[Any]], shared: bool) -> list[Any]:
    """``chunks`` as arrays: views of one buffer (``shared``), or arrays of their own."""
    if not shared:
        return [make(lib, dtype, chunk) for chunk in chunks]
    whole = make(lib, dtype, [v for chunk in chunks for v in chunk])
    n = len(chunks[0])
    return [whole[i * n : (i + 1) * n] for i in range(len(chunks))]


def _dtypes() -> list[str]:
    moved = comm().capabilities.dtypes
    return [d for d in ("float32", "int64") if d in moved] or ["float32"]


@check
def long_runs_of_interleaved_collectives_move_the_right_data() -> None:
    """Rounds of all_reduce, broadcast, reduce, all_gather_into_tensor, reduce_scatter_tensor,
    all_to_all_single, gather and scatter in turn, each result checked, with no check points
    (policy ``off``) and under the default; the plans of each op the backend plans take
    calls."""
    c: Any = comm()
    with _counting(c) as (planned, taken), check_policy("off"):
        for lib in libraries():
            for dtype in _dtypes():
                for r in range(ROUNDS):
                    _round(lib, dtype, r)
    with check_policy("sample"):
        for r in range(ROUNDS):
            _round(libraries()[0], _dtypes()[0], r)
    if c.world_size > 1 or not getattr(c, "world_of_one_shortcut", True):
        never = sorted(op for op in planned if not taken.get(op))
        expect(not never, f"the backend's plans of {never} never took a call: {taken}")
