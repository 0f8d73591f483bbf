"""What the flight recorder (``DISTCOMM_TRACE``) costs a call: distcomm with and without it, and
mpi4py's own call, on the same memory, in one job, interleaved round by round.

Run:  mpirun -n 2 python benchmarks/trace_cost.py [--rounds 9] [--calls 5000] [--lambda]

The recorder is started as ``DISTCOMM_TRACE=2000`` starts it (set here before ``init``, its
dumps going to a temporary folder removed at exit); each
round times the raw mpi4py call, then distcomm's with the recorder detached from the
communicator ("off") and attached ("on"). Rank 0 prints, per operation at 8 bytes (numpy
float32), each side's median time per call (min-max over rounds), the ratios raw / off and
raw / on, and on / off (issue 43 asks on >= 0.90 of off).

Each side's call is written in the body of its timing loop, as a training loop calls a
collective: the caller's frame lives across calls. With ``--lambda`` each call goes through a
lambda instead (``distcomm bench``'s harness), a fresh frame per call, which the recorder's look
at its caller (:func:`distcomm._call_sites.user_site`) makes Python build an object of.
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
    parser.add_argument(
        "--lambda", dest="lambda_", action="store_true", help="call through a lambda per call"
    )
    args = parser.parse_args()
    folder = tempfile.mkdtemp(prefix="distcomm-trace-cost-")
    atexit.register(shutil.rmtree, folder, True)  # before init: runs after the dump at exit
    os.environ["DISTCOMM_TRACE"], os.environ["DISTCOMM_TRACE_DIR"] = "2000", folder
    comm = distcomm.init(backend="mpi")
    raw = comm.native
    recorder = flight_recorder._current
    assert recorder is not None, "DISTCOMM_TRACE did not start the recorder"
    x, out = np.ones(2, np.float32), np.ones(2 * comm.world_size, np.float32)
    calls = {  # op: (distcomm's call, mpi4py's), as expressions
        "all_reduce": ("comm.all_reduce(x)", "raw.Allreduce(MPI.IN_PLACE, x, MPI.SUM)"),
        "broadcast": ("comm.broadcast(x, 0)", "raw.Bcast(x, 0)"),
        "all_gather": ("comm.all_gather_into_tensor(out, x)", "raw.Allgather(x, out)"),
        "barrier": ("comm.barrier()", "raw.Barrier()"),
    }
    scope = {"comm": comm, "raw": raw, "x": x, "out": out, "MPI": MPI}
    ops = {
        name: (loop(ours, scope, args.lambda_), loop(theirs, scope, args.lambda_))
        for name, (ours, theirs) in calls.items()
    }
    if comm.rank == 0:
        header = ("op", "raw", "off", "on", "raw/off", "raw/on", "on/off")
        print("{:<11} {:>20} {:>20} {:>20} {:>8} {:>8} {:>7}".format(*header))
    for name, (ours, theirs) in ops.items():
        ours(100)  # past the first check points: calls like earlier ones
        times: dict[str, list[float]] = {"raw": [], "off": [], "on": []}
        for round_ in range(args.rounds + 1):  # the first round warms up
            for side in times:
                comm._record_into(recorder if side == "on" else None)
                timed = theirs if side == "raw" else ours
                raw.Barrier()
                took = timed(args.calls)
                if round_:
                    times[side].append(took / args.calls)
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


def loop(call: str, scope: dict[str, object], through_lambda: bool) -> Callable[[int], float]:
    """A function timing ``n`` calls of expression ``call`` (names from ``scope``): written in
    its loop's body, or through a lambda per call."""
    body = "fn()" if through_lambda else call
    source = (
        "def timed(n):\n"
        "    start = perf_counter()\n"
        "    for _ in range(n):\n"
        f"        {body}\n"
        "    return perf_counter() - start\n"
    )
    names = {**scope, "perf_counter": time.perf_counter}
    if through_lambda:
        names["fn"] = eval(f"lambda: {call}", names)
    exec(compile(source, f"<{call}>", "exec"), names)
    return names["timed"]  # type: ignore[return-value]


if __name__ == "__main__":
    main()
