"""Four ranks in one process, with real data movement: distcomm's in-process FakeLink world.

Run:  python examples/hello_threads.py [WORLD_SIZE]

Each thread is a rank; inside it the module-level API acts as that rank, exactly as it would in
a process started by torchrun, srun or mpirun. Swap run_threads for a real launcher and the
function body stays the same.
"""

from __future__ import annotations

import sys

import numpy as np

import distcomm
from distcomm.testing import run_threads


def train_step() -> str:
    rank, world = distcomm.get_rank(), distcomm.get_world_size()

    grad = np.full(4, float(rank + 1), dtype=np.float32)
    distcomm.all_reduce(grad, op="mean")  # every rank now holds the mean gradient

    config = distcomm.broadcast_object({"lr": 0.1, "seed": 1234} if rank == 0 else None, src=0)
    losses = distcomm.all_gather_object(round(1.0 / (rank + 1), 3))

    evens = distcomm.new_group(range(0, world, 2))  # collective: every rank calls it
    in_evens = ""
    if evens:  # NON_MEMBER (falsy) on odd ranks
        count = np.ones(1, dtype=np.int64)
        distcomm.all_reduce(count, group=evens)
        in_evens = f", even group rank {evens.rank} of {int(count[0])}"

    return (
        f"rank {rank} of {world}: mean grad {grad[0]:.2f}, lr {config['lr']}, "
        f"losses {losses}{in_evens}"
    )


def main() -> None:
    world = int(sys.argv[1]) if len(sys.argv) > 1 else 4
    for line in run_threads(train_step, world):
        print(line)


if __name__ == "__main__":
    main()
