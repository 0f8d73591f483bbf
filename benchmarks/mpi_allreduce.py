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
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np
from mpi4py import MPI

import distcomm

SIZES = {"8 B": 2, "64 MiB": 16 * 1024 * 1024}  # float32 elements
CALLS = {"8 B": 20000, "64 MiB": 5}


def per_call(fn: Callable[[], object], calls: int, comm: Any) -> float:
    comm.Barrier()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - start) / calls


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
            for fn in sides.values():
                per_call(fn, max(1, CALLS[label] // 10), raw)
            times: dict[str, list[float]] = {name: [] for name in sides}
            for _ in range(args.rounds):
                for name, fn in sides.items():
                    times[name].append(per_call(fn, CALLS[label], raw))
            if dc.rank == 0:
                ratios = [d / r for d, r in zip(times["distcomm"], times["raw"], strict=True)]
                ratio = f"{statistics.median(ratios):.3f} ({min(ratios):.3f}-{max(ratios):.3f})"
                print(
                    f"{kind:<6} {label:<7} {_cell(times['distcomm']):>24} "
                    f"{_cell(times['raw']):>24} {ratio:>20}"
                )
    distcomm.finalize()


def _cell(values: list[float]) -> str:
    scale, unit = (1e6, "us") if statistics.median(values) < 1e-2 else (1e3, "ms")
    low, mid, high = min(values) * scale, statistics.median(values) * scale, max(values) * scale
    return f"{mid:.2f} ({low:.2f}-{high:.2f}) {unit}"


if __name__ == "__main__":
    main()
