"""Checks a careless or unlucky user triggers: temporaries handed to async operations with the
garbage collector running, allocation churn while operations are in flight, Works waited out of
order, async operations on bridged dtypes and non-contiguous views, point-to-point messages on
temporaries, and objects of a different size on every rank.

The temporaries checks are deterministic: rank 0 issues its part of each collective only after
every other rank has issued its own, dropped its references, collected garbage and checked
(through a weak reference) that the Work still holds the memory, so the operation cannot have
completed before the check. Backends without asynchronous operations (``capabilities.async_ops``
False) complete each call at once; for them only the results are checked.
"""

from __future__ import annotations

import gc
import time
import weakref
from collections.abc import Callable
from typing import Any

import distcomm
from distcomm.errors import InvalidArgumentError
from distcomm.protocol import Communicator, NonMember, ReduceOp
from distcomm.testing.conformance.registry import check
from distcomm.testing.conformance.support import (
    cases,
    check_policy,
    comm,
    empty,
    expect,
    expect_values,
    has_numpy,
    make,
    p2p_tag,
    pattern,
    raises,
    reduction_input,
    reduction_result,
    values_of,
)

#: Rounds of the churn check: issue several async operations on temporaries, allocate and
#: collect garbage, run a blocking object collective, then wait in another order.
CHURN_ROUNDS = 50

#: What an issuing function returns: the Work of one async collective on temporaries, the
#: temporaries (to be dropped) and a check of the result.
Issued = tuple[Any, list[Any], Callable[[], None]]
#: ``issue(lib, rank, world)`` starts one async collective on temporaries.
Issue = Callable[[str, int, int], Issued]


def _all_reduce(lib: str, rank: int, world: int) -> Issued:
    t = make(lib, "float32", reduction_input(ReduceOp.SUM, "float32", rank, world, 6))
    work = distcomm.all_reduce(t, async_op=True)
    result = reduction_result(ReduceOp.SUM, "float32", world, 6)
    return work, [t], lambda: expect_values(t, result, f"all_reduce {lib} on a temporary")


def _reduce(lib: str, rank: int, world: int) -> Issued:
    t = make(lib, "float32", reduction_input(ReduceOp.SUM, "float32", rank, world, 4096))
    work = distcomm.reduce(t, dst=0, async_op=True)
    result = reduction_result(ReduceOp.SUM, "float32", world, 4096)

    def verify() -> None:
        if rank == 0:
            expect_values(t, result, f"reduce {lib} on a temporary")

    return work, [t], verify


def _broadcast_bridged(lib: str, rank: int, world: int) -> Issued:
    dtype = "bfloat16" if lib == "torch" else "float16"
    t = make(lib, dtype, pattern(dtype, rank, 8))
    work = distcomm.broadcast(t, src=world - 1, async_op=True)
    want = pattern(dtype, world - 1, 8)
    return work, [t], lambda: expect_values(t, want, f"broadcast {lib} {dtype} on a temporary")


def _all_gather_strided(lib: str, rank: int, world: int) -> Issued:
    inp = make(lib, "int32", pattern("int32", rank, 8))[::2]  # a non-contiguous temporary
    out = empty(lib, "int32", (world * 4,))
    work = distcomm.all_gather_into_tensor(out, inp, async_op=True)
    want = [v for r in range(world) for v in pattern("int32", r, 8)[::2]]
    return work, [inp, out], lambda: expect_values(out, want, f"all_gather {lib} of a view")


def _reduce_scatter(lib: str, rank: int, world: int) -> Issued:
    n = 3
    inp = make(lib, "int16", reduction_input(ReduceOp.SUM, "int16", rank, world, n * world))
    out = empty(lib, "int16", (n,))
    work = distcomm.reduce_scatter_tensor(out, inp, async_op=True)
    full = reduction_result(ReduceOp.SUM, "int16", world, n * world)
    want = full[rank * n : (rank + 1) * n]
    return work, [inp, out], lambda: expect_values(out, want, f"reduce_scatter {lib} int16")


def _all_to_all(lib: str, rank: int, world: int) -> Issued:
    inp = make(lib, "int64", [rank * 100 + r for r in range(world)])
    out = empty(lib, "int64", (world,))
    work = distcomm.all_to_all_single(out, inp, async_op=True)
    want = [s * 100 + rank for s in range(world)]
    return work, [inp, out], lambda: expect_values(out, want, f"all_to_all_single {lib}")


def _gather_bool(lib: str, rank: int, world: int) -> Issued:
    mine = make(lib, "bool", pattern("bool", rank, 5))
    parts = [empty(lib, "bool", (5,)) for _ in range(world)] if rank == 0 else None
    work = distcomm.gather(mine, parts, dst=0, async_op=True)

    def verify() -> None:
        if parts is not None:
            got = [values_of(p) for p in parts]
            expect(got == [pattern("bool", r, 5) for r in range(world)], f"gather bool: {got}")

    return work, [mine, *(parts or [])], verify


ISSUES: list[tuple[str, Issue]] = [
    ("all_reduce", _all_reduce),
    ("reduce", _reduce),
    ("broadcast (bridged dtype)", _broadcast_bridged),
    ("all_gather_into_tensor (strided input)", _all_gather_strided),
    ("reduce_scatter_tensor (int16)", _reduce_scatter),
    ("all_to_all_single", _all_to_all),
    ("gather (bool)", _gather_bool),
]


def _still_alive(finished: list[tuple[str, list[weakref.ref[Any]]]]) -> list[str]:
    """The names whose buffers are still alive after a few seconds (an engine's worker thread
    may drop its references a moment after the operation completed)."""
    deadline = time.monotonic() + 5
    while True:
        gc.collect()
        alive = [name for name, refs in finished if any(r() is not None for r in refs)]
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.05)


def _libraries() -> list[str]:
    return sorted({lib for lib, _ in cases()})


def _signal_group() -> Communicator | None:
    """A group of every rank for "every other rank has issued and checked" signals; None where
    operations complete at once (nothing to order), or in a world of 1."""
    c = comm()
    if c.world_size == 1 or not c.capabilities.async_ops:
        return None
    group = distcomm.new_group(range(c.world_size))
    assert not isinstance(group, NonMember), "every rank is a member"
    return group


@check
def async_temporaries_stay_alive() -> None:
    """A Work owns its buffers: temporaries handed to async collectives outlive ``del`` and the
    garbage collector until ``wait()``, results land, and the Work lets them go afterwards."""
    rank, world = distcomm.get_rank(), distcomm.get_world_size()
    signal = _signal_group()
    # Rank 0 issues each operation only after the others issued theirs; the mismatch check,
    # which runs before an operation is issued and waits for every rank, would deadlock that.
    with check_policy("off", signal), check_policy("off"):
        for lib in _libraries():
            _temporaries_of(lib, rank, world, signal)


def _temporaries_of(lib: str, rank: int, world: int, signal: Communicator | None) -> None:
    """One library's pass of :func:`async_temporaries_stay_alive`."""
    finished: list[tuple[str, list[weakref.ref[Any]]]] = []
    for name, issue in ISSUES:
        if signal is not None and rank == 0:
            signal.barrier()  # the others have issued theirs and checked
        work, temporaries, verify = issue(lib, rank, world)
        refs = [weakref.ref(t) for t in temporaries]
        del temporaries
        gc.collect(0)
        if signal is not None and rank != 0:
            alive = [r() is not None for r in refs]
            expect(
                all(alive),
                f"{name} ({lib}): a buffer handed to the async operation was freed before "
                f"wait() (alive: {alive}); the engine would write into freed memory",
            )
            signal.barrier()
        kept = [r() for r in refs]
        expect(work.wait() is True, f"{name}: wait() must return True")
        if all(k is not None for k in kept):
            verify()
        finished.append((name, refs))
        del kept, work, verify
    if signal is not None:
        leaked = _still_alive(finished)
        expect(not leaked, f"{lib}: Works kept their buffers after completing: {leaked}")


@check
def async_churn() -> None:
    """Many rounds of async operations on temporaries, with allocations, garbage collection and
    a blocking object collective between issue and wait, waited in shuffled order."""
    rank, world = distcomm.get_rank(), distcomm.get_world_size()
    lib = _libraries()[0]
    for round_ in range(CHURN_ROUNDS):
        issued = [issue(lib, rank, world) for _, issue in ISSUES]
        churn = [bytearray(64 * (i + round_ % 7)) for i in range(200)]
        seen = distcomm.all_gather_object((rank, round_, len(churn)))
        expect(seen == [(r, round_, 200) for r in range(world)], f"round {round_}: objects {seen}")
        del churn
        gc.collect() if round_ % 10 == 9 else gc.collect(0)
        order = list(range(len(issued)))
        order = order[round_ % len(order) :] + order[: round_ % len(order)]
        for i in reversed(order):
            expect(issued[i][0].wait() is True, f"round {round_}: wait() must return True")
        for _, _, verify in issued:
            verify()


@check
def async_p2p_temporaries() -> None:
    """isend and irecv own their buffers: a temporary sent or received into survives ``del``
    and the garbage collector until the Work completes."""
    c = comm()
    rank, world = c.rank, c.world_size
    if world == 1 or not c.capabilities.p2p:
        return
    signal = _signal_group()
    nxt, prev = (rank + 1) % world, (rank - 1) % world
    for lib in _libraries():
        box = [empty(lib, "float64", (16,))]
        receive = distcomm.irecv(box[0], prev, tag=p2p_tag(71))
        ref = weakref.ref(box[0])
        box.clear()
        gc.collect(0)
        if signal is not None:
            expect(ref() is not None, f"irecv ({lib}): the receive buffer was freed before wait()")
            signal.barrier()  # every receive is posted and checked before anything is sent
        send = distcomm.isend(
            make(lib, "float64", [rank + i / 4 for i in range(16)]), nxt, tag=p2p_tag(71)
        )
        gc.collect(0)
        received = ref()
        expect(receive.wait() is True and send.wait() is True, "p2p wait() must return True")
        if received is not None:
            expect_values(received, [prev + i / 4 for i in range(16)], f"irecv {lib} temporary")
        else:
            expect(False, f"irecv ({lib}): the received tensor is gone at wait()")


@check
def objects_of_different_sizes() -> None:
    """Object collectives where every rank's object has another size (arrays of rank-dependent
    length, nested containers): each rank gets exactly what was sent."""
    rank, world = distcomm.get_rank(), distcomm.get_world_size()

    def obj(r: int) -> Any:
        data: Any = bytes(range(256)) * (r * 37 + 1)
        if has_numpy():
            import numpy

            data = {"a": numpy.arange(r * 1000 + 1, dtype=numpy.float64), "r": r, "b": data}
        return [data, "x" * (r * 13), {"nested": (r,) * r}]

    def same(got: Any, want: Any) -> bool:
        return bool(_plain(got) == _plain(want))

    gathered = distcomm.all_gather_object(obj(rank))
    expect(all(same(gathered[r], obj(r)) for r in range(world)), "all_gather_object sizes")
    for root in range(world):
        got = distcomm.broadcast_object(obj(root) if rank == root else None, src=root)
        expect(same(got, obj(root)), f"broadcast_object from {root}")
        listed = distcomm.gather_object(obj(rank), dst=root)
        if rank == root:
            expect(
                listed is not None and all(same(listed[r], obj(r)) for r in range(world)),
                f"gather_object to {root}",
            )
        mine = distcomm.scatter_object(
            [obj(r + root) for r in range(world)] if rank == root else None, src=root
        )
        expect(same(mine, obj(rank + root)), f"scatter_object from {root}")


def _plain(x: Any) -> Any:
    """``x`` with arrays as lists, for comparing."""
    if isinstance(x, dict):
        return {k: _plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return type(x)(_plain(v) for v in x)
    if hasattr(x, "tolist"):
        return ("array", str(getattr(x, "dtype", "")), x.tolist())
    return x


@check
def sequence_numbers_agree() -> None:
    """``seq`` counts collectives alike on every rank: each public collective (object ones
    included) counts once; a call refused by validation on one rank only, and point-to-point
    messages, do not count. Timeouts and failures name operations by it."""
    c: Any = comm()
    if not isinstance(getattr(c, "seq", None), int):
        return  # a Communicator not built on BaseCommunicator need not count
    rank, world = c.rank, c.world_size
    start = c.seq
    lib, dtype = next(cases(lambda d: d == "int64"))
    t = make(lib, dtype, [rank])
    if rank == 0:
        raises(InvalidArgumentError, distcomm.broadcast, t, src=world)
    expect(c.seq == start, f"a call refused by validation was counted: {c.seq} != {start}")
    distcomm.all_reduce(t)
    distcomm.broadcast(t, src=0)
    distcomm.barrier()
    distcomm.all_gather_object(rank)
    distcomm.broadcast_object("x", src=0)
    distcomm.all_reduce(3)
    expect(
        c.seq == start + 6 and c.op == "all_reduce",
        f"six collectives moved seq from {start} to {c.seq} (op {c.op!r})",
    )
    if world > 1 and c.capabilities.p2p:
        box = empty(lib, dtype, (1,))
        send = distcomm.isend(t, (rank + 1) % world, tag=p2p_tag(73))
        distcomm.recv(box, (rank - 1) % world, tag=p2p_tag(73))
        send.wait()
        expect(c.seq == start + 6, "point-to-point messages were counted")
    seen = distcomm.all_gather_object(c.seq)
    expect(len(set(seen)) == 1, f"ranks disagree on seq: {seen}")
