"""Checks of point-to-point messages: send/recv, isend/irecv, tags, any-source receives,
batches (batch_isend_irecv) and objects (send_object/recv_object).

Messages go around a ring (rank r sends to r + 1), so every world of 2 or more ranks exercises
them; a world of 1 has no one to talk to (``invalid_ranks`` checks the arguments there). Sends are
started with ``isend`` before the matching receive where the order would otherwise depend on the
engine buffering the message. Each check uses its own tags, so no message can leak into another;
on a backend that does not match messages by tag (``capabilities.p2p_tags`` False) every check
uses tag 0 instead, and receives every message it sends, in order.
"""

from __future__ import annotations

import distcomm
from distcomm.errors import (
    DistcommError,
    DistTimeoutError,
    InvalidArgumentError,
    NotSupportedError,
)
from distcomm.protocol import NonMember, P2POp, Work
from distcomm.testing.conformance.registry import check
from distcomm.testing.conformance.support import (
    cases,
    comm,
    empty,
    expect,
    expect_values,
    has_numpy,
    make,
    p2p_tag,
    pattern,
    raises,
    timeouts_raise,
)

N = 5


def _no_p2p() -> bool:
    """Where the backend has no point-to-point messages: check that isend and irecv refuse
    clearly, and return True (the check has nothing else to do)."""
    if comm().capabilities.p2p:
        return False
    rank, _, nxt, prev = _ring()
    lib, dtype = next(cases())
    for fn, peer in ((distcomm.isend, nxt), (distcomm.irecv, prev)):
        exc = raises(NotSupportedError, fn, make(lib, dtype, [rank]), peer, tag=1)
        expect("point-to-point" in str(exc), f"{fn.__name__}'s refusal does not say why: {exc}")
    return True


def _ring() -> tuple[int, int, int, int]:
    rank, world = distcomm.get_rank(), distcomm.get_world_size()
    return rank, world, (rank + 1) % world, (rank - 1) % world


@check
def send_recv_ring() -> None:
    """Blocking send/recv around the ring (even ranks send first), every dtype, recv returns src."""
    rank, world, nxt, prev = _ring()
    if world == 1:
        return
    if _no_p2p():
        return
    for tag, (lib, dtype) in enumerate(cases()):
        out = make(lib, dtype, pattern(dtype, rank * 100 + tag, N))
        buf = empty(lib, dtype, (N,))
        if rank % 2 == 0:
            distcomm.send(out, nxt, tag=p2p_tag(tag))
            got = distcomm.recv(buf, prev, tag=p2p_tag(tag))
        else:
            got = distcomm.recv(buf, prev, tag=p2p_tag(tag))
            distcomm.send(out, nxt, tag=p2p_tag(tag))
        expect(got == prev, f"recv from {prev} returned {got!r}")
        expect_values(buf, pattern(dtype, prev * 100 + tag, N), f"send/recv {lib} {dtype}")


@check
def isend_irecv() -> None:
    """isend/irecv return Works; an irecv's Work names its source; non-contiguous targets fill."""
    rank, world, nxt, prev = _ring()
    if world == 1:
        return
    if _no_p2p():
        return
    for lib, dtype in cases(lambda d: d in ("bool", "int64", "float32", "bfloat16")):
        mine, theirs = pattern(dtype, rank, 8), pattern(dtype, prev, 8)
        buf = empty(lib, dtype, (8,))
        recv_work = distcomm.irecv(buf, prev, tag=p2p_tag(7))
        send_work = distcomm.isend(make(lib, dtype, mine), nxt, tag=p2p_tag(7))
        expect(
            isinstance(recv_work, Work) and isinstance(send_work, Work),
            "isend/irecv must return Works",
        )
        expect(
            recv_work.wait() is True and send_work.wait() is True, "Work.wait() must return True"
        )
        expect(recv_work.is_completed(), "irecv Work not completed after wait()")
        expect(
            getattr(recv_work, "source", None) == prev,
            f"irecv Work.source is {getattr(recv_work, 'source', None)!r}, expected {prev}",
        )
        expect_values(buf, theirs, f"isend/irecv {lib} {dtype}")

        base = empty(lib, dtype, (4, 2))
        work = distcomm.irecv(base.T, prev, tag=p2p_tag(8))
        distcomm.isend(make(lib, dtype, mine, (2, 4)), nxt, tag=p2p_tag(8)).wait()
        work.wait()
        expect_values(base.T, theirs, f"irecv into a transposed {lib} {dtype}")


@check
def tags_received_out_of_order() -> None:
    """Two messages with different tags are matched by tag, not by arrival order; a backend that
    does not match tags refuses a non-zero one, before anything is sent, and says so."""
    rank, world, nxt, prev = _ring()
    if _no_p2p():
        return
    if not comm().capabilities.p2p_tags:
        lib, dtype = next(cases())
        for fn, peer in ((distcomm.isend, nxt), (distcomm.irecv, prev)):
            exc = raises(InvalidArgumentError, fn, make(lib, dtype, [rank]), peer, tag=21)
            text = str(exc)
            expect(
                "tag=21" in text and "tag=0" in text,
                f"{fn.__name__}'s refusal of a tag does not name it and the fix: {exc}",
            )
        return
    if world == 1:
        return
    for lib, dtype in cases(lambda d: d == "int32"):
        first = distcomm.isend(make(lib, dtype, pattern(dtype, rank, N)), nxt, tag=21)
        second = distcomm.isend(make(lib, dtype, pattern(dtype, rank + 50, N)), nxt, tag=22)
        late, early = empty(lib, dtype, (N,)), empty(lib, dtype, (N,))
        expect(distcomm.recv(late, prev, tag=22) == prev, "recv returned the wrong source")
        expect(distcomm.recv(early, prev, tag=21) == prev, "recv returned the wrong source")
        first.wait()
        second.wait()
        expect_values(late, pattern(dtype, prev + 50, N), f"tag 22 {lib}")
        expect_values(early, pattern(dtype, prev, N), f"tag 21 {lib}")


@check
def same_tag_messages_keep_their_order() -> None:
    """Messages from one sender with one tag arrive in the order they were sent."""
    rank, world, nxt, prev = _ring()
    if world == 1:
        return
    if _no_p2p():
        return
    for lib, dtype in cases(lambda d: d == "int64"):
        works = [
            distcomm.isend(make(lib, dtype, [rank, k]), nxt, tag=p2p_tag(31)) for k in range(4)
        ]
        for k in range(4):
            buf = empty(lib, dtype, (2,))
            distcomm.recv(buf, prev, tag=p2p_tag(31))
            expect_values(buf, [prev, k], f"message {k} from rank {prev} ({lib})")
        for work in works:
            work.wait()


@check
def recv_any_source() -> None:
    """recv(src=None) returns the sender's rank, where the backend supports any-source receives."""
    rank, world, nxt, prev = _ring()
    if world == 1:
        return
    if _no_p2p():
        return
    if not comm().capabilities.any_source:
        lib, dtype = next(cases())
        exc = raises(
            InvalidArgumentError, distcomm.recv, empty(lib, dtype, (1,)), None, tag=p2p_tag(41)
        )
        expect("src" in str(exc), f"the any-source error does not say what to pass: {exc}")
        return
    for lib, dtype in cases(lambda d: d == "int64"):
        send = distcomm.isend(make(lib, dtype, [rank]), nxt, tag=p2p_tag(41))
        buf = empty(lib, dtype, (1,))
        got = distcomm.recv(buf, None, tag=p2p_tag(41))
        expect(got == prev, f"recv(src=None) returned {got!r}; the sender was {prev}")
        expect_values(buf, [prev], f"recv(src=None) {lib}")
        send.wait()

        send = distcomm.isend(make(lib, dtype, [rank]), nxt, tag=p2p_tag(42))
        work = distcomm.irecv(buf, None, tag=p2p_tag(42))
        work.wait()
        expect(
            getattr(work, "source", None) == prev,
            f"irecv(src=None).source is {getattr(work, 'source', None)!r}",
        )
        send.wait()


@check
def batch_exchange_with_both_neighbours() -> None:
    """batch_isend_irecv of a pipeline schedule's step: each rank sends to both neighbours and
    receives from both in one batch (receives first: nobody waits on anybody); one Work per op,
    in order; an empty batch is no Work."""
    rank, world, nxt, prev = _ring()
    expect(distcomm.batch_isend_irecv([]) == [], "an empty batch returns no Work")
    if world == 1 or _no_p2p():
        return
    for lib, dtype in cases(lambda d: d in ("int64", "float32")):
        forward, backward = make(lib, dtype, [rank, 1]), make(lib, dtype, [rank, 2])
        got_forward, got_backward = empty(lib, dtype, (2,)), empty(lib, dtype, (2,))
        ops = [
            P2POp(distcomm.isend, forward, nxt, tag=p2p_tag(71)),
            P2POp(distcomm.isend, backward, prev, tag=p2p_tag(72)),
            P2POp(distcomm.irecv, got_forward, prev, tag=p2p_tag(71)),
            P2POp("irecv", got_backward, nxt, tag=p2p_tag(72)),
        ]
        works = distcomm.batch_isend_irecv(ops)
        expect(len(works) == 4 and all(isinstance(w, Work) for w in works), f"{works!r}")
        for work in works:
            work.wait()
        expect_values(got_forward, [prev, 1], f"batch: from the previous rank, {lib} {dtype}")
        expect_values(got_backward, [nxt, 2], f"batch: from the next rank, {lib} {dtype}")


@check
def batch_checks_every_op_before_starting_any() -> None:
    """A bad op anywhere in a batch (not a P2POp, neither isend nor irecv, a peer that is not a
    rank) is refused before any message starts: the valid receive ahead of it was not posted,
    so the next message on its tag reaches the next receive."""
    rank, world, nxt, prev = _ring()
    lib, dtype = next(iter(cases(lambda d: d == "int64")))
    buf = empty(lib, dtype, (1,))
    ahead = P2POp(distcomm.irecv, buf, prev, tag=p2p_tag(81))
    bad_ops = [
        ("a tuple", (distcomm.isend, buf, nxt)),
        ("a broadcast", P2POp(distcomm.broadcast, buf, nxt)),
        ("peer world_size", P2POp(distcomm.isend, buf, world)),
    ]
    for what, bad in bad_ops:
        exc = raises(InvalidArgumentError, distcomm.batch_isend_irecv, [ahead, bad])
        expect("op 1" in str(exc) or "P2POp" in str(exc), f"{what}: names no op: {exc}")
    if world == 1 or _no_p2p():
        return
    fresh = empty(lib, dtype, (1,))
    send = distcomm.isend(make(lib, dtype, [rank + 10]), nxt, tag=p2p_tag(81))
    distcomm.recv(fresh, prev, tag=p2p_tag(81))
    send.wait()
    expect_values(fresh, [prev + 10], "the message after a refused batch")
    expect_values(buf, [0], "the refused batch's receive ran")


@check
def objects_around_the_ring() -> None:
    """send_object/recv_object around the ring: a small object, and one with a large numpy
    array (sent beside the pickle stream); recv_object(src=None) where the backend can."""
    rank, world, nxt, prev = _ring()
    if world == 1:
        return
    if not comm().capabilities.p2p:
        raises(NotSupportedError, distcomm.send_object, {"x": 1}, nxt)
        return
    payloads = [("small", rank), ("text", "x" * (100 * rank))]
    if has_numpy():
        import numpy as np

        payloads.append(("array", np.arange(100_000, dtype=np.int64) + rank))
    for tag, (what, mine) in enumerate(payloads):
        if rank % 2 == 0:
            distcomm.send_object({"what": what, "value": mine}, nxt, tag=p2p_tag(90 + tag))
            got = distcomm.recv_object(prev, tag=p2p_tag(90 + tag))
        else:
            got = distcomm.recv_object(prev, tag=p2p_tag(90 + tag))
            distcomm.send_object({"what": what, "value": mine}, nxt, tag=p2p_tag(90 + tag))
        value = got["value"]
        expected = {"small": prev, "text": "x" * (100 * prev)}.get(what)
        if what == "array":
            expect(int(value[0]) == prev and len(value) == 100_000, f"array from {prev}")
        else:
            expect(value == expected, f"recv_object {what}: {value!r}, expected {expected!r}")
    if comm().capabilities.any_source:
        if rank % 2 == 0:
            distcomm.send_object(("any", rank), nxt, tag=p2p_tag(99))
            got = distcomm.recv_object(None, tag=p2p_tag(99))
        else:
            got = distcomm.recv_object(None, tag=p2p_tag(99))
            distcomm.send_object(("any", rank), nxt, tag=p2p_tag(99))
        expect(got == ("any", prev), f"recv_object(src=None): {got!r}")


@check
def wait_with_timeout() -> None:
    """Work.wait(timeout) raises DistTimeoutError while nothing arrives; the communicator is then
    unusable (engines cannot cancel a half-done operation), and says so.

    The timed-out receive runs on rank 0 only, on a sub-communicator of every rank made for the
    purpose (nobody else touches it again), so the world stays usable for the checks that follow.
    """
    rank, world, _, _ = _ring()
    if world == 1 or not comm().capabilities.p2p or not timeouts_raise():
        return  # (under DISTCOMM_ON_TIMEOUT=abort a timeout ends the job: nothing to check)
    sacrificed = distcomm.new_group(range(world))
    assert not isinstance(sacrificed, NonMember), "every rank is a member"
    if rank == 0:
        lib, dtype = next(iter(cases(lambda d: d == "int64")))
        work = sacrificed.irecv(empty(lib, dtype, (1,)), 1, tag=p2p_tag(61))
        exc = raises(DistTimeoutError, work.wait, timeout=0.05)
        expect(isinstance(exc, TimeoutError), "DistTimeoutError must be a TimeoutError")
        expect("0.05 s" in str(exc), f"the message names the time waited: {exc}")
        late = raises(DistcommError, sacrificed.barrier)
        expect("can no longer be used" in str(late), f"a timed-out communicator says so: {late}")
    distcomm.barrier()
