"""CPU tensors between the processes of one node: node memory against Gloo and MPICH.

Run:  python benchmarks/node_tensors.py [--rounds 5] [--ranks 2,4] [--sizes 1,16]
      [--ops all_reduce,broadcast,all_gather] [--backend gloo|zmq]
      (by hand, not in CI; one ``mpirun -n N`` job per rank count)

Each job runs distcomm on gloo (``distcomm.init(backend="gloo")`` under mpirun, so that node
memory carries its CPU tensors) beside torch's own Gloo group of the same ranks (the
communicator's ``native``) and mpi4py on MPICH (``COMM_WORLD``: its shared-memory transport), on
the same float32 tensors of each size (MiB): ``all_reduce`` (SUM, in place), ``broadcast`` from
rank 0 and ``all_gather`` (into one tensor). ``--backend zmq`` runs distcomm on zmq instead
(the Gloo side is then torch's default group, which distcomm's zmq backend makes beside it).
Inside a job the sides take turns round by round (benchmarks/timing.py: a warm-up, then
``--rounds`` rounds of a fixed number of calls after a barrier); rank 0's time per call is
reported, with the median (min-max) of the per-round ratio other / distcomm: above 1, distcomm
is faster. Before timing, each job checks that distcomm's all_reduce equals Gloo's.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from checkouts import marked, run_job
from timing import comparison_table, interleaved

MARKER = "NODE-TENSORS-RESULT "
#: Calls per round at 1 MiB; larger sizes make proportionally fewer, at least 3.
CALLS_AT_1MIB = 40


def sides(op: str, x: Any, out: Any, backend: str) -> dict[str, Callable[[], object]]:
    """distcomm's, Gloo's and MPICH's ``op`` on ``x`` (``out``: all_gather's output)."""
    import torch.distributed as dist
    from mpi4py import MPI

    import distcomm

    pg = distcomm.get_communicator().native if backend == "gloo" else None
    world = MPI.COMM_WORLD
    mine, gathered = x.numpy(), out.numpy()
    if op == "all_reduce":
        return {
            "distcomm": lambda: distcomm.all_reduce(x),
            "torch gloo": lambda: dist.all_reduce(x, group=pg),
            "mpi4py MPICH": lambda: world.Allreduce(MPI.IN_PLACE, mine),
        }
    if op == "broadcast":
        return {
            "distcomm": lambda: distcomm.broadcast(x, src=0),
            "torch gloo": lambda: dist.broadcast(x, src=0, group=pg),
            "mpi4py MPICH": lambda: world.Bcast(mine, root=0),
        }
    return {
        "distcomm": lambda: distcomm.all_gather_into_tensor(out, x),
        "torch gloo": lambda: dist.all_gather_into_tensor(out, x, group=pg),
        "mpi4py MPICH": lambda: world.Allgather(mine, gathered),
    }


def child(backend: str, sizes: list[float], ops: list[str], rounds: int) -> None:
    """One rank of a job: every op and size; rank 0 prints the samples as JSON."""
    import torch
    import torch.distributed as dist

    import distcomm

    distcomm.init(backend=backend)
    comm = distcomm.get_communicator()
    pg = comm.native if backend == "gloo" else None
    check = torch.randn(2**18, generator=torch.Generator().manual_seed(comm.rank))
    ours, gloo = check.clone(), check.clone()
    distcomm.all_reduce(ours)
    dist.all_reduce(gloo, group=pg)
    assert torch.allclose(ours, gloo, rtol=1e-5, atol=1e-5), "distcomm's all_reduce is not Gloo's"
    node = comm._node  # the transport: proves it carried the calls
    results: dict[str, dict[str, list[float]]] = {}
    for mib in sizes:
        x = torch.ones(int(mib * 2**20) // 4)
        out = torch.empty(x.numel() * comm.world_size)
        calls = max(3, int(CALLS_AT_1MIB / mib))
        for op in ops:
            before = node.calls if node is not None else 0
            found = sides(op, x, out, backend)
            results[f"{op} {mib:g} MiB"] = interleaved(found, calls, rounds, distcomm.barrier)
            moved = (node.calls if node is not None else 0) - before
            assert moved >= calls * rounds, f"{op}: node memory moved {moved} calls"
    if comm.rank == 0:
        print(MARKER + json.dumps(results), flush=True)
    distcomm.finalize()


def job(nprocs: int, tail: list[str]) -> Any:
    """This script's child in an ``nprocs``-rank mpirun job; its JSON result."""
    mpirun = str(Path(sys.executable).parent / "mpirun")
    argv = [mpirun, "-n", str(nprocs), sys.executable, __file__, *tail]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DISTCOMM_", "MASTER_"))}
    env.setdefault("OMP_NUM_THREADS", "1")
    return marked(run_job(argv, env, os.getcwd(), 1800), MARKER, f"{nprocs} ranks")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--ranks", default="2,4")
    parser.add_argument("--sizes", default="1,16", help="MiB, comma-separated")
    parser.add_argument("--ops", default="all_reduce,broadcast,all_gather")
    parser.add_argument("--backend", choices=("gloo", "zmq"), default="gloo")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    sizes = [float(s) for s in args.sizes.split(",")]
    ops = args.ops.split(",")
    if args.child:
        child(args.backend, sizes, ops, args.rounds)
        return
    start = time.monotonic()
    tail = ["--child", "--backend", args.backend, "--rounds", str(args.rounds)]
    tail += ["--sizes", args.sizes, "--ops", args.ops]
    for nprocs in map(int, args.ranks.split(",")):
        results = {args.backend: job(nprocs, tail)}
        print(f"{nprocs} ranks, {args.rounds} rounds after a warm-up (float32 tensors)")
        print("\n".join(comparison_table(results)))
    print(f"{time.monotonic() - start:.0f} s")


if __name__ == "__main__":
    main()
