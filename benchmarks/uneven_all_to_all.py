"""The uneven all-to-all of mixture-of-experts routing: distcomm against the engine's own call.

Run:  mpirun -n 2 python benchmarks/uneven_all_to_all.py        (mpi: mpi4py's Alltoallv)
      distcomm run -n 4 benchmarks/uneven_all_to_all.py         (gloo: torch's all_to_all_single)

Each rank holds a float32 array of 64 KiB (and of 4 MiB): 8 experts spread over the ranks, each
rank routing its rows to them with a skewed distribution (expert e gets a share proportional to
e + 1, shifted by the rank and by the step), so every rank sends and receives different counts,
and the counts change from call to call as they do in MoE training (8 routings in turn). Both
sides move the same rows with the same split tables in one job, interleaved round by round
after a warm-up. The engine's side is what a program calling the engine itself runs: for mpi4py,
the counts and displacements of ``Alltoallv`` (in elements) made from the split lists of the
step; torch's ``all_to_all_single`` takes the split lists as they are. On mpi a third side,
"prepared", passes arguments made once per routing (the engine's floor; no program whose routing
changes can do that). Rank 0 prints each side's median time per call (min-max over rounds) and
the median (min-max) of the per-round ratio distcomm / engine. The goal, distcomm at 0.9 of the
engine's speed or better at 64 KiB, is a ratio here of at most 1.11.
"""

from __future__ import annotations

import argparse
import itertools
from typing import Any

import numpy as np
from timing import cell, interleaved, ratio

import distcomm

EXPERTS = 8
ROW = 64  # float32 elements per row (a token's 256 bytes)
SIZES = {"64 KiB": 64 * 1024, "4 MiB": 4 * 1024 * 1024}  # bytes per rank
CALLS = {"64 KiB": 2000, "4 MiB": 50}
STEPS = 8  # routings taken in turn, one per call


def routing(rank: int, world: int, rows: int, step: int) -> list[int]:
    """Rows this rank sends to each rank at ``step``: experts e get shares e + 1 (rotated by the
    rank and the step), and rank r hosts experts r, r + world, ..."""
    weights = [((e + rank + step) % EXPERTS) + 1 for e in range(EXPERTS)]
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
        print(f"{world} ranks, {comm.backend}, {EXPERTS} experts, skewed routing, {STEPS} routings")
        print(f"{'size':<7} {'side':<10} {'time per call':>26} {'distcomm/side':>22}")
    for label, nbytes in SIZES.items():
        rows = nbytes // 4 // ROW
        sent = [routing(rank, world, rows, step) for step in range(STEPS)]
        received = []
        for split in sent:
            counts = np.zeros(world, dtype=np.int64)
            distcomm.all_to_all_single(counts, np.array(split, dtype=np.int64))
            received.append(counts.tolist())
        x = np.ones((rows, ROW), dtype=np.float32)
        full = np.empty((max(sum(r) for r in received), ROW), dtype=np.float32)
        outs = [full[: sum(r)] for r in received]
        steps = itertools.cycle(range(STEPS))

        def ours(
            x: Any = x, outs: Any = outs, r: Any = received, s: Any = sent, steps: Any = steps
        ) -> None:
            k = next(steps)
            distcomm.all_to_all_single(outs[k], x, r[k], s[k])

        sides = {"distcomm": ours, **engine_sides(comm, x, outs, received, sent, steps)}
        times = interleaved(sides, CALLS[label], args.rounds, sync=distcomm.barrier)
        if rank == 0:
            for name, values in times.items():
                shown = "" if name == "distcomm" else ratio(times["distcomm"], values)
                print(f"{label:<7} {name:<10} {cell(values, 1):>26} {shown:>22}")
    distcomm.finalize()


def engine_sides(
    comm: Any,
    x: Any,
    outs: list[Any],
    received: list[list[int]],
    sent: list[list[int]],
    steps: Any,
) -> dict[str, Any]:
    """The engine's own uneven all-to-all on the same memory and split lists."""
    if comm.backend == "mpi":
        alltoallv = comm.native.Alltoallv

        def spec(buffer: Any, split: list[int]) -> list[Any]:
            counts = [n * ROW for n in split]
            return [buffer, (counts, [0, *itertools.accumulate(counts)][:-1])]

        def engine() -> None:
            k = next(steps)
            alltoallv(spec(x, sent[k]), spec(outs[k], received[k]))

        made = [(spec(x, s), spec(o, r)) for s, o, r in zip(sent, outs, received, strict=True)]

        def prepared() -> None:
            alltoallv(*made[next(steps)])

        return {"engine": engine, "prepared": prepared}
    import torch
    import torch.distributed as dist

    tx, touts = torch.from_numpy(x), [torch.from_numpy(o) for o in outs]
    group = comm.native

    def torch_side() -> None:
        k = next(steps)
        dist.all_to_all_single(touts[k], tx, received[k], sent[k], group=group)

    return {"engine": torch_side}


if __name__ == "__main__":
    main()
