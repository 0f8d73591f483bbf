"""What torch's default process group beside mpi adds to ``distcomm.init()``, 2 ranks.

Run:  mpirun -n 2 python benchmarks/torch_group_init.py [--rounds 5]

One job: ``init(torch_group=False)`` and ``init(torch_group=True)`` (each followed by an untimed
``finalize()``), interleaved round by round after a warm-up (imports, MPI_Init and the first
group are paid there); rank 0 prints each side's median time per ``init()``, the slowest rank's
(min-max over rounds), and the median ratio.
"""

from __future__ import annotations

import argparse
import time

import torch  # noqa: F401  (a torch program: what "auto" sees)
from mpi4py import MPI
from timing import cell, ratio

import distcomm


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()

    world = MPI.COMM_WORLD  # between two worlds, distcomm has none to synchronise with

    def start(torch_group: bool) -> float:
        world.Barrier()
        began = time.perf_counter()
        distcomm.init(backend="mpi", torch_group=torch_group)
        took = world.allreduce(time.perf_counter() - began, op=MPI.MAX)
        distcomm.finalize()
        return float(took)

    sides = {"without": False, "with": True}
    for torch_group in sides.values():  # the warm-up
        start(torch_group)
    samples: dict[str, list[float]] = {name: [] for name in sides}
    for _ in range(args.rounds):
        for name, torch_group in sides.items():
            samples[name].append(start(torch_group))
    if world.Get_rank() == 0:
        print(f"init() on mpi, {args.rounds} rounds after a warm-up, 2 ranks")
        for name, values in samples.items():
            print(f"  {name:8s} the torch group: {cell(values)}")
        print(f"  with / without: {ratio(samples['with'], samples['without'])}")


if __name__ == "__main__":
    main()
