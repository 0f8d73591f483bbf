"""Tests of the hook point (distcomm.add_hook), on fakelink thread-ranks and a world of 1.

The conformance topic ``debugging`` checks on every backend that a hook sees each public call
once; here are the rules around it: registering a hook changes no class, nesting, errors, a
hook that raises, removal, and the plans (which run the hooks, and hand a declined call's event
to the pipeline).
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
from distcomm.fakelink import Fabric, FakeLinkEngine, world
from distcomm.testing import run_threads


def classes_state() -> list[dict[str, Any]]:
    """Every attribute of BaseCommunicator's classes (their own, not inherited)."""
    return [dict(vars(cls)) for cls in BaseCommunicator.__mro__]


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


def test_registering_a_hook_changes_no_class() -> None:
    before = classes_state()
    with distcomm.add_hook(before=lambda e: None, after=lambda e: None):
        assert classes_state() == before, "add_hook rebound something on a class"
        assert observing.registered
    assert classes_state() == before
    assert not observing.registered


def test_every_observed_collective_passes_the_hook_point() -> None:
    """Each observed method, or its pipeline past the plan, is wrapped by observing.observed."""
    for name in observing.OBSERVED:
        public = getattr(BaseCommunicator, name)
        steps = getattr(BaseCommunicator, f"_{name}_steps", None)
        wrapped = public if steps is None else steps
        assert getattr(wrapped, "__wrapped__", None) is not None, f"{name} is not observed"


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


def planned_world(decline: bool, runs: list[Any]) -> BaseCommunicator:
    """A world of 1 that calls its engine and whose plan records each call (and moves it:
    a world of 1 has nothing to move), or declines it (NotPlanned: the pipeline moves it)."""

    class Planned(FakeLinkEngine):
        def plan(self, kind: CallKind) -> Callable[[Any, Any], None]:
            def run(x: Any, y: Any) -> None:
                runs.append(x)
                if decline:
                    raise NotPlanned

            return run

    launch = distcomm.LaunchInfo("single_node", 0, 1, 0, 1, 0, 1)
    comm = world(Fabric(1), launch, engine=Planned)
    comm.debug = "off"  # plans are for unchecked calls
    comm.world_of_one_shortcut = False  # a world of 1 that calls its engine, and plans
    comm.all_reduce(np.ones(1))  # the pipeline's: the kind learned, its plan asked for
    return comm


def test_a_planned_call_runs_the_hooks_once() -> None:
    runs: list[Any] = []
    comm = planned_world(False, runs)
    seen: list[Any] = []
    with distcomm.add_hook(
        before=lambda e: seen.append(("before", e.op, e.seq, e.shape, e.reduce_op)),
        after=lambda e: seen.append(("after", e.op, e.seq, e.error)),
    ):
        comm.all_reduce(np.ones(1))
    assert len(runs) == 1, "the plan did not run with a hook registered"
    assert seen == [("before", "all_reduce", 2, (1,), "SUM"), ("after", "all_reduce", 2, None)]
    assert comm._event is None


def test_a_declined_plan_hands_its_event_to_the_pipeline() -> None:
    runs: list[Any] = []
    comm = planned_world(True, runs)
    seen: list[Any] = []
    with distcomm.add_hook(
        before=lambda e: seen.append(("before", e.seq)),
        after=lambda e: seen.append(("after", e.seq, e.error)),
    ):
        comm.all_reduce(np.ones(1))
    assert len(runs) == 1  # the plan ran and declined it: the pipeline moved it
    assert seen == [("before", 2), ("after", 2, None)], "the hooks saw the call other than once"
    assert comm.seq == 2 and comm._event is None


def test_a_hook_refusing_a_planned_call_gives_its_number_back() -> None:
    runs: list[Any] = []
    comm = planned_world(False, runs)
    errors: list[Any] = []

    def refuse(e: distcomm.CollectiveEvent) -> None:
        raise RuntimeError("not now")

    with (
        distcomm.add_hook(before=refuse, after=lambda e: errors.append(e.error)),
        pytest.raises(RuntimeError, match="not now"),
    ):
        comm.all_reduce(np.ones(1))
    assert runs == [] and comm.seq == 1, "a refused call ran or kept its number"
    assert [type(e).__name__ for e in errors] == ["RuntimeError"]
    comm.all_reduce(np.ones(1))
    assert len(runs) == 1 and comm.seq == 2 and comm._event is None


def test_a_planned_call_inside_an_observed_one_is_seen_once() -> None:
    """reduce_scatter (observed as a whole) runs reduce_scatter_tensor inside, whose kind has
    a plan: the hooks see each reduce_scatter once (the plan is left to the pipeline there)."""
    runs: list[Any] = []
    comm = planned_world(False, runs)
    comm.reduce_scatter(np.zeros(1), [np.ones(1)])  # its inner kind learned, its plan asked for
    seen: list[Any] = []
    with distcomm.add_hook(
        before=lambda e: seen.append(("before", e.op, e.seq)),
        after=lambda e: seen.append(("after", e.op, e.seq)),
    ):
        for _ in range(3):
            comm.reduce_scatter(np.zeros(1), [np.ones(1)])
    # (numbered, as on the pipeline, by the call inside: its op is reduce_scatter_tensor)
    want = [(w, "reduce_scatter_tensor", n) for n in (3, 4, 5) for w in ("before", "after")]
    assert seen == want, f"the hooks saw {seen}"
    assert comm.seq == 5 and comm._event is None


def test_a_hook_removed_after_a_plan_declined_leaves_no_event_behind() -> None:
    runs: list[Any] = []
    comm = planned_world(True, runs)
    seen: list[Any] = []
    handle: Any = None

    def once(e: distcomm.CollectiveEvent) -> None:
        seen.append((e.op, e.seq))
        handle.remove()  # a one-shot hook: gone before the pipeline takes the declined call

    handle = distcomm.add_hook(before=once)
    comm.all_reduce(np.ones(1))
    assert seen == [("all_reduce", 2)] and comm._event is None, comm._event
    later: list[Any] = []
    with distcomm.add_hook(before=lambda e: later.append((e.op, e.seq))):
        comm.broadcast(np.ones(1), 0)
    assert later == [("broadcast", 3)], f"a stale event was reused: {later}"


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
    assert not observing.registered
