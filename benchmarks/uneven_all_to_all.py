"""The uneven all-to-all of mixture-of-experts routing: distcomm against the engine's own call.

Run:  mpirun -n 2 python benchmarks/uneven_all_to_all.py        (mpi: mpi4py's Alltoallv)
      distcomm run -n 4 benchmarks/uneven_all_to_all.py         (gloo: torch's all_to_all_single)

Each rank holds a float32 array of 64 KiB (and of 4 MiB): 8 experts spread over the ranks, each
rank routing its rows to them with a skewed distribution (expert e gets a share proportional to
e + 1, shifted by the rank), so every rank sends and receives different counts. Both sides move
the same rows with the same split tables in one job, interleaved round by round after a
warm-up; the engine side gets its counts and displacements prepared once. Rank 0 prints each
side's median time per call (min-max over rounds) and the median (min-max) of the per-round
ratio distcomm / engine. The goal, distcomm at 0.9 of the engine's speed or better at 64 KiB,
is a ratio here of at most 1.11.
"""

from __future__ import annotations

import argparse
from typing import Any

import numpy as np
from timing import cell, interleaved, ratio

import distcomm

EXPERTS = 8
ROW = 64  # float32 elements per row (a token's 256 bytes)
SIZES = {"64 KiB": 64 * 1024, "4 MiB": 4 * 1024 * 1024}  # bytes per rank
CALLS = {"64 KiB": 2000, "4 MiB": 50}


def routing(rank: int, world: int, rows: int) -> list[int]:
    """Rows this rank sends to each rank: experts e get shares e + 1 (rotated by the rank), and
    rank r hosts experts r, r + world, ..."""
    weights = [((e + rank) % EXPERTS) + 1 for e in range(EXPERTS)]
    per_expert = [rows * w // sum(weights) for w in weights]
    per_expert[-1] += rows - sum(per_expert)
    return [sum(per_expert[e] for e in range(r, EXPERTS, world)) for r in range(world)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    comm: Any = distcomm.init()
    rank, world = comm.rank, comm.world_size
    if rank == 0:
        print(f"{world} ranks, {comm.backend}, {EXPERTS} experts, skewed routing")
        print(f"{'size':<7} {'distcomm':>26} {'engine':>26} {'distcomm/engine':>22}")
    for label, nbytes in SIZES.items():
        rows = nbytes // 4 // ROW
        sent = routing(rank, world, rows)
        counts = np.zeros(world, dtype=np.int64)
        distcomm.all_to_all_single(counts, np.array(sent, dtype=np.int64))
        received = counts.tolist()
        x = np.ones((rows, ROW), dtype=np.float32)
        out = np.empty((sum(received), ROW), dtype=np.float32)
        sides = {
            "distcomm": lambda x=x, out=out, r=received, s=sent: distcomm.all_to_all_single(
                out, x, r, s
            ),
            "engine": engine_side(comm, x, out, received, sent),
        }
        times = interleaved(sides, CALLS[label], args.rounds, sync=distcomm.barrier)
        if rank == 0:
            cells = [cell(times["distcomm"], 1), cell(times["engine"], 1)]
            shown = ratio(times["distcomm"], times["engine"])
            print(f"{label:<7} {cells[0]:>26} {cells[1]:>26} {shown:>22}")
    distcomm.finalize()


def engine_side(comm: Any, x: Any, out: Any, received: list[int], sent: list[int]) -> Any:
    """The engine's own uneven all-to-all on the same memory, its arguments prepared once."""
    if comm.backend == "mpi":

        def starts(counts: list[int]) -> list[int]:
            return [sum(counts[:i]) * ROW for i in range(len(counts))]

        send = [x, ([n * ROW for n in sent], starts(sent))]
        recv = [out, ([n * ROW for n in received], starts(received))]
        return lambda: comm.native.Alltoallv(send, recv)
    import torch
    import torch.distributed as dist

    tx, tout = torch.from_numpy(x), torch.from_numpy(out)
    return lambda: dist.all_to_all_single(tout, tx, received, sent, group=comm.native)


if __name__ == "__main__":
    main()
