"""Checks of long runs of calls: past the mismatch check's check points a blocking call like an
earlier one skips the pipeline and takes the backend's shortcut (its ``_broadcast_plain``,
``_all_reduce_plain``, ... where it has them: :mod:`distcomm.backend.primitives`).

The calls interleave the collectives that have shortcuts (gather and scatter with the root's
list as views of one buffer and as arrays of their own), with values that depend on the rank,
the root and the round, so that a shortcut that moves the wrong data, the wrong reduction or
from the wrong root is caught. Where the backend has a shortcut, the check also proves that it
is taken.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import distcomm
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

#: The shortcuts a backend may have (distcomm.backend.primitives).
PLAIN = (
    "_all_reduce_plain",
    "_broadcast_plain",
    "_reduce_plain",
    "_all_gather_into_plain",
    "_reduce_scatter_plain",
    "_all_to_all_plain",
    "_gather_plain",
    "_scatter_plain",
)
N = 4
ROUNDS = 6


def _values(dtype: str, rank: int, round_: int, n: int) -> list[Any]:
    """``n`` small values of ``dtype`` that differ by rank and round (sums stay exact)."""
    vs = [(rank * 5 + round_ * 3 + i) % 11 for i in range(n)]
    return [v + 0.5 for v in vs] if dtype.startswith("float") else vs


@contextmanager
def _counting(c: Any) -> Iterator[dict[str, int]]:
    """Count the calls each of ``c``'s shortcuts took (those it has), restoring them after."""
    taken: dict[str, int] = {}
    saved = {name: c.__dict__.get(name) for name in PLAIN if getattr(c, name, None)}
    for name in saved:
        plain = getattr(c, name)

        def counted(*args: Any, _plain: Callable[..., bool] = plain, _name: str = name) -> bool:
            done = _plain(*args)
            taken[_name] = taken.get(_name, 0) + bool(done)
            return done

        setattr(c, name, counted)
    try:
        yield taken
    finally:
        for name, before in saved.items():
            if before is None:
                delattr(c, name)
            else:
                setattr(c, name, before)


def _round(lib: str, dtype: str, r: int) -> None:
    """One round of every collective that has a shortcut, each result checked."""
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
    then arrays of their own (the shortcuts' two cases); each result checked."""
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
    (policy ``off``) and under the default; each shortcut the backend has is taken."""
    c: Any = comm()
    with _counting(c) as taken, check_policy("off"):
        for lib in libraries():
            for dtype in _dtypes():
                for r in range(ROUNDS):
                    _round(lib, dtype, r)
    with check_policy("sample"):
        for r in range(ROUNDS):
            _round(libraries()[0], _dtypes()[0], r)
    if c.world_size > 1 or not getattr(c, "world_of_one_shortcut", True):
        never = sorted(name for name in PLAIN if getattr(c, name, None) and not taken.get(name))
        expect(not never, f"the backend's shortcuts {never} never took a call: {taken}")
