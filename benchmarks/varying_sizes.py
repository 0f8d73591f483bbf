"""Collectives whose size changes on every call (variable-length batches): what checking them
before the engine costs, against the engine's own call.

Run:  mpirun -n 2 python benchmarks/varying_sizes.py       (mpi: mpi4py's Allreduce, numpy)
      distcomm run -n 2 benchmarks/varying_sizes.py        (gloo: torch's all_reduce, tensors)

A call that follows the one before in a way the ranks never agreed on is confirmed first, and
a call after which the ranks agreed on calls of its op in more than one size is checked first
(an engine given different sizes by different ranks ends the process or hangs). Each side
all-reduces float32 arrays on the same memory: 37 sizes in turn ("varying": 16 to 124 bytes, or
4 to 40 KiB), steps the ranks agreed on past the first turn, so none is checked; or the middle
size again and again ("fixed"), a repeat of a size after which the turn's next size came too,
so every such call is checked (the worst case).
The sides take turns round by round after a warm-up; rank 0 prints each side's median time per
call (min-max over rounds) and the median (min-max) of the per-round ratio distcomm / engine.
"""

from __future__ import annotations

import argparse
import itertools
from typing import Any

import numpy as np
from timing import cell, interleaved, ratio

import distcomm

KINDS = 37
CASES = {"small": (4, 3), "4-40 KiB": (1024, 256)}  # elements: first size, step
CALLS = {"small": 2000, "4-40 KiB": 500}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    comm: Any = distcomm.init()
    rank = comm.rank
    if rank == 0:
        print(f"{comm.world_size} ranks, {comm.backend}, all_reduce of {KINDS} sizes in turn")
        print(f"{'sizes':<9} {'side':<16} {'time per call':>26} {'distcomm/engine':>22}")
    for label, (first, step) in CASES.items():
        arrays = [np.ones(first + step * k, np.float32) for k in range(KINDS)]
        times = interleaved(sides_of(comm, arrays), CALLS[label], args.rounds, distcomm.barrier)
        if rank == 0:
            for name, values in times.items():
                ours_name = name.replace("engine", "distcomm")
                shown = "" if name == ours_name else ratio(times[ours_name], values)
                print(f"{label:<9} {name:<16} {cell(values, 1):>26} {shown:>22}")
    distcomm.finalize()


def sides_of(comm: Any, arrays: list[Any]) -> dict[str, Any]:
    """The four sides: distcomm and the engine, each on the sizes in turn and on one size, on
    copies of ``arrays`` of their own."""
    engine, wrap = engine_call(comm)
    ours, theirs = [wrap(a) for a in arrays], [wrap(a) for a in arrays]
    turn, turn_engine = itertools.cycle(ours), itertools.cycle(theirs)
    fixed, fixed_engine = ours[KINDS // 2], theirs[KINDS // 2]
    return {
        "distcomm varying": lambda: distcomm.all_reduce(next(turn)),
        "engine varying": lambda: engine(next(turn_engine)),
        "distcomm fixed": lambda: distcomm.all_reduce(fixed),
        "engine fixed": lambda: engine(fixed_engine),
    }


def engine_call(comm: Any) -> tuple[Any, Any]:
    """The engine's own all-reduce, and how an array is given to it and to distcomm (numpy on
    mpi, a CPU torch tensor on gloo)."""
    if comm.backend == "mpi":
        from mpi4py import MPI

        allreduce = comm.native.Allreduce
        return (lambda a: allreduce(MPI.IN_PLACE, a)), (lambda a: a.copy())
    import torch
    import torch.distributed as dist

    group = comm.native
    return (lambda t: dist.all_reduce(t, group=group)), (lambda a: torch.from_numpy(a.copy()))


if __name__ == "__main__":
    main()
