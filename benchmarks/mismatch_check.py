"""What the mismatch check costs: all_reduce under ``off``, the default (``sample``) and ``check``.

Run:  mpirun -n 2 python benchmarks/mismatch_check.py [--rounds 7]
      distcomm run -n 2 benchmarks/mismatch_check.py      (gloo)

One job, the three policies interleaved round by round after a warm-up, on a float32 numpy array
of 8 bytes and of 64 MiB, with a control: a second group under ``off`` (``off again``), whose
ratio to ``off`` is the noise of the machine (on a 2-core VM, 2 ranks: a few percent at 8 B).
Each policy has a group of every rank of its own, set once and taken past the default's first 64
collectives (where it checks every 1024th only and folds each call into the running value): the
steady state of a training loop. Rank 0 prints each side's median
time per call (min-max over rounds) and the median ratio to ``off``.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

import numpy as np
from timing import cell, interleaved, ratio

import distcomm

SIZES = {"8 B": 2, "64 MiB": 16 * 1024 * 1024}  # float32 elements
POLICIES = ("off", "sample", "check")
#: The sides: each policy's group, and the control (a second group under ``off``).
SIDES = {"off": "off", "sample": "sample", "check": "check", "off again": "off"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    comm: Any = distcomm.init()
    small = comm.backend == "mpi"
    calls = {"8 B": 20000 if small else 1000, "64 MiB": 5}
    groups: dict[str, Any] = {}
    for side, policy in SIDES.items():
        group = groups[side] = distcomm.new_group(range(comm.world_size))
        group.debug = policy
        for _ in range(64):  # past the default's first 64 checked collectives
            group.all_reduce(np.ones(1), op="max")
    if comm.rank == 0:
        print(f"{comm.world_size} ranks, {comm.backend}")
        print(f"{'size':<7} {'policy':<9} {'median (min-max) per call':>30} {'vs off':>22}")
    for label, numel in SIZES.items():
        x = np.zeros(numel, dtype=np.float32)

        def side(name: str, x: Any = x) -> Callable[[], None]:
            return lambda: groups[name].all_reduce(x)

        samples = interleaved(
            {s: side(s) for s in SIDES}, calls[label], args.rounds, sync=distcomm.barrier
        )
        if comm.rank == 0:
            for name, times in samples.items():
                print(f"{label:<7} {name:<9} {cell(times):>30} {ratio(times, samples['off']):>22}")
    for group in groups.values():
        group.finalize()
    distcomm.finalize()


if __name__ == "__main__":
    main()
