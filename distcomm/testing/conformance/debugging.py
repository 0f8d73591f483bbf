"""Checks of the debugging aids: the default sample of the mismatch check, the hook point, the
main-only guard and ``assert_same``, on every backend.

They need 2 ranks or more (in a world of 1 there is nothing to disagree with), except the hook
point, which is checked at any size.
"""

from __future__ import annotations

from typing import Any

import distcomm
from distcomm.errors import (
    CollectiveMismatchError,
    MainOnlyCollectiveError,
    NotSameError,
    RankFailedError,
)
from distcomm.testing.conformance.registry import check
from distcomm.testing.conformance.support import (
    cases,
    check_policy,
    comm,
    expect,
    expect_values,
    make,
)


def _multi() -> bool:
    c: Any = comm()
    return c.world_size > 1 and hasattr(c, "debug")


@check
def the_default_checks_64_plus_1024k() -> None:
    """Under the default policy, a size mismatch at collective 64 + 1024 k (the next such
    ``seq``) is caught; the calls before it run unchecked, under ``off``."""
    if not _multi():
        return
    lib, _ = next(cases(lambda d: d == "float32"))
    with check_policy("off") as c:
        target = 64 + 1024 * max(1, -(-(c.seq + 1 - 64) // 1024))
        while c.seq < target - 1:
            distcomm.barrier()
    with check_policy("sample") as c:
        try:
            distcomm.all_reduce(make(lib, "float32", [1.0] * (3 if c.rank == 0 else 2)))
        except CollectiveMismatchError as exc:
            expect(exc.seq == target, f"the mismatch was caught at #{exc.seq}, not #{target}")
        else:
            raise AssertionError(f"rank {c.rank}: the mismatch at #{target} was not caught")


@check
def hooks_see_each_public_call_once() -> None:
    """A hook sees every public collective once, with its metadata, and nothing of distcomm's
    own traffic (an object collective's two engine calls, the check's all-reduce)."""
    c: Any = comm()
    lib, dtype = next(cases(lambda d: d == "float32"))
    seen: list[tuple[str, str, Any]] = []

    def before(e: Any) -> None:
        if e.group is c:  # hooks see every communicator of the process (thread-ranks too)
            seen.append(("before", e.op, (e.seq, e.numel, e.dtype, e.root)))

    def after(e: Any) -> None:
        if e.group is c:
            seen.append(("after", e.op, e.error))

    with check_policy("check"), distcomm.add_hook(before=before, after=after):
        start = c.seq
        distcomm.all_reduce(make(lib, dtype, [1.0, 2.0]))
        distcomm.broadcast_object({"step": 1}, src=c.world_size - 1)
        distcomm.barrier()
    expect(
        seen
        == [
            ("before", "all_reduce", (start + 1, 2, dtype, None)),
            ("after", "all_reduce", None),
            ("before", "broadcast_object", (start + 2, None, None, c.world_size - 1)),
            ("after", "broadcast_object", None),
            ("before", "barrier", (start + 3, None, None, None)),
            ("after", "barrier", None),
        ],
        f"the hooks saw {seen}",
    )
    t = make(lib, dtype, [1.0])
    distcomm.all_reduce(t)  # removed: nothing more is seen
    expect(len(seen) == 6, f"a removed hook still saw {seen[6:]}")


@check
def a_collective_in_main_process_only_raises() -> None:
    """A collective inside ``main_process_only`` raises MainOnlyCollectiveError on main, naming
    the call and the region, and RankFailedError on the others, instead of hanging; the
    communicator still works.

    The guard is on unless the policy is ``"off"`` (``DISTCOMM_DEBUG=off`` turns it off), so the
    check pins ``"check"`` for its calls, whatever the environment says.
    """
    if not _multi():
        return
    c: Any = comm()
    lib, dtype = next(cases(lambda d: d == "int64"))

    @distcomm.main_process_only
    def save() -> None:
        distcomm.all_reduce(make(lib, dtype, [1]))

    with check_policy("check"):
        try:
            save()
        except MainOnlyCollectiveError as exc:
            expect(c.rank == 0, f"rank {c.rank} raised the guard's error; only main runs save")
            expect("main_process_only" in exc.region and ":" in exc.site, f"message {exc}")
        except RankFailedError as exc:
            expect(c.rank != 0 and exc.rank == 0, f"rank {c.rank}: RankFailedError of {exc.rank}")
        else:
            raise AssertionError(f"rank {c.rank}: the collective inside main_process_only ran")
    t = make(lib, dtype, [c.rank + 1])
    distcomm.all_reduce(t)
    expect_values(t, [c.world_size * (c.world_size + 1) // 2], "all_reduce after the guard")


@check
def assert_same_names_the_differing_key() -> None:
    """``assert_same`` passes on equal state_dicts and, when the last rank's one key differs,
    raises NotSameError on every rank naming that rank and key."""
    if not _multi():
        return
    c: Any = comm()
    lib, dtype = next(cases(lambda d: d == "float32"))
    last = c.world_size - 1
    state = {"layer.weight": make(lib, dtype, [1.0, 2.0]), "layer.bias": make(lib, dtype, [0.5])}
    distcomm.assert_same(state, what="weights")
    if c.rank == last:
        state["layer.bias"] = make(lib, dtype, [0.25])
    try:
        distcomm.assert_same(state, what="weights")
    except NotSameError as exc:
        expect(exc.ranks == [last], f"ranks {exc.ranks}, expected [{last}]")
        expect(exc.keys == ["['layer.bias']"], f"keys {exc.keys}")
        expect("weights" in str(exc) and "layer.bias" in str(exc), f"message {exc}")
    else:
        raise AssertionError(f"rank {c.rank}: assert_same passed on different state_dicts")
