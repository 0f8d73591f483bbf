"""What distcomm's template adds to a collective call, with an engine that costs nothing.

A "null" engine whose ``all_reduce`` returns at once isolates BaseCommunicator's work: op
normalisation, the numpy/torch adapter, the fast-path checks and the module-level dispatch. Each
round times, interleaved, the engine's method called directly (the floor: one Python call), the
communicator method, and the module-level ``distcomm.all_reduce(..., group=comm)``, for a numpy
array and a torch tensor of 2 float32 (8 bytes). A real engine's own cost comes on top of both
sides, so the added microseconds are what to compare with it (raw mpi4py Allreduce of 8 bytes is
about 1.5 us here, ../shared/MACHINE.md).

Run:  python benchmarks/overhead.py [--rounds 7] [--calls 100000]
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Callable
from typing import Any

import numpy as np
from timing import interleaved

import distcomm
from distcomm.backend import BaseCommunicator, Capabilities
from distcomm.environment import LaunchInfo


class NullEngine:
    """An engine whose ``all_reduce`` does nothing (the rest raise: the benchmark never calls
    them)."""

    def all_reduce(self, tensor: Any, op: distcomm.ReduceOp, async_op: bool) -> None:
        return None

    def _never(self, *args: Any) -> Any:
        raise NotImplementedError("the null engine only all-reduces")

    broadcast = all_gather_into = isend = irecv = split = _never


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=7, help="timed rounds after a warm-up")
    parser.add_argument("--calls", type=int, default=100_000, help="calls per side per round")
    args = parser.parse_args()

    comm = BaseCommunicator(  # rank 0 of a world of 2 whose engine does nothing
        NullEngine(),
        backend="null",
        capabilities=Capabilities(node_memory=False),  # one process: nothing to prove
        rank=0,
        world_size=2,
        launch=LaunchInfo("env", 0, 2, 0, 2, 0, 1),
    )
    arrays: dict[str, Any] = {"numpy": np.zeros(2, dtype=np.float32)}
    try:
        import torch

        arrays["torch"] = torch.zeros(2, dtype=torch.float32)
    except ImportError:
        pass
    op = distcomm.ReduceOp.SUM
    header = ("array", "side", "median us", "min-max us", "added us", "ratio")
    print("{:<6} {:<22} {:>10} {:>16} {:>9} {:>6}".format(*header))
    for kind, x in arrays.items():
        sides: dict[str, Callable[[], Any]] = {
            "primitive (floor)": lambda x=x: comm.engine.all_reduce(x, op, False),
            "comm.all_reduce": lambda x=x: comm.all_reduce(x),
            "distcomm.all_reduce": lambda x=x: distcomm.all_reduce(x, group=comm),
        }
        samples = {
            name: [t * 1e6 for t in values]
            for name, values in interleaved(sides, args.calls, args.rounds).items()
        }
        floor = statistics.median(samples["primitive (floor)"])
        for name, values in samples.items():
            median = statistics.median(values)
            spread = f"{min(values):.3f}-{max(values):.3f}"
            print(
                f"{kind:<6} {name:<22} {median:>10.3f} {spread:>16} "
                f"{median - floor:>9.3f} {median / floor:>6.1f}"
            )


if __name__ == "__main__":
    main()
