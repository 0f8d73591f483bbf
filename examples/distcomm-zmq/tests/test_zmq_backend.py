"""distcomm-zmq as its author tests it: real processes over ZeroMQ, through distcomm's public API.

The conformance kit (every check, at 1, 2, 3 and 4 ranks) runs in test_zmq_conformance.py; here
are what is the plugin's own: the rendezvous, the large-message paths (the ring, buffers sent
without a copy), the Works of async operations, errors and where the sockets listen.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch
from distcomm_zmq import is_available
from distcomm_zmq.plugin import create

import distcomm
from distcomm.backend import LaunchInfo
from distcomm.errors import DistTimeoutError, InvalidArgumentError
from distcomm.testing import WarmWorld

BIG = 3 * 100_003  # float32 elements: past the ring threshold, not a multiple of 2, 3 or 4


def large_messages() -> dict[str, Any]:
    """The ring all-reduce and all-gather, a large broadcast, and large p2p messages whose buffer
    the caller overwrites as soon as the Work completes."""
    rank, n = distcomm.get_rank(), distcomm.get_world_size()
    x = torch.arange(BIG, dtype=torch.float32) + rank
    distcomm.all_reduce(x)
    expected = torch.arange(BIG, dtype=torch.float32) * n + n * (n - 1) / 2
    gathered = np.empty(BIG * n, dtype=np.float32)
    distcomm.all_gather_into_tensor(gathered, np.full(BIG, rank, dtype=np.float32))
    b = np.full(BIG, rank, dtype=np.float64)
    distcomm.broadcast(b, src=n - 1)
    right, left = (rank + 1) % n, (rank - 1) % n
    out = np.full(BIG, rank, dtype=np.float32)
    got = np.empty(BIG, dtype=np.float32)
    works = [distcomm.isend(out, right, tag=3), distcomm.irecv(got, left, tag=3)]
    for work in works:
        work.wait()
    out[:] = -1  # the send is complete: its buffer is the caller's again
    scattered = np.empty(BIG, dtype=np.float32)  # the ring's reduce-scatter, chunk by chunk
    distcomm.reduce_scatter_tensor(scattered, np.repeat(np.arange(n, dtype=np.float32), BIG) + 1)
    distcomm.barrier()
    return {
        "reduce_scatter": bool((scattered == n * (rank + 1)).all()),
        "all_reduce": bool(torch.equal(x, expected)),
        "all_gather": bool((gathered.reshape(n, BIG) == np.arange(n)[:, None]).all()),
        "broadcast": bool((b == n - 1).all()),
        "ring_p2p": bool((got == left).all()),
    }


def async_in_order() -> list[float]:
    """Async collectives issued back to back complete in order, each owning its buffers."""
    works = [distcomm.all_reduce(np.full(4, float(i)), async_op=True) for i in range(20)]
    for work in reversed(works):
        work.wait()
    x = np.ones(4)
    distcomm.all_reduce(x)
    return x.tolist()


def where_it_listens() -> list[str]:
    comm: Any = distcomm.get_communicator()
    return list(comm.native.endpoints)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("nprocs", [2, 3])
def test_large_messages_are_right(nprocs: int, warm_world: Callable[..., WarmWorld]) -> None:
    results = warm_world(nprocs, "zmq").run(large_messages, timeout=100)
    assert results == [dict.fromkeys(results[0], True)] * nprocs


@pytest.mark.timeout(120)
def test_async_operations_complete_in_order(warm_world: Callable[..., WarmWorld]) -> None:
    assert warm_world(2, "zmq").run(async_in_order, timeout=100) == [[2.0] * 4] * 2


@pytest.mark.timeout(120)
def test_a_single_node_job_opens_nothing_beyond_the_machine(
    warm_world: Callable[..., WarmWorld],
) -> None:
    """Unix sockets in the abstract namespace (no file left behind), else loopback TCP."""
    for endpoints in warm_world(2, "zmq").run(where_it_listens, timeout=100):
        assert all(e.startswith(("ipc://@", "tcp://127.0.0.1:")) for e in endpoints), endpoints


def launch(rank: int = 0, size: int = 2, port: int | None = None) -> LaunchInfo:
    return LaunchInfo(
        "env", rank, size, rank, size, 0, 1, master_addr="127.0.0.1", master_port=port
    )


def test_a_missing_rank_fails_the_rendezvous_naming_it() -> None:
    from distcomm.backend import free_port

    start = time.monotonic()
    with pytest.raises(DistTimeoutError, match=r"ranks \[1\] did not join") as info:
        create(launch(port=free_port()), timeout=1.0)
    assert info.value.missing_ranks == (1,) and time.monotonic() - start < 5
    with pytest.raises(DistTimeoutError, match="rank 1 got no address table from rank 0"):
        create(launch(rank=1, port=free_port()), timeout=0.5)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [({"device": "cuda"}, "device='cuda'"), ({"cuda_aware": True}, "options \\['cuda_aware'\\]")],
)
def test_options_are_refused(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(InvalidArgumentError, match=match):
        create(launch(size=1), **kwargs)


def test_availability_says_why() -> None:
    assert is_available(launch(size=1)) == (True, "a world of 1")
    ok, why = is_available(launch(port=None))
    assert not ok and "no master address and port" in why and "HINT" in why


def test_a_world_of_one() -> None:
    from distcomm_zmq.capabilities import ZMQ_CAPABILITIES

    from distcomm.backend import BaseCommunicator

    comm = BaseCommunicator(  # what distcomm makes around the engine the factory returns
        create(launch(size=1), timeout=5),
        backend="zmq",
        capabilities=ZMQ_CAPABILITIES,
        rank=0,
        world_size=1,
        launch=launch(size=1),
        timeout=5,
    )
    try:
        x = np.ones(3)
        comm.all_reduce(x)
        assert x.tolist() == [1.0] * 3 and comm.backend == "zmq"
    finally:
        comm.finalize()


@pytest.mark.timeout(120)
def test_a_timeout_shows_where_the_late_ranks_are(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch, warm_world: Callable[..., WarmWorld]
) -> None:
    """Asked over the transport ("where are you?"), answered by the late ranks' receiver
    threads while their program sleeps (tests/support/straggler.py)."""
    from straggler import late_ranks

    monkeypatch.setenv("DISTCOMM_TIMEOUT", "2")
    said = warm_world(4, "zmq").run(late_ranks, str(tmp_path), timeout=100)
    for message in said[0::2]:
        assert "ranks that had not arrived: [1, 3]" in message, message
        assert "  ranks 1, 3:" in message and "in load_a_huge_shard" in message, message
    assert said[1::2] == [None, None]


def test_the_rendezvous_accepts_only_its_own_job_s_ranks() -> None:
    """Rank 0 turns away a rank of another job (it fails naming both ids) and goes on; a rank
    claimed twice ends the rendezvous for everyone in it (the kit's errors, in one process:
    the ranks are threads with inproc inboxes)."""
    import threading

    import zmq
    from distcomm_zmq.rendezvous import exchange

    from distcomm.backend import free_port
    from distcomm.errors import BackendUnavailableError

    context = zmq.Context()
    results: dict[str, Any] = {}

    def join(name: str, rank: int, size: int, port: int, job: str | None) -> None:
        launch = LaunchInfo("env", rank, size, rank, size, 0, 1, "127.0.0.1", port, job_id=job)
        try:
            results[name] = exchange(context, launch, f"inproc://{name}", 20)
        except Exception as exc:
            results[name] = exc

    def in_thread(*args: Any) -> threading.Thread:
        thread = threading.Thread(target=join, args=args)
        thread.start()
        time.sleep(0.3)  # in this order
        return thread

    try:
        port = free_port()
        threads = [in_thread("a0", 0, 2, port, "A"), in_thread("b1", 1, 2, port, "B")]
        threads.append(in_thread("a1", 1, 2, port, "A"))
        for thread in threads:
            thread.join(30)
        assert isinstance(results["b1"], BackendUnavailableError), results
        assert f"rank 1 of job 'B' reached the rendezvous of job 'A' at 127.0.0.1:{port}" in (
            str(results["b1"])
        )
        assert results["a0"] == results["a1"] == ["inproc://a0", "inproc://a1"]

        port = free_port()  # no job ids: a second claim of rank 1 fails everyone there
        threads = [
            in_thread(f"{n}", r, 3, port, None) for n, r in (("x0", 0), ("x1", 1), ("y1", 1))
        ]
        for thread in threads:
            thread.join(30)
        for name in ("x0", "x1", "y1"):
            assert isinstance(results[name], BackendUnavailableError), results
            assert f"two processes claim rank 1 at 127.0.0.1:{port}" in str(results[name])
    finally:
        context.destroy(linger=0)
