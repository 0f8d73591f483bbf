"""The object collectives' shortcut on MPI (run under ``mpirun -n N pytest --with-mpi``).

Object calls interleaved with all_reduce's own shortcut, past the check points: every result
right, the object calls took their shortcut, and the mismatch check's history is the one a
group with the object shortcut turned off ends with (so an object call interrupts the
all-reduces' run as the pipeline would). A late mismatch between object calls that both took it
is found at the next check point.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import distcomm
from distcomm.backend._pipeline.mismatch_check import SAMPLED_FIRST
from distcomm.backend._pipeline.object_collectives import ObjectCollectives
from distcomm.errors import CollectiveMismatchError

pytestmark = [pytest.mark.mpi, pytest.mark.timeout(120)]
_GATE = ObjectCollectives._object_shortcut


def _program(group: Any, rounds: int) -> tuple[bool, tuple[Any, ...]]:
    rank, world = group.rank, group.world_size
    right = True
    x = np.zeros(4, dtype=np.float32)
    for step in range(rounds):
        x[:] = rank + step
        group.all_reduce(x)
        right &= bool((x == sum(range(world)) + world * step).all())
        root = step % world
        got = group.broadcast_object({"from": rank, "step": step}, src=root)
        right &= got == {"from": root, "step": step}
        group.all_reduce(x)
        right &= group.all_gather_object(rank * step) == [r * step for r in range(world)]
        if step % 9 == 4:  # a large object from the last rank: the slots, then the payloads
            big = np.full(5000, rank, dtype=np.int64) if rank == world - 1 else rank
            got = group.all_gather_object(big)
            right &= bool((got[-1] == world - 1).all()) and got[:-1] == list(range(world - 1))
    h = group._mismatch_check  # None in a world of 1: nothing to check
    state = None if h is None else (h.value(group.seq), h.run_fp, h.run_start, list(h.runs))
    state = state if h is None else (*state, h.follow)
    return right, (group.seq, state)


def test_objects_interleaved_with_all_reduces_take_the_shortcut_and_keep_the_history(
    world: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    taken = [0]

    def counting(self: Any, op: str, root: int | None = None) -> Any:
        went = _GATE(self, op, root)
        taken[0] += went is not None
        return went

    monkeypatch.setattr(ObjectCollectives, "_object_shortcut", lambda *a: None)
    without = _program(distcomm.new_group(range(world.world_size)), 200)
    monkeypatch.setattr(ObjectCollectives, "_object_shortcut", counting)
    shortcut = _program(distcomm.new_group(range(world.world_size)), 200)
    assert without[0] and shortcut[0], "a wrong result"
    if world.world_size > 1:
        # the all-gathers (the broadcasts, whose root changes from step to step after the
        # same all-reduce, are checked first: the pipeline's)
        assert taken[0] > 180, f"only {taken[0]} object calls took the shortcut"
    assert shortcut[1] == without[1], "the history differs from the one without the shortcut"


@pytest.mark.mpi(min_size=2)
def test_a_late_mismatch_between_object_calls_is_found(world: Any) -> None:
    """Past the first check points, object calls in a pattern (all-gather, gather, broadcast);
    then, after a gather, rank 0 all-gathers and the others gather again: both kinds known,
    but neither step was ever made, so every rank confirms its call first and raises
    CollectiveMismatchError naming it; nothing ran, and the group still works."""
    group = distcomm.new_group(range(world.world_size))
    for _ in range(SAMPLED_FIRST + 10):
        group.all_gather_object(group.rank)
        group.gather_object(group.rank, dst=0)
        group.broadcast_object(group.rank, src=0)
    group.all_gather_object(group.rank)
    group.gather_object(group.rank, dst=0)
    odd = group.seq + 1
    with pytest.raises(CollectiveMismatchError) as caught:
        if group.rank == 0:
            group.all_gather_object(group.rank)
        else:
            group.gather_object(group.rank, dst=0)
    assert caught.value.seq == odd, f"mismatch named #{caught.value.seq}, the odd call was #{odd}"
    assert caught.value.ran is None, caught.value
    assert group.all_gather_object(group.rank) == list(range(group.world_size))
    group.finalize()
