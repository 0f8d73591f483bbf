"""The programs scripts/gpu-check.sh runs on a GPU machine, one per part (each rank runs it):

    python scripts/gpu_check.py world-of-one   NCCL in a world of 1, the shortcut off
    python scripts/gpu_check.py gloo-cuda      CUDA tensors on gloo (staged through the host)
    python scripts/gpu_check.py ddp            DDP on nccl: gradients averaged on the GPUs
    python scripts/gpu_check.py timeout        a skipped collective on nccl: DistTimeoutError
    python scripts/gpu_check.py mismatch       a mismatched collective on nccl: named
    python scripts/gpu_check.py tags           a tagged message on nccl: refused, clearly
    python scripts/gpu_check.py groups         split, new_group and a group of a group on nccl
    python scripts/gpu_check.py init           init() and finalize() alone (more ranks than GPUs)

Each prints ``ok: ...`` on success and raises (exit 1) with what went wrong otherwise.
"""

from __future__ import annotations

import os
import sys
import time
import warnings
from collections.abc import Callable

import torch

import distcomm


def world_of_one() -> None:
    comm = distcomm.init(backend="nccl", device="cuda")
    comm.world_of_one_shortcut = False  # NCCL itself, not distcomm's shortcut
    device = torch.device(comm.bound_device)
    t = torch.arange(4.0, device=device)
    distcomm.all_reduce(t)
    distcomm.broadcast(t, 0)
    out = torch.zeros(4, device=device)
    distcomm.all_gather_into_tensor(out, t)
    work = distcomm.all_reduce(t, async_op=True)
    work.wait()
    torch.cuda.synchronize(device)
    assert t.tolist() == out.tolist() == [0.0, 1.0, 2.0, 3.0], (t, out)
    assert distcomm.all_gather_object({"rank": 0}) == [{"rank": 0}]
    distcomm.finalize()
    print(f"ok: a world of 1 on {device} ran NCCL's collectives")


def gloo_cuda() -> None:
    comm = distcomm.init(backend="gloo")
    device = torch.device("cuda", comm.launch.local_rank % torch.cuda.device_count())
    t = torch.full((1000,), float(comm.rank + 1), device=device)
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        distcomm.all_reduce(t)
    expected = comm.world_size * (comm.world_size + 1) / 2
    assert t.device == device and bool((t == expected).all()), t[:4]
    assert any("staged" in str(w.message) or "host" in str(w.message) for w in said), [
        str(w.message) for w in said
    ]
    distcomm.finalize()
    print(f"ok: gloo moved a CUDA tensor through host memory (sum {expected:g})")


def ddp() -> None:
    comm = distcomm.init(backend="nccl")
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 1).to(torch.device(comm.bound_device))
    wrapped = torch.nn.parallel.DistributedDataParallel(
        model, device_ids=[torch.device(comm.bound_device).index], process_group=comm.native
    )
    x = torch.full((4, 8), float(comm.rank + 1), device=torch.device(comm.bound_device))
    wrapped(x).sum().backward()
    grads = [torch.zeros_like(model.weight) for _ in range(comm.world_size)]
    distcomm.all_gather(grads, model.weight.grad)
    assert all(torch.equal(g, grads[0]) for g in grads), "DDP left the ranks' gradients apart"
    distcomm.finalize()
    print(f"ok: DDP on nccl averaged the gradients of {comm.world_size} rank(s)")


def timeout() -> None:
    comm = distcomm.init(backend="nccl", timeout=float(os.environ.get("GPU_CHECK_TIMEOUT", "10")))
    t = torch.ones(4, device=torch.device(comm.bound_device))
    distcomm.all_reduce(t)
    if comm.rank == 1:
        time.sleep(3 * comm.timeout)
        print("ok: rank 1 skipped a collective")
        os._exit(0)  # the others' communicators are retired; nothing to finalize with them
    start = time.monotonic()
    try:
        distcomm.all_reduce(t)
    except distcomm.DistTimeoutError as exc:
        waited = time.monotonic() - start
        assert exc.seq == 2 and list(exc.missing_ranks or ()) == [1], str(exc)
        print(f"ok: rank {comm.rank}: DistTimeoutError after {waited:.1f} s naming rank 1")
        os._exit(0)
    raise AssertionError("a collective that rank 1 skipped completed")


def mismatch() -> None:
    comm = distcomm.init(backend="nccl")
    n = 6 if comm.rank == 1 else 4
    t = torch.ones(n, device=torch.device(comm.bound_device))
    try:
        distcomm.all_reduce(t)
    except distcomm.CollectiveMismatchError as exc:
        assert exc.seq == 1, str(exc)
        print(f"ok: rank {comm.rank}: {str(exc).splitlines()[0]}")
        distcomm.finalize()
        return
    raise AssertionError("a mismatched all_reduce went through")


def tags() -> None:
    comm = distcomm.init(backend="nccl")
    t = torch.ones(4, device=torch.device(comm.bound_device))
    try:
        if comm.rank == 0:
            distcomm.send(t, 1, tag=7)
        else:
            distcomm.recv(t, 0, tag=7)
    except distcomm.InvalidArgumentError as exc:
        print(f"ok: rank {comm.rank}: {str(exc).splitlines()[0]}")
        distcomm.finalize()
        return
    raise AssertionError("a tagged message went to NCCL, which ignores tags")


def groups() -> None:
    """Groups on a device-bound default group: torch splits the NCCL groups every rank makes
    from it; a group of a group (its members only) and the Gloo side groups must not be."""
    comm = distcomm.init(backend="nccl")
    world = comm.world_size
    halves = comm.split(comm.rank % 2)  # every rank: NCCL split from the world's communicator
    inner = halves.new_group([0])  # a group of a group: made by the half's members only
    everyone = distcomm.new_group(list(range(world)))
    t = torch.ones(2, device=torch.device(comm.bound_device))
    distcomm.all_reduce(t, group=everyone)
    distcomm.all_reduce(t, group=halves)
    if inner:
        distcomm.all_reduce(t, group=inner)
    half = len(range(comm.rank % 2, world, 2))
    assert t.tolist() == [world * half] * 2, t
    assert distcomm.all_gather_object(comm.rank, group=halves) == list(
        range(comm.rank % 2, world, 2)
    )
    distcomm.finalize()
    print(f"ok: rank {comm.rank}: split, new_group and a group of a group on nccl")


def init() -> None:
    comm = distcomm.init()
    distcomm.finalize()
    print(f"ok: rank {comm.rank}: init() on {comm.backend}")


PARTS: dict[str, Callable[[], None]] = {
    "init": init,
    "groups": groups,
    "world-of-one": world_of_one,
    "gloo-cuda": gloo_cuda,
    "ddp": ddp,
    "timeout": timeout,
    "mismatch": mismatch,
    "tags": tags,
}

if __name__ == "__main__":
    PARTS[sys.argv[1]]()
