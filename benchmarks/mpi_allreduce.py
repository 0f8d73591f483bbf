"""distcomm.all_reduce on the mpi backend against raw mpi4py Allreduce on the same memory.

Run:  mpirun -n 2 python benchmarks/mpi_allreduce.py [--rounds 7]

Both sides run in one job, interleaved round by round after a warm-up: a float32 numpy array and
a float32 CPU torch tensor of 8 bytes and of 64 MiB. The raw side calls
``Allreduce(MPI.IN_PLACE, buffer, MPI.SUM)`` on distcomm's own duplicate of COMM_WORLD with the
buffer prepared once (for torch, its numpy view). Rank 0 prints each side's median time per call
with the min-max over rounds, and the median (min-max) of the per-round ratio distcomm / raw.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

import numpy as np
from mpi4py import MPI
from timing import cell, interleaved, ratio

import distcomm

SIZES = {"8 B": 2, "64 MiB": 16 * 1024 * 1024}  # float32 elements
CALLS = {"8 B": 20000, "64 MiB": 5}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    dc = distcomm.init(backend="mpi")
    raw = dc.native
    arrays: dict[str, Callable[[int], Any]] = {"numpy": lambda n: np.ones(n, dtype=np.float32)}
    try:
        import torch

        arrays["torch"] = lambda n: torch.ones(n, dtype=torch.float32)
    except ImportError:
        pass
    if dc.rank == 0:
        print(f"{dc.world_size} ranks, {MPI.Get_library_version().splitlines()[0]}")
        header = ("array", "size", "distcomm", "raw mpi4py", "ratio")
        print("{:<6} {:<7} {:>24} {:>24} {:>20}".format(*header))
    for kind, make in arrays.items():
        for label, numel in SIZES.items():
            x = make(numel)
            view = x if isinstance(x, np.ndarray) else x.numpy()
            sides = {
                "distcomm": lambda x=x: distcomm.all_reduce(x),
                "raw": lambda v=view: raw.Allreduce(MPI.IN_PLACE, v, MPI.SUM),
            }
            times = interleaved(sides, CALLS[label], args.rounds, sync=raw.Barrier)
            if dc.rank == 0:
                cells = [cell(times["distcomm"], 2), cell(times["raw"], 2)]
                print(
                    f"{kind:<6} {label:<7} {cells[0]:>24} {cells[1]:>24} "
                    f"{ratio(times['distcomm'], times['raw']):>20}"
                )
    distcomm.finalize()


if __name__ == "__main__":
    main()
