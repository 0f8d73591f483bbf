"""Objects between the processes of one node: node memory against the engine and the peers.

Run:  python benchmarks/node_objects.py [--rounds 7] [--sweep] [--state-dict-gib 1]
      [--state-dict-backends gloo,mpi] [--state-dict-kind torch|numpy] [--skip-objects]
      (by hand, not in CI; 2-rank jobs under ``distcomm run -n 2 --backend gloo`` and
      ``mpirun -n 2``, 4-rank jobs for the state dict)

- 16 MiB objects (a dict holding a 16 MiB float32 numpy array, as benchmarks/peers.py), 2 ranks:
  ``broadcast_object`` and ``all_gather_object`` through node memory ("distcomm"), the same
  calls with node memory off ("distcomm, engine": ``_node_memory.NODE_BYTES`` raised for the
  call, today's path through the engine), and the engine's own object path: torch's
  ``broadcast_object_list`` / ``all_gather_object`` on gloo, mpi4py's ``pkl5`` ``bcast`` /
  ``allgather`` on mpi. Inside each job the sides take turns round by round on the same objects
  (benchmarks/timing.py: a warm-up of a tenth of the calls, at least one, then ``--rounds``
  rounds of a fixed number of calls after a barrier); rank 0's time per call is reported, and
  the median (min-max) of the per-round ratio other / distcomm: above 1, node memory is faster.
- ``--sweep``: the same two calls at 64 KiB to 4 MiB, node memory (its threshold lowered to 0)
  against the engine, to see where node memory starts to win (``NODE_BYTES``).
- ``--state-dict-gib``: a state dict of that many GiB (float32 torch tensors of 16 MiB each, or
  numpy arrays with ``--state-dict-kind numpy``) broadcast from rank 0 to 4 ranks, one job per
  side (peak RSS is a per-process high-water mark): the time per broadcast (one warm-up, then
  ``--rounds`` broadcasts; each rank reads one element of the last tensor, and after the last
  one every byte, as a model loading it would) and every rank's peak RSS (``ru_maxrss``, which
  counts the pages of shared memory a rank touched) before the first broadcast and at the end.
  torch pickles its tensors in band (each storage through ``torch.save`` into the stream),
  numpy arrays go out of band.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from checkouts import marked, run_job
from timing import cell, comparison_table, interleaved

MARKER = "NODE-OBJECTS-RESULT "
OBJECT_MIB = 16
SWEEP = {"64 KiB": 64 * 1024, "256 KiB": 256 * 1024, "1 MiB": 2**20, "4 MiB": 4 * 2**20}
CALLS = {"gloo": 5, "mpi": 10}  # per round, at 16 MiB
ENGINE = "distcomm, engine"


def make_object(nbytes: int) -> dict[str, Any]:
    import numpy as np

    return {"step": 7, "name": "layer.0", "data": np.ones(nbytes // 4, dtype=np.float32)}


def engine_path(fn: Callable[[], object]) -> Callable[[], object]:
    """``fn`` with node memory off: its threshold raised for the call."""
    from distcomm.backend._pipeline import node_memory as _node_memory

    def run() -> object:
        saved, _node_memory.NODE_BYTES = _node_memory.NODE_BYTES, sys.maxsize
        try:
            return fn()
        finally:
            _node_memory.NODE_BYTES = saved

    return run


def node_path(fn: Callable[[], object]) -> Callable[[], object]:
    """``fn`` with node memory for any payload that does not fit in its slot."""
    from distcomm.backend._pipeline import node_memory as _node_memory

    def run() -> object:
        saved, _node_memory.NODE_BYTES = _node_memory.NODE_BYTES, 0
        try:
            return fn()
        finally:
            _node_memory.NODE_BYTES = saved

    return run


def sides(engine: str, case: str, nbytes: int, sweep: bool) -> dict[str, Callable[[], object]]:
    """The implementations of ``case`` for an object of ``nbytes`` on ``engine``."""
    import distcomm

    obj = make_object(nbytes)
    if case == "broadcast_object":
        ours: Callable[[], object] = lambda: distcomm.broadcast_object(obj)  # noqa: E731
    else:
        ours = lambda: distcomm.all_gather_object(obj)  # noqa: E731
    found = {"distcomm": node_path(ours) if sweep else ours, ENGINE: engine_path(ours)}
    if not sweep:
        found.update(peer(engine, case, obj))
    return found


def peer(engine: str, case: str, obj: Any) -> dict[str, Callable[[], object]]:
    """The engine's own object path for ``case``."""
    if engine == "gloo":
        import torch.distributed as dist

        out: list[Any] = [None] * dist.get_world_size()
        if case == "broadcast_object":
            return {"torch.distributed": lambda: dist.broadcast_object_list([obj])}
        return {"torch.distributed": lambda: dist.all_gather_object(out, obj)}
    from mpi4py import MPI
    from mpi4py.util import pkl5

    p5 = pkl5.Intracomm(MPI.COMM_WORLD)
    if case == "broadcast_object":
        return {"mpi4py pkl5": lambda: p5.bcast(obj, 0)}
    return {"mpi4py pkl5": lambda: p5.allgather(obj)}


def objects_child(engine: str, rounds: int, sweep: bool) -> None:
    """One rank of a 2-rank job: every case; rank 0 prints the samples as JSON."""
    import distcomm

    distcomm.init(backend=engine)
    sizes = SWEEP if sweep else {f"{OBJECT_MIB} MiB": OBJECT_MIB * 2**20}
    results: dict[str, dict[str, list[float]]] = {}
    for case in ("broadcast_object", "all_gather_object"):
        for label, nbytes in sizes.items():
            calls = max(CALLS[engine], CALLS[engine] * OBJECT_MIB * 2**20 // nbytes // 8)
            found = sides(engine, case, nbytes, sweep)
            results[f"{case} {label}"] = interleaved(found, calls, rounds, sync=distcomm.barrier)
    if distcomm.get_rank() == 0:
        print(MARKER + json.dumps(results), flush=True)
    distcomm.finalize()


def state_dict_child(engine: str, side: str, gib: float, rounds: int, kind: str) -> None:
    """One rank of a 4-rank job: broadcast a state dict of ``gib`` GiB from rank 0 by
    ``side``; rank 0 prints the times and every rank's peak RSS as JSON."""
    import numpy as np
    import torch

    import distcomm

    comm = distcomm.init(backend=engine)
    tensors = int(gib * 64)  # 16 MiB each
    state = None
    if comm.rank == 0:
        make = torch.full if kind == "torch" else lambda shape, x: np.full(shape, x, np.float32)
        state = {f"layer{i}.weight": make((4096, 1024), float(i)) for i in range(tensors)}
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024

    def broadcast() -> Any:
        if side == "torch.distributed":
            import torch.distributed as dist

            box = [state]
            dist.broadcast_object_list(box)
            return box[0]
        return distcomm.broadcast_object(state)

    run = engine_path(broadcast) if side == ENGINE else broadcast
    times = []
    for i in range(rounds + 1):
        distcomm.barrier()
        start = time.perf_counter()
        got: Any = run()
        if i:
            times.append(time.perf_counter() - start)
        last = f"layer{tensors - 1}.weight"
        assert float(got[last][-1, -1]) == tensors - 1, f"rank {comm.rank}: wrong {last}"
        if i == rounds:  # as a model loading it would: read every byte once, then the peak
            assert sum(float(t.sum()) for t in got.values()) == 4096 * 1024 * sum(range(tensors))
        del got
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    every = distcomm.all_gather_object((before, peak))
    if comm.rank == 0:
        print(MARKER + json.dumps({"times": times, "rss": every}), flush=True)
    distcomm.finalize()


def job(engine: str, nprocs: int, tail: list[str]) -> Any:
    """Run this script's child in an ``nprocs``-rank job on ``engine``; its JSON result."""
    bin_dir = Path(sys.executable).parent
    tail = [__file__, *tail]
    if engine == "mpi":
        argv = [str(bin_dir / "mpirun"), "-n", str(nprocs), sys.executable, *tail]
    else:
        run = [sys.executable, "-m", "distcomm", "run", "-n", str(nprocs), "--backend", "gloo"]
        argv = [*run, *tail]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DISTCOMM_", "MASTER_"))}
    env.setdefault("OMP_NUM_THREADS", "1")
    return marked(run_job(argv, env, os.getcwd(), 1800), MARKER, f"{engine}")


def state_dict_table(engine: str, gib: float, rounds: int, kind: str) -> list[str]:
    lines = [
        f"{engine}, 4 ranks, {gib:g} GiB state dict of {kind} arrays from rank 0 ({rounds} "
        "broadcasts after one):",
        f"{'implementation':<18} {'per broadcast: median (min-max)':>34}   peak RSS MiB, "
        "rank 0 / 1 / 2 / 3 (before the first broadcast)",
    ]
    for side in ("distcomm", ENGINE, "torch.distributed"):
        tail = ["--state-dict-child", engine, side, str(gib), str(rounds), kind]
        result = job(engine, 4, tail)
        rss = " / ".join(f"{peak:.0f} ({before:.0f})" for before, peak in result["rss"])
        lines.append(f"{side:<18} {cell(result['times']):>34}   {rss}")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--sweep", action="store_true", help="64 KiB to 4 MiB instead")
    parser.add_argument("--state-dict-gib", type=float, default=0.0)
    parser.add_argument("--state-dict-backends", default="gloo")
    parser.add_argument("--state-dict-kind", choices=("torch", "numpy"), default="torch")
    parser.add_argument("--skip-objects", action="store_true")
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    parser.add_argument("--state-dict-child", nargs=5, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        objects_child(args.child[0], args.rounds, args.child[1] == "sweep")
        return
    if args.state_dict_child:
        engine, side, gib, rounds, kind = args.state_dict_child
        state_dict_child(engine, side, float(gib), int(rounds), kind)
        return
    start = time.monotonic()
    mode = "sweep" if args.sweep else "objects"
    if not args.skip_objects:
        tail = ["--rounds", str(args.rounds), "--child"]
        results = {engine: job(engine, 2, [*tail, engine, mode]) for engine in ("gloo", "mpi")}
        print(f"{args.rounds} rounds after a warm-up; 2 ranks")
        print("\n".join(comparison_table(results)))
    if args.state_dict_gib:
        for engine in args.state_dict_backends.split(","):
            found = state_dict_table(engine, args.state_dict_gib, args.rounds, args.state_dict_kind)
            print("\n".join(found))
    print(f"{time.monotonic() - start:.0f} s")


if __name__ == "__main__":
    main()
