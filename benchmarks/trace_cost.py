"""What the flight recorder (``DISTCOMM_TRACE``) costs a call: distcomm with and without it, and
mpi4py's own call, on the same memory, in one job, interleaved round by round.

Run:  mpirun -n 2 python benchmarks/trace_cost.py [--rounds 9] [--calls 5000]

The recorder is started as ``DISTCOMM_TRACE=2000`` starts it (set here before ``init``, its
dumps going to a temporary folder removed at exit); each
round times the raw mpi4py call, then distcomm's with the recorder detached from the
communicator ("off") and attached ("on"). Rank 0 prints, per operation at 8 bytes (numpy
float32), each side's median time per call (min-max over rounds), the ratios raw / off and
raw / on, and on / off (issue 43 asks on >= 0.90 of off).
"""

from __future__ import annotations

import argparse
import atexit
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable

import numpy as np
from mpi4py import MPI
from timing import cell

import distcomm
from distcomm._runtime import flight_recorder


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--calls", type=int, default=5000)
    args = parser.parse_args()
    folder = tempfile.mkdtemp(prefix="distcomm-trace-cost-")
    atexit.register(shutil.rmtree, folder, True)  # before init: runs after the dump at exit
    os.environ["DISTCOMM_TRACE"], os.environ["DISTCOMM_TRACE_DIR"] = "2000", folder
    comm = distcomm.init(backend="mpi")
    raw = comm.native
    recorder = flight_recorder._current
    assert recorder is not None, "DISTCOMM_TRACE did not start the recorder"
    x, out = np.ones(2, np.float32), np.ones(2 * comm.world_size, np.float32)
    ops: dict[str, tuple[Callable[[], object], Callable[[], object]]] = {
        "all_reduce": (lambda: comm.all_reduce(x), lambda: raw.Allreduce(MPI.IN_PLACE, x, MPI.SUM)),
        "broadcast": (lambda: comm.broadcast(x, 0), lambda: raw.Bcast(x, 0)),
        "all_gather": (
            lambda: comm.all_gather_into_tensor(out, x),
            lambda: raw.Allgather(x, out),
        ),
        "barrier": (comm.barrier, raw.Barrier),
    }
    if comm.rank == 0:
        header = ("op", "raw", "off", "on", "raw/off", "raw/on", "on/off")
        print("{:<11} {:>20} {:>20} {:>20} {:>8} {:>8} {:>7}".format(*header))
    for name, (ours, theirs) in ops.items():
        for _ in range(100):  # past the first check points: calls like earlier ones
            ours()
        times: dict[str, list[float]] = {"raw": [], "off": [], "on": []}
        for round_ in range(args.rounds + 1):  # the first round warms up
            for side in times:
                comm._record_into(recorder if side == "on" else None)
                fn = theirs if side == "raw" else ours
                raw.Barrier()
                start = time.perf_counter()
                for _ in range(args.calls):
                    fn()
                if round_:
                    times[side].append((time.perf_counter() - start) / args.calls)
        if comm.rank == 0:
            med = {side: statistics.median(t) for side, t in times.items()}
            print(
                f"{name:<11} {cell(times['raw'], 2):>20} {cell(times['off'], 2):>20} "
                f"{cell(times['on'], 2):>20} {med['raw'] / med['off']:>8.2f} "
                f"{med['raw'] / med['on']:>8.2f} {med['off'] / med['on']:>7.2f}"
            )
    comm._record_into(recorder)
    recorder.stop()
    distcomm.finalize()


if __name__ == "__main__":
    main()
