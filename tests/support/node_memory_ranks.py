"""The body of each rank in the node-memory tests (tests/runtime/test_node_memory.py), under
``distcomm run`` or ``mpirun``.

    python node_memory_ranks.py SCENARIO OUT_DIR

- ``check``: object collectives of large and small objects (numpy arrays, torch tensors, bytes,
  nested containers) from and to every rank, mixed sizes, a sub-group, an object above
  ``KEEP_BYTES``; each rank writes ``OUT_DIR/rank-N.json``: how many payloads it put in node
  memory, whether its communicator uses node memory, the names it saw in /dev/shm while its
  outbox held a payload, its open memfds, the ops its hook saw (whether on the world, and how far
  the world's operation count moved during each), and how far it moved in all.
- ``unreadable``: rank 1 cannot open the other ranks' node memory (its opener fails); every rank
  must fall back to the engine, get the right objects, and turn node memory off.
- ``kill-reader``: rank 1 kills itself with SIGKILL as it is about to read rank 0's payload.
- ``kill-writer``: rank 0 kills itself with SIGKILL right after writing its payload.

A failed check raises AssertionError naming what went wrong (the job then fails).
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch

import distcomm
from distcomm.backend._pipeline import node_memory as node
from distcomm.testing.conformance.objects import same


def large(seed: int) -> dict[str, Any]:
    """About 3.5 MiB: arrays of several dtypes and layouts, a torch tensor, bytes, nesting."""
    return {
        "weights": np.arange(256 * 1024, dtype=np.float64) + seed,
        "fortran": np.asfortranarray(np.arange(300 * 300, dtype=np.float32).reshape(300, 300)),
        "tensor": torch.full((128 * 1024,), float(seed), dtype=torch.bfloat16),
        "raw": bytes([seed % 256]) * (600 * 1024),
        "nested": [seed, ("text", {"deep": np.full((3, 4), seed, dtype=np.int16)}), None],
    }


def medium(seed: int) -> bytes:
    """Larger than a slot, smaller than NODE_BYTES: this goes through the engine."""
    return bytes([seed % 256]) * (64 * 1024)


def mixed(seed: int) -> Any:
    return (large, medium, lambda s: {"seed": s})[seed % 3](seed)


def expect(got: Any, want: Any, what: str) -> None:
    rank = distcomm.get_rank()
    assert same(got, want), f"rank {rank}: {what}: expected {want!r:.200}, got {got!r:.200}"


def check(comm: Any, report: dict[str, Any]) -> None:
    """Every object collective through node memory; see the module docstring."""
    rank, world = comm.rank, comm.world_size
    for src in range(world):
        expect(distcomm.broadcast_object(large(rank), src=src), large(src), f"broadcast from {src}")
        expect(distcomm.broadcast_object(rank, src=src), src, f"small broadcast from {src}")
    expect(distcomm.all_gather_object(large(rank)), [large(r) for r in range(world)], "all-gather")
    expect(distcomm.all_gather_object(mixed(rank)), [mixed(r) for r in range(world)], "mixed")
    for dst in range(world):
        got = distcomm.gather_object(mixed(rank + dst), dst=dst)
        want = [mixed(r + dst) for r in range(world)] if rank == dst else None
        expect(got, want, f"gather to {dst}")
    first = distcomm.broadcast_object(large(1), src=world - 1)
    distcomm.broadcast_object(large(2), src=world - 1)  # the same outbox, rewritten
    expect(first, large(1), "an earlier result after the outbox was reused")
    assert first["weights"].flags.writeable, f"rank {rank}: a received array is read-only"
    huge = np.arange(node.KEEP_BYTES // 8 + 1024, dtype=np.float64)
    got = distcomm.broadcast_object({"huge": huge} if rank == 0 else None)
    expect(got, {"huge": huge}, "an object above KEEP_BYTES")
    box = node._node(comm._object_channel()).outbox
    assert box is None or box.capacity <= node.KEEP_BYTES, f"rank {rank} kept {box.capacity} B"
    evens: Any = distcomm.new_group(list(range(0, world, 2)))
    if evens:
        expect(distcomm.broadcast_object(large(rank), src=0, group=evens), large(0), "in a group")
    report["local"] = node.local(comm._object_channel())


def unreadable(comm: Any, report: dict[str, Any]) -> None:
    """Rank 1 cannot open the others' node memory: everyone falls back."""
    rank, world = comm.rank, comm.world_size
    if rank == 1:

        def refuse(*args: Any) -> Any:
            raise PermissionError("simulated: /proc/<pid>/fd cannot be opened")

        node._opened = refuse  # type: ignore[assignment]
    expect(distcomm.all_gather_object(large(rank)), [large(r) for r in range(world)], "all-gather")
    assert node.local(comm._object_channel()) is False, f"rank {rank}: node memory still on"
    group: Any = distcomm.new_group(list(range(world)))  # a communicator that has not learned yet
    expect(distcomm.broadcast_object(large(rank), src=0, group=group), large(0), "broadcast")
    expect(distcomm.broadcast_object(large(rank), src=2, group=group), large(2), "then by engine")
    assert node.local(group._object_channel()) is False, f"rank {rank}: group's node memory on"
    report["local"] = node.local(comm._object_channel())


def kill_reader(comm: Any, report: dict[str, Any]) -> None:
    if comm.rank == 1:

        def die(*args: Any) -> Any:
            os.kill(os.getpid(), signal.SIGKILL)

        node._opened = die  # type: ignore[assignment]
    distcomm.broadcast_object(large(comm.rank), src=0)
    distcomm.broadcast_object(large(comm.rank), src=0)


def kill_writer(comm: Any, report: dict[str, Any]) -> None:
    if comm.rank == 0:
        publish = node.publish

        def publish_and_die(*args: Any) -> Any:
            where = publish(*args)
            if where is not None:
                os.kill(os.getpid(), signal.SIGKILL)
            return where

        node.publish = publish_and_die  # type: ignore[assignment]
    distcomm.broadcast_object(large(comm.rank), src=0)
    distcomm.broadcast_object(large(comm.rank), src=0)


SCENARIOS = {
    "check": check,
    "unreadable": unreadable,
    "kill-reader": kill_reader,
    "kill-writer": kill_writer,
}


def observe(report: dict[str, Any]) -> None:
    """Count what this rank puts in node memory, and what /dev/shm and its fds hold then."""
    publish = node.publish
    report.update(published=0, dev_shm=[], memfds=[])

    def watched(*args: Any) -> Any:
        where = publish(*args)
        report["published"] += where is not None
        report["dev_shm"] = sorted(set(report["dev_shm"]) | set(os.listdir("/dev/shm")))
        report["memfds"] = sorted({link for link in fd_links() if link.startswith("/memfd:")})
        return where

    node.publish = watched  # type: ignore[assignment]


def fd_links() -> list[str]:
    """What this process's open fds point to."""
    links = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            links.append(os.readlink(f"/proc/self/fd/{fd}"))
        except FileNotFoundError:  # the listing's own fd, closed meanwhile
            continue
    return links


def main() -> None:
    scenario, out = sys.argv[1], Path(sys.argv[2])
    comm: Any = distcomm.init()
    report: dict[str, Any] = {}
    observe(report)
    seen: list[tuple[str, bool, int]] = []
    rank, calls_before = comm.rank, comm.seq

    def after(event: Any) -> None:  # and how far the world's count moved during the call
        seen.append((event.op, event.group is comm, comm.seq - event.seq))

    with distcomm.add_hook(after=after):
        SCENARIOS[scenario](comm, report)
    report.update(ops=seen, seq=comm.seq - calls_before, backend=comm.backend)
    (out / f"rank-{rank}.json").write_text(json.dumps(report))
    distcomm.finalize()
    print(f"rank {rank} finished", flush=True)


if __name__ == "__main__":
    main()
