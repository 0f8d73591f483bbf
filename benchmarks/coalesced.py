"""all_reduce_coalesced against one all_reduce per tensor: 1000 tensors of 1 KiB, 2 ranks.

Run:  distcomm run -n 2 benchmarks/coalesced.py          (gloo)
      mpirun -n 2 python benchmarks/coalesced.py         (mpi)
      [--rounds 7] [--tensors 1000] [--array torch|numpy]

One job, the sides interleaved round by round after a warm-up: a loop of all_reduce over separate
tensors, all_reduce_coalesced of those tensors (flattened into a scratch buffer and copied back),
and, with torch, all_reduce_coalesced of views of one buffer (``flat.split(256)``, as DDP's
``gradient_as_bucket_view``: reduced in place, no copy). Rank 0 prints each side's median time for
the whole set (min-max over rounds) and the median ratios loop / coalesced (above 1: coalescing is
faster). Goals: 10x on gloo, 3x on mpi.
"""

from __future__ import annotations

import argparse

import numpy as np
import torch
from timing import cell, interleaved, ratio

import distcomm


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--tensors", type=int, default=1000)
    parser.add_argument("--array", choices=("torch", "numpy"), default="torch")
    args = parser.parse_args()
    comm = distcomm.init()
    make = torch.zeros if args.array == "torch" else np.zeros
    tensors = [make(256) for _ in range(args.tensors)]  # float32: 1 KiB each

    def loop() -> None:
        for t in tensors:
            distcomm.all_reduce(t)

    sides = {"loop": loop, "coalesced": lambda: distcomm.all_reduce_coalesced(tensors)}
    if args.array == "torch":
        views = list(torch.zeros(256 * args.tensors).split(256))
        sides["views"] = lambda: distcomm.all_reduce_coalesced(views)
    calls = 3 if comm.backend == "gloo" else 20
    samples = interleaved(sides, calls, args.rounds, sync=distcomm.barrier)
    if comm.rank == 0:
        print(
            f"{comm.world_size} ranks, {comm.backend}, {args.tensors} {args.array} tensors of 1 KiB"
        )
        for name, values in samples.items():
            print(f"{name:<10} {cell(values):>28} per set")
        for name in [name for name in samples if name != "loop"]:
            print(f"loop / {name}: {ratio(samples['loop'], samples[name])}")
    distcomm.finalize()


if __name__ == "__main__":
    main()
