"""Object collectives through node memory (distcomm.backend._pipeline.node_memory).

- Thread-ranks never use it (one process: the fabric already hands memory over); with its
  learning forced on, they run the whole protocol in one process: every root, worlds of 1, 2
  and 4, mixed sizes, a rank that cannot read, reuse and growth of the outbox, learning once.
- Real processes of one node: ``distcomm run --backend gloo`` and ``mpirun`` jobs (gloo under
  mpirun: the mpi backend leaves node memory off, its own transport is as fast) of
  tests/support/node_memory_ranks.py at 1, 2 and 4 ranks (objects right, payloads really in node
  memory, nothing in /dev/shm, hooks and the operation count see one call per collective), a
  rank that cannot open the others' memory (everyone falls back), and a rank killed with SIGKILL
  while a payload is in node memory (the job ends with an error, /dev/shm as it was).
"""

from __future__ import annotations

import json
import os
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import node_memory_ranks
import numpy as np
import pytest
from jobs import dev_shm_names, run_job

import distcomm
from distcomm.backend._pipeline import node_memory as node
from distcomm.backend._pipeline import object_transport as codec
from distcomm.testing import run_threads
from distcomm.testing.conformance.objects import same

PROGRAM = node_memory_ranks.__file__
#: What MPICH itself may leave in /dev/shm when one of its ranks is killed (not distcomm's).
MPICH = re.compile(r"mpich_shm_")


def large(seed: int, mib: float = 1.5) -> dict[str, Any]:
    return {
        "array": np.full(int(mib * 2**20) // 8, seed, dtype=np.float64),
        "bytes": bytes([seed % 256]) * 300_000,
        "nested": [seed, ({"deep": np.arange(5) + seed}, "text"), None],
    }


@pytest.fixture
def shared_threads(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """Thread-ranks learn that they share a node (as processes of one node do); yields the
    list of ranks that learned, one entry per
    :func:`~distcomm.backend._pipeline.node_memory.learn`."""
    learn, learned = node.learn, []

    def learn_as_processes(comm: Any) -> bool:
        learn(comm)  # the same collective
        node._node(comm).local = True
        learned.append(comm.rank)
        return True

    monkeypatch.setattr(node, "learn", learn_as_processes)
    yield learned


def published(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The sizes of the payloads written to node memory from now on."""
    sizes: list[int] = []
    publish = node.publish

    def counted(comm: Any, size: int, pieces: list[tuple[int, Any]]) -> bytes | None:
        sizes.append(size)
        return publish(comm, size, pieces)

    monkeypatch.setattr(node, "publish", counted)
    return sizes


def test_thread_ranks_never_use_node_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    sizes = published(monkeypatch)

    def body() -> Any:
        comm: Any = distcomm.get_communicator()
        got = [distcomm.broadcast_object(large(comm.rank), src=1) for _ in range(2)]
        return got, node.local(comm._object_channel())

    results = run_threads(body, 2, timeout=60)
    assert all(same(got, [large(1)] * 2) for got, _ in results), "wrong objects"
    assert [local for _, local in results] == [False, False], "thread-ranks share one process"
    assert sizes == [], "thread-ranks wrote to node memory"


def every_collective() -> list[str]:
    """Every object collective from and to every rank, large, small and mixed sizes; the ops
    the hooks saw."""
    comm: Any = distcomm.get_communicator()
    rank, world = comm.rank, comm.world_size
    seen: list[str] = []

    def mine(event: Any) -> None:  # hooks are the process's: each thread-rank keeps its own
        if event.group is comm:
            seen.append(event.op)

    with distcomm.add_hook(after=mine):
        for src in range(world):
            got = distcomm.broadcast_object(large(rank), src=src)
            assert same(got, large(src)), f"rank {rank}: broadcast from {src}"
        everyone = [large(r) for r in range(world)]
        assert same(distcomm.all_gather_object(large(rank)), everyone), f"rank {rank}: gathered"
        # large (node memory), larger than a slot but below NODE_BYTES (the engine), small
        mixed = [(large, lambda r: bytes([r]) * 65536, int)[r % 3](r) for r in range(world)]
        assert same(distcomm.all_gather_object(mixed[rank]), mixed), f"rank {rank}: mixed"
        for dst in range(world):
            got = distcomm.gather_object(mixed[rank], dst=dst)
            assert same(got, mixed if rank == dst else None), f"rank {rank}: gather to {dst}"
    return seen


@pytest.mark.timeout(120)
@pytest.mark.parametrize("world", [1, 2, 4])
def test_every_collective_through_node_memory(
    world: int, shared_threads: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    sizes = published(monkeypatch)
    seen = run_threads(every_collective, world, timeout=100)
    ops = ["broadcast_object"] * world + ["all_gather_object"] * 2 + ["gather_object"] * world
    assert seen == [ops] * world, "hooks saw other calls than the public ones"
    if world > 1:
        # every src's broadcast, every rank's large all-gather, the large third of the mixed ones
        large_ranks = len(range(0, world, 3))
        assert len(sizes) == world + world + large_ranks * (1 + world), sizes
        assert sorted(set(shared_threads)) == list(range(world)), "learned on every rank"
        assert len(shared_threads) == world, "learned more than once per communicator"


@pytest.mark.timeout(120)
@pytest.mark.parametrize("outbox", ["kept", "once"])
@pytest.mark.parametrize("op", ["broadcast_object", "all_gather_object", "gather_object"])
def test_a_rank_that_cannot_read_makes_every_rank_fall_back(
    op: str, outbox: str, shared_threads: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    if outbox == "once":  # the payloads get an outbox each, which readers map in place
        monkeypatch.setattr(node, "KEEP_BYTES", 2**20)
    opened = node._opened

    def refused_on_rank_1(*args: Any) -> Any:
        if distcomm.get_rank() == 1:
            raise PermissionError("simulated: /proc/<pid>/fd cannot be opened")
        return opened(*args)

    monkeypatch.setattr(node, "_opened", refused_on_rank_1)
    sizes = published(monkeypatch)

    def body() -> tuple[bool, bool | None]:
        comm: Any = distcomm.get_communicator()
        rank, world = comm.rank, comm.world_size
        for _ in range(2):  # the second call goes by engine from the start
            if op == "broadcast_object":
                right = same(distcomm.broadcast_object(large(rank), src=2), large(2))
            elif op == "all_gather_object":
                every = distcomm.all_gather_object(large(rank))
                right = same(every, [large(r) for r in range(world)])
            else:
                got = distcomm.gather_object(large(rank), dst=1)  # rank 1 reads, and cannot
                right = same(got, [large(r) for r in range(world)] if rank == 1 else None)
        return right, node.local(comm._object_channel())

    assert run_threads(body, 3, timeout=100) == [(True, False)] * 3
    assert len(sizes) == (1 if op == "broadcast_object" else 3), "node memory stayed on"


@pytest.mark.timeout(60)
def test_results_never_point_into_node_memory(shared_threads: list[int]) -> None:
    def body() -> bool:
        first = distcomm.broadcast_object(large(1), src=0)
        distcomm.broadcast_object(large(2), src=0)  # the same outbox, rewritten
        gathered = distcomm.all_gather_object(large(3))
        distcomm.all_gather_object(large(4))
        writable = first["array"].flags.writeable and gathered[0]["array"].flags.writeable
        return same(first, large(1)) and same(gathered[1], large(3)) and writable

    assert run_threads(body, 2, timeout=50) == [True, True]


def owner(array: Any) -> Any:
    """The object that holds ``array``'s memory."""
    while True:
        found = array.obj if isinstance(array, memoryview) else getattr(array, "base", None)
        if found is None:
            return array
        array = found


@pytest.mark.timeout(60)
def test_a_kept_outbox_is_reused_and_grown_and_a_larger_payload_gets_its_own(
    shared_threads: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(node, "KEEP_BYTES", 4 * 2**20)

    def body() -> list[Any]:
        comm: Any = distcomm.get_communicator()
        state = node._node(comm._object_channel())
        seen: list[Any] = []
        for mib in (1.5, 1.2, 3.5, 5, 1.5):
            got = distcomm.broadcast_object(large(7, mib), src=0)
            assert same(got, large(7, mib)), f"rank {comm.rank}: {mib} MiB"
            got["array"][0] = -1.0  # writable, and private to this rank
            box: Any = state.outbox
            peer: Any = state.peers.get(0)
            if comm.rank == 0:
                seen.append((box.inode, box.capacity) if box else None)
            else:
                seen.append((peer.inode, len(peer.map), type(owner(got["array"])).__name__))
        return seen

    writer, reader = run_threads(body, 2, timeout=50)
    first, again, grown, above, after = writer
    assert first == again and first[1] == 2 * 2**20, "a smaller payload reuses the outbox"
    assert grown == (first[0], 4 * 2**20), "grown in place, rounded up to whole MiB"
    assert above is None, "an outbox made for one payload is closed after the vote"
    assert after is not None and after[0] != first[0], "then a new kept outbox"
    assert [r[:2] for r in reader[:3]] == writer[:3], "readers keep a mapping of the kept one"
    assert reader[3][2] == "mmap" and reader[2][2] != "mmap", "copied, or read in place"


@pytest.mark.timeout(60)
def test_small_objects_never_ask_and_large_ones_learn_once(
    shared_threads: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    sizes = published(monkeypatch)

    def body() -> tuple[bool | None, bool | None]:
        comm: Any = distcomm.get_communicator()
        distcomm.broadcast_object(b"x" * (node.NODE_BYTES - 2048))
        distcomm.all_gather_object(list(range(comm.rank * 10)))
        before = node.local(comm._object_channel())
        for _ in range(3):
            distcomm.broadcast_object(large(5))
        return before, node.local(comm._object_channel())

    assert run_threads(body, 2, timeout=50) == [(None, True)] * 2
    assert shared_threads == [0, 1] or shared_threads == [1, 0], "learned once per rank"
    assert len(sizes) == 3, sizes


def test_node_key_and_an_outbox_that_is_not_the_one_announced() -> None:
    boot, namespace, user = node.node_key()
    assert len(boot) == 16 and boot != bytes(16) and namespace > 0 and user == os.geteuid()
    comm: Any = distcomm.init(backend="fakelink")
    where = node.publish(comm, 4096, [(0, memoryview(b"abcd"))])
    assert where is not None
    pid, fd, inode, capacity, once = node.WHERE.unpack(where)
    assert (pid, capacity, once) == (os.getpid(), 2**20, False)
    assert oct(os.stat(f"/proc/{pid}/fd/{fd}").st_mode & 0o777) == "0o600", "its mode"
    state = node._node(comm)
    got = node._read(state, 1, where, 4096, bytearray)  # as rank 1 reads it
    assert got is not None and bytes(got[:5]) == b"abcd\0", "read as rank 1 would"
    state.peers.clear()
    wrong = node.WHERE.pack(pid, fd, inode + 1, capacity, once)
    assert node._read(state, 1, wrong, 4096, bytearray) is None, "another file was read"


def test_payload_layout_is_the_same_written_in_node_memory_or_split() -> None:
    obj = large(9)
    pickled = codec.Pickled(obj)
    payload, size, directs = pickled.split(codec.HEAD)
    view = memoryview(bytearray(size))
    node.lay_out(view, pickled.pieces(codec.HEAD), size)
    assert directs == [] and size == pickled.size(codec.HEAD)
    assert bytes(view[codec.HEAD :]) == bytes(memoryview(payload)[codec.HEAD : size])
    assert same(codec.unpack(view[codec.HEAD :]), obj)


# -- processes ----------------------------------------------------------------------------------
def launch(launcher: str, n: int, mpirun: str | None) -> list[str]:
    if launcher == "mpirun":  # gloo under mpirun: the mpi backend leaves node memory off
        assert mpirun is not None
        return [mpirun, "-genv", "DISTCOMM_BACKEND", "gloo", "-n", str(n), sys.executable, PROGRAM]
    return [sys.executable, "-m", "distcomm", "run", "-n", str(n), "--backend", "gloo", PROGRAM]


def reports(out: Path, world: int) -> list[dict[str, Any]]:
    return [json.loads((out / f"rank-{r}.json").read_text()) for r in range(world)]


def new_in_dev_shm(before: set[str], seen: set[str]) -> set[str]:
    return {name for name in seen - before if not MPICH.match(name)}


@pytest.fixture(params=["gloo", "mpirun"])
def launcher(request: pytest.FixtureRequest) -> Iterator[tuple[str, str | None]]:
    if request.param == "mpirun":
        request.getfixturevalue("aborted_mpich_job")  # MPICH's own files, when a rank dies
        yield "mpirun", request.getfixturevalue("mpirun")
    else:
        yield "gloo", None


@pytest.mark.timeout(200)
@pytest.mark.parametrize("world", [1, 2, 4])
def test_processes_of_one_node_move_objects_through_node_memory(
    world: int, launcher: tuple[str, str | None], tmp_path: Path
) -> None:
    name, mpirun = launcher
    before = dev_shm_names()
    done = run_job([*launch(name, world, mpirun), "check", str(tmp_path)], timeout=170)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    ranks = reports(tmp_path, world)
    public = {"broadcast_object", "all_gather_object", "gather_object", "new_group"}
    for rank, report in enumerate(ranks):
        ops = [op for op, _, _ in report["ops"]]
        assert set(ops) <= public, f"rank {rank}: hooks saw inner traffic: {ops}"
        on_world = [moved for _, world_op, moved in report["ops"] if world_op]
        assert set(on_world) == {0}, f"rank {rank}: more was counted during a call: {report}"
        # one count per call the hooks saw, and the sub-group's new_group, which they do not see
        assert report["seq"] == len(on_world) + 1, f"rank {rank}: operations counted: {report}"
        assert not new_in_dev_shm(before, set(report["dev_shm"])), f"rank {rank}: /dev/shm"
        if world > 1:
            assert report["local"] is True, f"rank {rank} did not use node memory"
            assert report["published"] >= 2, f"rank {rank}: {report['published']} payloads"
            assert "/memfd:distcomm-objects (deleted)" in report["memfds"], report["memfds"]
        else:
            assert report["published"] == 0, "a world of 1 needs no node memory"
    assert not new_in_dev_shm(before, dev_shm_names()), "the job left files in /dev/shm"


@pytest.mark.timeout(200)
def test_a_rank_that_cannot_open_node_memory_makes_every_rank_fall_back(
    launcher: tuple[str, str | None], tmp_path: Path
) -> None:
    name, mpirun = launcher
    done = run_job([*launch(name, 3, mpirun), "unreadable", str(tmp_path)], timeout=170)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    ranks = reports(tmp_path, 3)
    assert [report["local"] for report in ranks] == [False] * 3, "node memory still on"
    # the all-gather's three payloads, then rank 0's broadcast on a group that learned anew
    assert [report["published"] for report in ranks] == [2, 1, 1], ranks


@pytest.mark.timeout(200)
@pytest.mark.parametrize("who", ["kill-reader", "kill-writer"])
def test_a_rank_killed_during_a_transfer_ends_the_job_and_leaves_no_file(
    who: str, launcher: tuple[str, str | None], tmp_path: Path
) -> None:
    name, mpirun = launcher
    before = dev_shm_names()
    done = run_job([*launch(name, 2, mpirun), who, str(tmp_path)], timeout=170)
    said = done.stdout + done.stderr
    assert done.returncode != 0, f"the job ended well although a rank was killed:\n{said}"
    assert "finished" not in done.stdout, said
    dead = "1" if who == "kill-reader" else "0"
    if name == "gloo":
        assert f"rank {dead} was killed by SIGKILL (signal 9)" in said, said[-3000:]
    else:
        assert re.search(r"KILLED BY SIGNAL: 9|signal 9|Killed", said), said[-3000:]
    assert not new_in_dev_shm(before, dev_shm_names()), "the job left files in /dev/shm"
