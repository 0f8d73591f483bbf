"""The object collectives' shortcut (:mod:`distcomm.backend._pipeline.object_collectives`) on
fakelink thread-ranks.

A call of a kind (op, root) the pipeline took before skips the kit's steps past the check
points. Proven here: it is taken, with right results, for small objects, large ones, and a mix
of both across ranks (the all-gather then goes on as the pipeline does); the mismatch check's
history ends exactly as it does with the shortcut turned off; hooks see every call, numbered,
and the shortcut is still taken under them; a bad root is the pipeline's error; a late mismatch
between two object collectives that took it is found at the next check point.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import pytest

import distcomm
from distcomm.backend._pipeline.mismatch_check import SAMPLE_EVERY, SAMPLED_FIRST
from distcomm.backend._pipeline.object_collectives import ObjectCollectives
from distcomm.errors import CollectiveMismatchError, InvalidArgumentError
from distcomm.testing import run_threads

#: Rounds of the long program: past the first check point after the first 64 calls.
ROUNDS = 300
_GATE = ObjectCollectives._object_shortcut


@contextmanager
def counted(monkeypatch: pytest.MonkeyPatch, off: bool = False) -> Iterator[list[int]]:
    """Count the calls that took the shortcut (``off``: refuse every one)."""
    taken = [0]
    real = _GATE

    def gate(self: Any, op: str, root: int | None = None) -> Any:
        if off:
            return None
        went = real(self, op, root)
        taken[0] += went is not None
        return went

    monkeypatch.setattr(ObjectCollectives, "_object_shortcut", gate)
    yield taken


def payload(rank: int, step: int) -> Any:
    """Small on most steps; large (out-of-band buffers, more than a slot) on every 7th step
    for rank 1 only, so that an all-gather mixes both."""
    if step % 7 == 3 and rank == 1:
        return {"rank": rank, "step": step, "big": np.full(3000, rank + step, dtype=np.int64)}
    return {"rank": rank, "step": step}


def same(a: Any, b: Any) -> bool:
    if isinstance(a, dict) and "big" in a:
        return (
            a.keys() == b.keys() and bool((a["big"] == b["big"]).all()) and a["step"] == b["step"]
        )
    return bool(a == b)


def program() -> tuple[bool, tuple[Any, ...]]:
    """Every object collective in turn, roots changing, results checked; the history's state."""
    comm: Any = distcomm.get_communicator()
    rank, world = comm.rank, comm.world_size
    right = True
    for step in range(ROUNDS):
        root = step % world
        mine = payload(rank, step)
        got = distcomm.broadcast_object(mine, src=root)
        right &= same(got, payload(root, step))
        everyone = distcomm.all_gather_object(mine)
        right &= all(same(everyone[r], payload(r, step)) for r in range(world))
        gathered = distcomm.gather_object(mine, dst=root)
        if rank == root:
            right &= all(same(gathered[r], payload(r, step)) for r in range(world))
        else:
            right &= gathered is None
        parts = [payload(r, step) for r in range(world)] if rank == root else None
        right &= same(distcomm.scatter_object(parts, src=root), payload(rank, step))
    h = comm._mismatch_check
    return right, (comm.seq, h.value(comm.seq), h.run_fp, h.run_start, list(h.runs), h.follow)


def test_the_shortcut_is_taken_with_right_results_and_the_same_history(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with counted(monkeypatch, off=True):
        without = run_threads(program, 3)
    with counted(monkeypatch) as taken:
        with_shortcut = run_threads(program, 3)
    assert all(right for right, _ in without + with_shortcut), "a wrong object"
    # not the gather_object after each all_gather_object: three roots follow that in turn, so
    # the ranks check each before it runs (a quarter of the calls), nor the first 64
    assert taken[0] > 3 * 4 * ROUNDS * 0.7, f"only {taken[0]} calls took the shortcut"
    for (_, state), (_, plain) in zip(with_shortcut, without, strict=True):
        assert state == plain, "the history differs from the one without the shortcut"


def test_hooks_see_every_object_call(monkeypatch: pytest.MonkeyPatch) -> None:
    def body() -> tuple[list[Any], int]:
        comm = distcomm.get_communicator()
        for _ in range(SAMPLED_FIRST + 10):
            distcomm.broadcast_object("x")
        start = comm.seq
        seen: list[Any] = []
        with distcomm.add_hook(
            before=lambda e: seen.append(("before", e.op, e.seq)) if e.group is comm else None,
            after=lambda e: seen.append(("after", e.op, e.result)) if e.group is comm else None,
        ):
            for _ in range(20):
                distcomm.broadcast_object("x")
                distcomm.all_gather_object("y")
        return seen, start

    with counted(monkeypatch) as taken:
        results = run_threads(body, 2)
    for seen, start in results:
        want: list[Any] = []
        for i in range(20):
            want += [("before", "broadcast_object", start + 2 * i + 1)]
            want += [("after", "broadcast_object", "x")]
            want += [("before", "all_gather_object", start + 2 * i + 2)]
            want += [("after", "all_gather_object", ["y", "y"])]
        assert seen == want, f"the hooks saw {seen[:6]}..."
    # the first 64 calls are checked: the 10 after them take the shortcut, and the 40 under the
    # hook but two (all_gather_object's first is the pipeline's: a new kind; the broadcast
    # after it, a step the ranks never made, is confirmed once)
    assert taken[0] == 2 * (10 + 38), f"expected 48 shortcuts per rank, got {taken[0] / 2}"


@pytest.mark.parametrize("src", [5, -1, True, "0"])
def test_a_bad_root_past_the_check_points_is_the_pipelines_error(src: Any) -> None:
    def body() -> str:
        for _ in range(SAMPLED_FIRST + 10):
            distcomm.broadcast_object("x", src=0)
        try:
            distcomm.broadcast_object("x", src=src)
        except InvalidArgumentError as exc:
            return str(exc)
        return "no error"

    for message in run_threads(body, 2):
        assert f"src={src!r}" in message and "HINT" in message, message


def test_a_late_mismatch_between_object_calls_is_found_at_the_next_check_point() -> None:
    """Rank 0 calls all_gather_object where the others call gather_object again (both kinds
    known, and their bytes even match): the others' repeat is a step the ranks never made, so
    they confirm it, and every rank names the odd call there."""

    def body() -> tuple[str, int, int]:
        comm: Any = distcomm.get_communicator()
        for _ in range(SAMPLED_FIRST + 10):
            distcomm.all_gather_object(comm.rank)
            distcomm.gather_object(comm.rank, dst=0)
        odd = comm.seq + 1
        try:
            if comm.rank == 0:
                distcomm.all_gather_object(comm.rank)
            else:
                distcomm.gather_object(comm.rank, dst=0)
            while comm.seq < SAMPLED_FIRST + SAMPLE_EVERY + 10:
                distcomm.all_gather_object(comm.rank)
        except CollectiveMismatchError as exc:
            return "mismatch", exc.seq, odd
        return "no mismatch", -1, odd

    for found, at, odd in run_threads(body, 3, timeout=120):
        assert (found, at) == ("mismatch", odd), f"{found} at #{at}, the odd call was #{odd}"
