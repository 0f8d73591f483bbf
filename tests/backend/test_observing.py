"""Tests of the hook point (distcomm.add_hook), on fakelink thread-ranks and a world of 1.

The conformance topic ``debugging`` checks on every backend that a hook sees each public call
once; here are the rules around it: what it costs when nothing is registered, nesting, errors,
a hook that raises, removal, and the plans (bypassed while hooks are registered).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import distcomm
from distcomm.backend import BaseCommunicator, CallKind, NotPlanned
from distcomm.backend._pipeline import observing
from distcomm.errors import CollectiveMismatchError, InvalidArgumentError
from distcomm.fakelink import Fabric, FakeLinkCommunicator
from distcomm.testing import run_threads

PLAIN = {name: getattr(BaseCommunicator, name) for name in observing.OBSERVED}


def mine(seen: list[Any]) -> dict[str, Any]:
    """Hooks recording the events of this thread's communicator (hooks see every thread's)."""
    comm = distcomm.get_communicator()

    def before(e: distcomm.CollectiveEvent) -> None:
        if e.group is comm:
            seen.append(("before", e.op, e.seq))

    def after(e: distcomm.CollectiveEvent) -> None:
        if e.group is comm:
            seen.append(("after", e.op, type(e.error).__name__ if e.error else None))

    return {"before": before, "after": after}


def test_nothing_registered_leaves_the_plain_methods() -> None:
    assert all(getattr(BaseCommunicator, n) is f for n, f in PLAIN.items())
    assert BaseCommunicator._kit_observing is False
    with distcomm.add_hook(before=lambda e: None):
        assert BaseCommunicator._kit_observing is True
        assert BaseCommunicator.all_reduce is not PLAIN["all_reduce"]
    assert all(getattr(BaseCommunicator, n) is f for n, f in PLAIN.items())
    assert BaseCommunicator._kit_observing is False


def test_every_public_collective_is_seen_once_with_its_metadata() -> None:
    def body() -> list[Any]:
        seen: list[Any] = []
        events: list[distcomm.CollectiveEvent] = []
        comm = distcomm.get_communicator()
        hooks = mine(seen)
        with (
            distcomm.add_hook(**hooks),
            distcomm.add_hook(after=lambda e: events.append(e) if e.group is comm else None),
        ):
            x = np.arange(6, dtype=np.float32).reshape(2, 3)
            distcomm.all_reduce(x, op="max")
            distcomm.reduce(x, dst=1)
            distcomm.broadcast(x, src=1)
            out = [np.empty((2, 3), np.float32) for _ in range(2)]
            distcomm.all_gather(out, x)
            work = distcomm.all_gather_into_tensor(np.empty(12, np.float32), x, async_op=True)
            work.wait()
            distcomm.all_gather_object({"a": np.ones(1000)})  # two engine calls inside
            distcomm.all_reduce(3)  # a Python number: an object all-gather inside
            distcomm.barrier()
            group = distcomm.new_group([0, 1])  # not a collective the hooks see
            group.barrier()
        first = events[0]
        assert (first.shape, first.numel, first.dtype, first.device) == (
            (2, 3),
            6,
            "float32",
            "cpu",
        )
        assert first.reduce_op == "MAX" and first.root is None and first.error is None
        assert events[1].root == 1 and events[2].root == 1
        assert events[4].result is work and first.finished >= first.started > 0
        return seen

    seen = run_threads(body, 2)[0]
    ops = [op for kind, op, _ in seen if kind == "before"]
    assert ops == [
        "all_reduce",
        "reduce",
        "broadcast",
        "all_gather",
        "all_gather_into_tensor",
        "all_gather_object",
        "all_reduce",
        "barrier",
    ]  # the group's barrier is on another communicator
    assert [s for k, _, s in seen if k == "before"] == list(range(1, 9))
    assert [k for k, _, _ in seen] == ["before", "after"] * 8


def test_a_mismatch_is_seen_with_its_error_and_a_before_hook_can_stop_a_call() -> None:
    def body() -> list[Any]:
        seen: list[Any] = []
        with distcomm.add_hook(**mine(seen)):
            x = np.ones(3 if distcomm.get_rank() == 0 else 2)
            with pytest.raises(CollectiveMismatchError):
                distcomm.all_reduce(x)
        comm = distcomm.get_communicator()

        def refuse(e: distcomm.CollectiveEvent) -> None:
            if e.group is comm:
                raise RuntimeError("not now")

        start = comm.seq
        with (
            distcomm.add_hook(**mine(seen)),
            distcomm.add_hook(before=refuse),
            pytest.raises(RuntimeError, match="not now"),
        ):
            distcomm.barrier()
        assert comm.seq == start  # not run: its number is given back
        distcomm.barrier()
        return seen

    for seen in run_threads(body, 2):
        assert seen == [
            ("before", "all_reduce", 1),
            ("after", "all_reduce", "CollectiveMismatchError"),
            ("before", "barrier", 2),
            ("after", "barrier", "RuntimeError"),
        ]


def test_hooks_run_in_order_and_after_hooks_in_reverse() -> None:
    order: list[str] = []
    with (
        distcomm.add_hook(before=lambda e: order.append("b1"), after=lambda e: order.append("a1")),
        distcomm.add_hook(before=lambda e: order.append("b2"), after=lambda e: order.append("a2")),
    ):
        run_threads(lambda: distcomm.barrier(), 1)
    assert order == ["b1", "b2", "a2", "a1"]


def test_plans_are_bypassed_while_hooks_are_registered() -> None:
    runs: list[Any] = []

    class Planned(FakeLinkCommunicator):
        def _plan(self, kind: CallKind) -> Callable[[Any, Any], None]:
            def run(x: Any, y: Any) -> None:
                runs.append(x)
                raise NotPlanned  # nothing moved: the general pipeline runs

            return run

    fabric = Fabric(1)
    launch = distcomm.LaunchInfo("single_node", 0, 1, 0, 1, 0, 1)
    comm = Planned(fabric, 0, rank=0, world_size=1, launch=launch)
    comm.debug = "off"  # plans are for unchecked calls
    comm.world_of_one_shortcut = False  # a world of 1 that calls its engine, and plans
    comm.all_reduce(np.ones(1))  # the pipeline's: the kind learned, its plan asked for
    comm.all_reduce(np.ones(1))
    assert len(runs) == 1
    seen: list[str] = []
    with distcomm.add_hook(before=lambda e: seen.append(e.op)):
        comm.all_reduce(np.ones(1))
    assert len(runs) == 1 and seen == ["all_reduce"]
    comm.all_reduce(np.ones(1))  # the hook removed: the plan again
    assert len(runs) == 2 and seen == ["all_reduce"]


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [({}, "give before=, after= or both"), ({"before": 3}, "before=3 is not callable")],
)
def test_bad_hooks_are_refused(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(InvalidArgumentError, match=match):
        distcomm.add_hook(**kwargs)


def test_remove_is_idempotent() -> None:
    handle = distcomm.add_hook(after=lambda e: None)
    handle.remove()
    handle.remove()
    assert BaseCommunicator._kit_observing is False
