"""distcomm against its peers, 2 ranks, one run: gloo and mpi, collectives and objects.

Run:  python benchmarks/peers.py [--rounds 7] [--json peers.json] [--plot docs/img/peers.png]
      (by hand, not in CI; PyTorch-Ignite and DeepSpeed are compared where installed:
      pip install pytorch-ignite deepspeed)

Two 2-rank jobs: ``distcomm run -n 2 --backend gloo`` and ``mpirun -n 2``. Inside each job, the
implementations take turns round by round on the same buffers (benchmarks/timing.py: a warm-up
of a tenth of the calls, then ``--rounds`` rounds of a fixed number of calls each, after a
barrier); rank 0's time per call is reported.

- all_reduce of float32 zeros, 8 B, 64 KiB and 64 MiB: distcomm on gloo against raw
  ``torch.distributed``, Ignite's ``idist.all_reduce`` and DeepSpeed's ``deepspeed.comm`` (both on
  the process group distcomm made); distcomm on mpi against raw mpi4py ``Allreduce``.
- all_gather_object and broadcast_object of a 1 KiB object (a dict holding 1000 bytes) and a
  16 MiB one (a dict holding a 16 MiB numpy array): distcomm on gloo against torch's
  ``all_gather_object`` / ``broadcast_object_list``; distcomm on mpi against mpi4py's pickle
  methods (``allgather``, ``bcast``: "mpi4py") and ``mpi4py.util.pkl5`` ("mpi4py pkl5").

The table gives each implementation's median time per call (min-max over rounds) and the median
(min-max) of the per-round ratio other / distcomm: above 1, distcomm is faster.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from checkouts import run_job
from timing import cell, interleaved, ratio

MARKER = "PEERS-RESULT "
REDUCE_SIZES = {"8 B": 2, "64 KiB": 16 * 1024, "64 MiB": 16 * 1024 * 1024}  # float32 elements
OBJECT_SIZES = ("1 KiB", "16 MiB")
CALLS = {  # per round, by engine and size
    "gloo": {"8 B": 300, "64 KiB": 100, "64 MiB": 3, "1 KiB": 100, "16 MiB": 5},
    "mpi": {"8 B": 3000, "64 KiB": 500, "64 MiB": 5, "1 KiB": 2000, "16 MiB": 10},
}


def make_object(label: str) -> dict[str, Any]:
    import numpy as np

    if label == "1 KiB":
        return {"step": 7, "name": "layer.0", "data": b"x" * 1000}
    return {"step": 7, "name": "layer.0", "data": np.ones(4 * 1024 * 1024, dtype=np.float32)}


def gloo_sides(case: str, label: str) -> dict[str, Callable[[], object]]:
    """distcomm on gloo and its torch-based peers for one case."""
    import torch
    import torch.distributed as dist

    import distcomm

    world = dist.get_world_size()
    if case == "all_reduce":
        t = torch.zeros(REDUCE_SIZES[label], dtype=torch.float32)
        sides: dict[str, Callable[[], object]] = {
            "distcomm": lambda: distcomm.all_reduce(t),
            "torch.distributed": lambda: dist.all_reduce(t),
        }
        for name, fn in _torch_peers().items():
            sides[name] = lambda fn=fn: fn(t)
        return sides
    obj = make_object(label)
    if case == "all_gather_object":
        out: list[Any] = [None] * world
        return {
            "distcomm": lambda: distcomm.all_gather_object(obj),
            "torch.distributed": lambda: dist.all_gather_object(out, obj),
        }
    return {
        "distcomm": lambda: distcomm.broadcast_object(obj),
        "torch.distributed": lambda: dist.broadcast_object_list([obj]),
    }


def _torch_peers() -> dict[str, Callable[[Any], object]]:
    """Ignite's and DeepSpeed's all_reduce, where installed, on the existing process group."""
    peers: dict[str, Callable[[Any], object]] = {}
    try:
        import ignite.distributed as idist
    except ImportError:
        pass
    else:
        idist.sync()  # adopt the process group distcomm made
        peers["ignite idist"] = idist.all_reduce
    try:
        import deepspeed.comm as dscomm
    except ImportError:
        pass
    else:
        dscomm.init_distributed(dist_backend="gloo")  # finds the process group distcomm made
        peers["deepspeed.comm"] = dscomm.all_reduce
    return peers


def mpi_sides(case: str, label: str) -> dict[str, Callable[[], object]]:
    """distcomm on mpi and mpi4py's own calls for one case."""
    import numpy as np
    from mpi4py import MPI
    from mpi4py.util import pkl5

    import distcomm

    comm = MPI.COMM_WORLD
    if case == "all_reduce":
        x = np.zeros(REDUCE_SIZES[label], dtype=np.float32)
        return {
            "distcomm": lambda: distcomm.all_reduce(x),
            "mpi4py": lambda: comm.Allreduce(MPI.IN_PLACE, x, MPI.SUM),
        }
    obj, p5 = make_object(label), pkl5.Intracomm(comm)
    if case == "all_gather_object":
        return {
            "distcomm": lambda: distcomm.all_gather_object(obj),
            "mpi4py": lambda: comm.allgather(obj),
            "mpi4py pkl5": lambda: p5.allgather(obj),
        }
    return {
        "distcomm": lambda: distcomm.broadcast_object(obj),
        "mpi4py": lambda: comm.bcast(obj, 0),
        "mpi4py pkl5": lambda: p5.bcast(obj, 0),
    }


def cases() -> list[tuple[str, str]]:
    reduce = [("all_reduce", label) for label in REDUCE_SIZES]
    objs = [(op, s) for op in ("all_gather_object", "broadcast_object") for s in OBJECT_SIZES]
    return reduce + objs


def child(engine: str, rounds: int) -> None:
    """One rank of a job: every case on ``engine``; rank 0 prints the samples as JSON."""
    import distcomm

    distcomm.init(backend=engine)
    results: dict[str, dict[str, list[float]]] = {}
    for case, label in cases():
        sides = (gloo_sides if engine == "gloo" else mpi_sides)(case, label)
        samples = interleaved(sides, CALLS[engine][label], rounds, sync=distcomm.barrier)
        results[f"{case} {label}"] = samples
    if distcomm.get_rank() == 0:
        print(MARKER + json.dumps(results), flush=True)
    distcomm.finalize()


def job(engine: str, rounds: int) -> dict[str, dict[str, list[float]]]:
    bin_dir = Path(sys.executable).parent
    tail = [__file__, "--child", engine, "--rounds", str(rounds)]
    if engine == "mpi":
        argv = [str(bin_dir / "mpirun"), "-n", "2", sys.executable, *tail]
    else:
        argv = [sys.executable, "-m", "distcomm", "run", "-n", "2", "--backend", "gloo", *tail]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DISTCOMM_", "MASTER_"))}
    env.setdefault("OMP_NUM_THREADS", "1")
    env.setdefault("DS_ACCELERATOR", "cpu")  # DeepSpeed on a machine without a GPU
    out = run_job(argv, env, os.getcwd(), 1800)
    for line in out.splitlines():
        if MARKER in line:
            result: dict[str, dict[str, list[float]]] = json.loads(line.split(MARKER, 1)[1])
            return result
    raise SystemExit(f"{engine}: no result in the job's output:\n{out[-3000:]}")


def table(results: dict[str, dict[str, dict[str, list[float]]]]) -> list[str]:
    lines = [
        f"{'engine':<6} {'case':<26} {'implementation':<18} {'per call: median (min-max)':>30} "
        f"{'other / distcomm':>22}"
    ]
    for engine, by_case in results.items():
        for case, sides in by_case.items():
            ours = sides["distcomm"]
            for name, samples in sides.items():
                versus = "" if name == "distcomm" else ratio(samples, ours)
                lines.append(f"{engine:<6} {case:<26} {name:<18} {cell(samples):>30} {versus:>22}")
    return lines


def plot(results: dict[str, dict[str, dict[str, list[float]]]], path: str) -> None:
    """One panel per engine: each case's median time per implementation, log scale."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, panels = plt.subplots(1, len(results), figsize=(7 * len(results), 5.5))
    colors = plt.get_cmap("tab10")
    for axes, (engine, by_case) in zip(panels, results.items(), strict=True):
        names = list(dict.fromkeys(n for sides in by_case.values() for n in sides))
        labelled: set[str] = set()
        for c, sides in enumerate(by_case.values()):
            width = 0.8 / len(sides)
            for i, (name, samples) in enumerate(sides.items()):
                axes.bar(
                    c - 0.4 + width * (i + 0.5),
                    statistics.median(samples) * 1e6,
                    width,
                    color=colors(names.index(name)),
                    label=None if name in labelled else name,
                )
                labelled.add(name)
        axes.set_xticks(range(len(by_case)))
        axes.set_xticklabels(list(by_case), rotation=30, ha="right", fontsize=8)
        axes.set_yscale("log")
        axes.set_ylabel("time per call (us, median; lower is better)")
        axes.set_title(f"{engine}, 2 ranks")
        axes.legend(fontsize=8)
        axes.grid(True, axis="y", which="both", alpha=0.3)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--json", help="also write the samples to this file")
    parser.add_argument("--plot", help="draw the medians to this PNG (needs matplotlib)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.rounds)
        return
    start = time.monotonic()
    results = {engine: job(engine, args.rounds) for engine in ("gloo", "mpi")}
    print(f"{args.rounds} rounds after a warm-up, {time.monotonic() - start:.0f} s; 2 ranks")
    print("\n".join(table(results)))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1) + "\n")
    if args.plot:
        plot(results, args.plot)


if __name__ == "__main__":
    main()
