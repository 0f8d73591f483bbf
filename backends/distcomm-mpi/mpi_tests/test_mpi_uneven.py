"""The uneven all-to-all inside a real MPI job (``mpirun -n N pytest --with-mpi``): past the first
check points a blocking call like the ones before it takes the shortcut straight to
``Alltoallv`` (counted here), with the right rows for each dtype and library, tables that change
every call, zero-row chunks and rows to itself; and a disagreement between check points is named
at the next barrier on every rank."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import distcomm
from distcomm.backend import BaseCommunicator
from distcomm.errors import CollectiveMismatchError, DistcommError
from distcomm.protocol import Communicator

pytestmark = pytest.mark.mpi


def _group_past_the_first_checks(world: Communicator) -> Any:
    """A new group of every rank whose next collective is no check point of the default policy."""
    group: Any = distcomm.new_group(range(world.world_size))
    group.debug = "off"
    for _ in range(64):
        group.all_reduce(np.zeros(1))
    group.debug = "sample"
    return group


def _rows(rank: int, world: int, step: int) -> list[int]:
    return [(2 * rank + s + step) % 4 for s in range(world)]


def _make(lib: str, dtype: str, rows: int) -> Any:
    values = np.zeros((rows, 3), dtype=dtype)
    if lib == "torch":
        import torch

        return torch.from_numpy(values)
    return values


@pytest.mark.parametrize("dtype", ["float32", "int64", "int8"])
@pytest.mark.parametrize("lib", ["numpy", "torch"])
def test_calls_past_the_first_checks_take_the_shortcut(
    world: Communicator, lib: str, dtype: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    taken = []
    shortcut = BaseCommunicator._uneven_planned
    monkeypatch.setattr(
        BaseCommunicator, "_uneven_planned", lambda *a: taken.append(shortcut(*a)) or taken[-1]
    )
    group = _group_past_the_first_checks(world)
    rank, size = group.rank, group.world_size
    wrong = []
    for step in range(12):
        sent = _rows(rank, size, step)
        expected = [_rows(s, size, step)[rank] for s in range(size)]
        inp = _make(lib, dtype, sum(sent))
        at = 0
        for s, n in enumerate(sent):  # rows for rank s hold 10 * rank + s
            inp[at : at + n] = 10 * rank + s
            at += n
        out = _make(lib, dtype, sum(expected))
        group.all_to_all_single(out, inp, expected, sent)
        want = [10 * s + rank for s in range(size) for _ in range(3 * expected[s])]
        if np.asarray(out).reshape(-1).tolist() != want:
            wrong.append(step)
    group.finalize()
    assert not wrong, f"rank {rank}: wrong rows at steps {wrong}"
    # every call asks for the shortcut: the first of its class and dtype is refused it (the
    # pipeline takes it, starts the run and remembers its kind), and so is the second, its
    # first repeat (a step the ranks confirm once); the 10 after them take it; a world of 1
    # answers every call locally, without the engine, and learns no kind: refused
    want = [False] * 2 + [True] * 10 if size > 1 else [False] * 12
    assert taken == want, f"rank {rank}: shortcut outcomes {taken}"


@pytest.mark.mpi(min_size=2)
def test_tables_that_disagree_between_check_points_are_named_at_the_barrier(
    world: Communicator,
) -> None:
    """Rank 1 moves its rows one element wide once: the engine sees the same counts (no MPI
    error), the tables disagree. Every rank's barrier names the call."""
    group = _group_past_the_first_checks(world)
    size = group.world_size
    for step in range(3):
        width = 1 if (group.rank == 1 and step == 1) else 2
        rows = [2 // width] * size
        out = np.zeros((sum(rows), width), np.float32)
        group.all_to_all_single(out, np.ones((sum(rows), width), np.float32), rows, rows)
    with pytest.raises(CollectiveMismatchError) as caught:
        group.barrier()
    assert caught.value.seq == 66, str(caught.value)
    assert caught.value.ran == (66, 67), str(caught.value)
    assert "rank 0 sent rank 1 1 rows, rank 1 expected 2" in str(caught.value)
    with pytest.raises(DistcommError):
        group.all_reduce(np.zeros(1))
    group.finalize()
