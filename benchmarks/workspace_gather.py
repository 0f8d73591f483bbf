"""modelopt's get_tensors_parallel (distcomm.workspace, shared memory) against a gloo gather.

Run:  distcomm run -n 4 benchmarks/workspace_gather.py [--rounds 5] [--mib 64]

Every rank holds a float32 tensor of ``--mib`` MiB; rank 0 receives all of them. Both sides run
in one gloo job, interleaved round by round after a warm-up: ``get_tensors_parallel`` (files in
/dev/shm; only their description goes through gloo) and ``torch.distributed.gather`` into
preallocated tensors; on rank 0 each side then reads every received byte (a sum), as a consumer
would. Rank 0 prints each side's median time per gather (min-max over rounds) and
the median (min-max) of the per-round ratio shared memory / gloo.
"""

from __future__ import annotations

import argparse

import torch
import torch.distributed as dist
from timing import cell, interleaved, ratio

import distcomm
from distcomm.compat import modelopt


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--mib", type=int, default=64)
    args = parser.parse_args()
    comm = distcomm.init(backend="gloo")
    world = comm.world_size
    tensor = torch.full((args.mib * 1024 * 1024 // 4,), float(comm.rank))
    ranks = list(range(world))
    outputs = [torch.empty_like(tensor) for _ in ranks] if comm.rank == 0 else None

    def merge(tensors: list[torch.Tensor]) -> None:  # what a consumer does: read every byte
        assert sum(float(t.sum()) for t in tensors) == sum(ranks) * tensor.numel()

    def through_shm() -> None:
        with modelopt.get_tensors_parallel(tensor, ranks) as tensors:
            if tensors:
                merge(tensors)

    def through_gloo() -> None:
        dist.gather(tensor, outputs, dst=0)
        if outputs is not None:
            merge(outputs)

    times = interleaved(
        {"shm": through_shm, "gloo": through_gloo}, 3, args.rounds, sync=distcomm.barrier
    )
    if comm.rank == 0:
        shm, gloo = times["shm"], times["gloo"]
        print(f"{world} ranks x {args.mib} MiB to rank 0, torch {torch.__version__}")
        print(f"{'get_tensors_parallel (shm)':<28} {cell(shm):>24}")
        print(f"{'torch.distributed.gather':<28} {cell(gloo):>24}")
        print(f"{'ratio shm / gloo':<28} {ratio(shm, gloo):>24}")
    distcomm.finalize()


if __name__ == "__main__":
    main()
