"""Tests of distcomm._runtime.messages beyond the conformance kit's checks: what a careless
program does with batches and object messages (temporaries, lists of the wrong kind, ops of
two groups), on thread-ranks."""

from __future__ import annotations

import gc

import numpy as np
import pytest

import distcomm
from distcomm import P2POp
from distcomm.errors import InvalidArgumentError, RankFailedError
from distcomm.testing import run_threads


def test_temporaries_in_a_batch_survive_the_garbage_collector() -> None:
    def body() -> list[float]:
        rank, world = distcomm.get_rank(), distcomm.get_world_size()
        received = [np.zeros(1000) for _ in range(world)]
        ops = [P2POp(distcomm.irecv, received[peer], peer) for peer in range(world) if peer != rank]
        ops += [
            P2POp(distcomm.isend, np.full(1000, 10.0 * rank + peer), peer)  # a temporary
            for peer in range(world)
            if peer != rank
        ]
        works = distcomm.batch_isend_irecv(ops)
        del ops
        gc.collect()
        for work in works:
            work.wait()
        return [float(r.sum()) for r in received]

    results = run_threads(body, 3, timeout=60)
    for rank, sums in enumerate(results):
        expected = [0.0 if peer == rank else 1000 * (10.0 * peer + rank) for peer in range(3)]
        assert sums == expected, (rank, sums)


@pytest.mark.parametrize(
    ("ops", "said"),
    [
        (P2POp(distcomm.isend, np.ones(1), 1), "takes a list of P2POp, got P2POp"),
        ([P2POp(print, np.ones(1), 1)], "is not a kind of message: valid: distcomm.isend"),
        ([P2POp("send", np.ones(1), 1)], "P2POp(op='send') is not a kind of message"),
        ([P2POp(distcomm.isend, np.ones(1), 2)], "op 0's peer=2 is not a rank"),
        ([P2POp(distcomm.isend, [1.0], 1)], "op 0's tensor"),
    ],
)
def test_a_bad_batch_is_refused_naming_the_op(ops: object, said: str) -> None:
    def body() -> str:
        try:
            distcomm.batch_isend_irecv(ops)  # type: ignore[arg-type]
        except InvalidArgumentError as exc:
            return str(exc)
        return "accepted"

    for text in run_threads(body, 2, timeout=30):
        assert (said in text and "HINT" in text) or said in text, text


def test_a_batch_is_on_one_communicator() -> None:
    def body() -> str:
        pair = distcomm.new_group([0, 1])
        world = distcomm.get_communicator()
        ops = [
            P2POp(distcomm.isend, np.ones(1), 1, world),
            P2POp(distcomm.irecv, np.ones(1), 1, pair),
        ]
        try:
            distcomm.batch_isend_irecv(ops)
        except InvalidArgumentError as exc:
            return str(exc)
        return "accepted"

    for text in run_threads(body, 2, timeout=30):
        assert "op 1 is on another group than op 0" in text and "HINT" in text, text


def test_objects_to_a_rank_that_is_not_there_are_refused() -> None:
    def body() -> None:
        distcomm.send_object({"a": 1}, 5)

    with pytest.raises(RankFailedError, match=r"dst=5 is not a rank of fakelink"):
        run_threads(body, 2, timeout=30)


def test_recv_object_from_any_rank_takes_the_payload_of_its_sender() -> None:
    """Two senders at once to one receiver: each object arrives whole, sizes never mixed."""

    def body() -> list[object]:
        rank = distcomm.get_rank()
        if rank == 0:
            return sorted((distcomm.recv_object(None, tag=3) for _ in range(2)), key=lambda o: o[0])
        distcomm.send_object((rank, "x" * (5000 * rank)), 0, tag=3)
        return []

    got = run_threads(body, 3, timeout=60)[0]
    assert got == [(1, "x" * 5000), (2, "x" * 10000)]
