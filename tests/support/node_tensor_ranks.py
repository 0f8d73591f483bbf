"""Rank bodies of the node-memory transport's tests (tests/runtime/test_node_tensors.py).

The functions run in a warm world's ranks (gloo, one node, ``DISTCOMM_NODE_MEMORY`` as the world
was started); run as a script, one scenario of a job that a launcher started:

    python node_tensor_ranks.py kill OUT_DIR

- ``kill``: rank 1 kills itself with SIGKILL while the ranks run 16 MiB all_reduces through node
  memory; every other rank writes the error it got to ``OUT_DIR/rank-N.txt`` (they ignore the
  SIGTERM with which the launcher stops them, as a job that checkpoints on SIGTERM would, so
  that the launcher's speed does not decide whether they report).

A failed check raises AssertionError naming what went wrong.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

import distcomm
from distcomm.backend._pipeline.node_segment import SLOT_BYTES, Segment
from distcomm.errors import CollectiveMismatchError, DistTimeoutError

#: Element counts: none, one, odd, a slot's worth and more (pieces), not a multiple of anything.
SIZES = (0, 1, 7, 1001, SLOT_BYTES // 8 + 13)
OPS = ("sum", "product", "min", "max", "band", "bor", "bxor", "avg")


def transport(comm: Any) -> Any:
    """The communicator's node-memory transport, asserted proved."""
    node = comm._node
    assert node is not None, f"{comm.describe()}: no node-memory transport"
    assert isinstance(node.segment, Segment), f"{comm.describe()}: not proved: {node.segment}"
    return node


def engine_group() -> Any:
    """A group of every rank that keeps the engine (``DISTCOMM_NODE_MEMORY=off`` when made)."""
    saved = os.environ.get("DISTCOMM_NODE_MEMORY")
    os.environ["DISTCOMM_NODE_MEMORY"] = "off"
    try:
        group = distcomm.new_group(list(range(distcomm.get_world_size())))
    finally:
        if saved is None:
            del os.environ["DISTCOMM_NODE_MEMORY"]
        else:
            os.environ["DISTCOMM_NODE_MEMORY"] = saved
    assert group._node is None, "DISTCOMM_NODE_MEMORY=off still made a transport"
    return group


def value(make: str, dtype: str, n: int, rank: int, salt: int = 0) -> Any:
    """Rank ``rank``'s array: distinct on every rank and element, small enough for products."""
    base = (np.arange(n, dtype=np.int64) * 7 + rank * 3 + salt) % 5 + 1
    if dtype == "bool":
        base = (base + rank) % 2 == 0
    if make == "torch":
        t = torch.from_numpy(np.ascontiguousarray(base))
        return t.to(getattr(torch, dtype))
    return base.astype(dtype)


def allowed(op: str, dtype: str) -> bool:
    if op == "avg":
        return dtype in ("float32", "float64", "bfloat16")
    if op in ("band", "bor", "bxor"):
        return dtype in ("int32", "int64", "uint8", "bool")
    return True


def same(a: Any, b: Any) -> bool:
    """Equal arrays (floats up to summation order), of one dtype and shape."""
    a = a.float().numpy() if isinstance(a, torch.Tensor) else np.asarray(a)
    b = b.float().numpy() if isinstance(b, torch.Tensor) else np.asarray(b)
    if a.shape != b.shape:
        return False
    if a.dtype.kind == "f":
        return bool(np.allclose(a, b, rtol=1e-2 if a.dtype.itemsize <= 4 else 1e-6))
    return bool((a == b).all())


def every_call() -> int:
    """Every served op, dtype, size and reduce op through node memory, each equal to what the
    engine gives (a group made with node memory off); returns the calls node memory moved."""
    comm = distcomm.get_communicator()
    rank, world = comm.rank, comm.world_size
    node = transport(comm)
    engine = engine_group()
    before = node.calls
    for make, dtypes in (("torch", ("float32", "bfloat16", "int64", "bool", "uint8")),
                         ("numpy", ("float64", "int32", "float16", "bool"))):  # fmt: skip
        for dtype in dtypes:
            for n in SIZES if dtype in ("float32", "float64") else SIZES[:4]:
                for op in OPS:
                    if not allowed(op, dtype) or (op != "sum" and n > 2000):
                        continue
                    x, y = value(make, dtype, n, rank), value(make, dtype, n, rank)
                    distcomm.all_reduce(x, op=op)
                    distcomm.all_reduce(y, op=op, group=engine)
                    assert same(x, y), f"rank {rank}: all_reduce {op} {make} {dtype} x{n}"
                src = n % world
                x = value(make, dtype, n, rank)
                distcomm.broadcast(x, src=src)
                assert same(x, value(make, dtype, n, src)), f"broadcast {make} {dtype} x{n}"
                x = value(make, dtype, n, rank)
                out = value(make, dtype, n * world, 0)
                distcomm.all_gather_into_tensor(out, x)
                want = [value(make, dtype, n, r) for r in range(world)]
                cat = torch.cat(want) if make == "torch" else np.concatenate(want)
                assert same(out, cat), f"rank {rank}: all_gather {make} {dtype} x{n}"
                full = value(make, dtype, n * world, rank)
                mine, theirs = value(make, dtype, n * world, 0), value(make, dtype, n * world, 0)
                distcomm.all_to_all_single(mine, full)
                distcomm.all_to_all_single(theirs, full, group=engine)
                assert same(mine, theirs), f"rank {rank}: all_to_all {make} {dtype} x{n}"
                if dtype == "bool":
                    continue
                mine, theirs = value(make, dtype, n, 0), value(make, dtype, n, 0)
                distcomm.reduce_scatter_tensor(mine, full)
                distcomm.reduce_scatter_tensor(theirs, full, group=engine)
                assert same(mine, theirs), f"rank {rank}: reduce_scatter {make} {dtype} x{n}"
                x, y = value(make, dtype, n, rank), value(make, dtype, n, rank)
                distcomm.reduce(x, dst=src, op="max")
                distcomm.reduce(y, dst=src, op="max", group=engine)
                if rank == src:
                    assert same(x, y), f"rank {rank}: reduce {make} {dtype} x{n}"
    distcomm.barrier()
    return int(node.calls - before)


def planned_calls() -> list[int]:
    """Calls of a kind taken before run the plan, which moves them through node memory: the
    transport's count grows by one per call, and the engine is not called."""
    comm = distcomm.get_communicator()
    node = transport(comm)
    x, out = torch.ones(1000), torch.empty(1000 * comm.world_size)
    for _ in range(3):  # learnt, then planned
        distcomm.all_reduce(x)
        distcomm.all_gather_into_tensor(out, x)
    kinds = {key[0]: entry[0] for key, entry in comm._plans.kinds.items()}
    assert kinds["all_reduce"].__qualname__.startswith("Transport._plan"), kinds
    counts = []
    for _ in range(2):
        start = node.calls
        for _ in range(10):
            distcomm.all_reduce(x)
            distcomm.all_gather_into_tensor(out, x)
            distcomm.barrier()
        counts.append(node.calls - start)
    assert float(x[0]) == comm.world_size**23, float(x[0])
    return counts


def mismatched() -> str:
    """Rank 0 all_reduces where the others broadcast, the mismatch check off: every rank
    raises CollectiveMismatchError naming each rank's call."""
    group = distcomm.new_group(list(range(distcomm.get_world_size())))
    group.debug = "off"
    x = torch.ones(1000)
    distcomm.all_reduce(x, group=group)  # proved, and the same calls
    try:
        if distcomm.get_rank() == 0:
            distcomm.all_reduce(x, group=group)
        else:
            distcomm.broadcast(x, src=0, group=group)
    except CollectiveMismatchError as exc:
        return str(exc)
    raise AssertionError(f"rank {distcomm.get_rank()}: no CollectiveMismatchError")


def slow_rank(timeout: float) -> str:
    """Rank 1 comes after the group's ``timeout``: the others raise DistTimeoutError naming it;
    rank 1 too, then (nobody waits for it). Returns the error and the seconds waited."""
    world = distcomm.get_communicator()
    saved, world.timeout = world.timeout, timeout
    try:  # a group takes its parent's timeout when it is made
        group = distcomm.new_group(list(range(world.world_size)))
    finally:
        world.timeout = saved
    x = torch.ones(1000)
    distcomm.all_reduce(x, group=group)
    if distcomm.get_rank() == 1:
        time.sleep(timeout * 2.5)
    start = time.monotonic()
    try:
        distcomm.all_reduce(x, group=group)
    except DistTimeoutError as exc:
        return f"{time.monotonic() - start:.2f} {list(exc.missing_ranks or ())} {exc}"
    raise AssertionError(f"rank {distcomm.get_rank()}: no DistTimeoutError")


def two_groups() -> list[Any]:
    """Groups {0, 1} and {2, 3} all_reduce at once, each through its own segment."""
    rank = distcomm.get_rank()
    groups = [distcomm.new_group([0, 1]), distcomm.new_group([2, 3])]
    mine = groups[rank // 2]
    node = transport_after(mine)
    other = distcomm.new_group([0, 1, 2, 3])
    for i in range(200):
        x = torch.full((50_000,), float(rank + i))
        distcomm.all_reduce(x, group=mine)
        pair = [r for r in range(4) if r // 2 == rank // 2]
        want = sum(float(r + i) for r in pair)
        assert bool((x == want).all()), f"rank {rank}: step {i}: {x[0]} != {want}"
        if i % 50 == 0:
            distcomm.all_reduce(x, group=other)
    return [mine.rank, node.calls, transport(mine).segment.map is not transport(other).segment.map]


def transport_after(group: Any) -> Any:
    distcomm.all_reduce(torch.ones(1), group=group)
    return transport(group)


def kill(out_dir: Path) -> None:
    """Rank 1 kills itself mid-collective; the others write the error they got."""
    distcomm.init(timeout=60)
    rank = distcomm.get_rank()
    x = torch.ones(4 * 2**20)  # 16 MiB
    distcomm.all_reduce(x)
    transport(distcomm.get_communicator())
    if rank == 1:
        threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGKILL)).start()
    else:  # as a job that checkpoints on SIGTERM: the launcher's stop does not cut the report
        signal.signal(signal.SIGTERM, lambda *_: None)
    start = time.monotonic()
    try:
        while True:
            distcomm.all_reduce(x)
    except Exception as exc:
        waited = time.monotonic() - start
        (out_dir / f"rank-{rank}.txt").write_text(f"{waited:.2f}\n{type(exc).__name__}: {exc}")
        raise


if __name__ == "__main__":
    {"kill": kill}[sys.argv[1]](Path(sys.argv[2]))
