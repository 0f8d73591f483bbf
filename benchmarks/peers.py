"""distcomm against its peers, 2 ranks, one run: gloo and mpi, every operation distcomm bench times.

Run:  python benchmarks/peers.py [--rounds 7] [--ops all_reduce,barrier] [--json peers.json]
      [--plot docs/img/peers.png]
      (by hand, not in CI; PyTorch-Ignite and DeepSpeed are compared where installed:
      pip install pytorch-ignite deepspeed)

Two 2-rank jobs: ``distcomm run -n 2 --backend gloo`` and ``mpirun -n 2``. Inside each job, the
implementations take turns round by round on the same buffers (benchmarks/timing.py: a warm-up
of a tenth of the calls, then ``--rounds`` rounds of a fixed number of calls each, after a
barrier); rank 0's time per call is reported.

The operations are distcomm bench's (``distcomm bench --help``), on buffers sized as bench sizes
them (float32 zeros; ``size`` is the whole buffer, each rank's share size/2 for the gathers,
scatters and reduce_scatter), at 8 B and 64 KiB, all_reduce and sendrecv also at 64 MiB (the
others' 64 MiB cases would make the run several times longer: distcomm bench times them against
the engines' own calls); the object operations carry a 1 KiB object (a dict holding 1000 bytes)
or a 16 MiB one (a dict holding a 16 MiB numpy array) per rank; barrier has no size; sendrecv
is a ping-pong between ranks 0 and 1, reported per message (half a round trip), as bench does.
Default run: about 2.5 minutes on this 2-core machine.

- gloo: distcomm's functions against raw ``torch.distributed`` (every operation), Ignite's
  ``idist`` (all_reduce, all_gather (it returns a new tensor), broadcast, barrier and
  all_gather_object, on the process group distcomm made) and DeepSpeed's ``deepspeed.comm``
  (the tensor operations, barrier and sendrecv that it has, on that group).
- mpi: distcomm against mpi4py's own calls (every operation: the buffer methods, ``Barrier``,
  ``Send``/``Recv``, and the pickle methods ``allgather``, ``bcast``, ``gather``, ``scatter`` for
  objects: "mpi4py") and ``mpi4py.util.pkl5`` ("mpi4py pkl5", the object operations).

The table gives each implementation's median time per call (min-max over rounds) and the median
(min-max) of the per-round ratio other / distcomm: above 1, distcomm is faster. Below it, each
peer's operations that are not compared (the peer has no such call, or none this script times).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from checkouts import run_job
from timing import comparison_table, interleaved

from distcomm._bench.operations import OPERATIONS

MARKER = "PEERS-RESULT "
#: distcomm bench's operations, in its order: every one is timed on both engines
OPS = list(OPERATIONS)
OBJECT_OPS = [name for name, op in OPERATIONS.items() if op.kind == "object"]
TENSOR_SIZES = {"8 B": 2, "64 KiB": 16 * 1024, "64 MiB": 16 * 1024 * 1024}  # float32 elements
OBJECT_SIZES = ("1 KiB", "16 MiB")
CALLS = {  # per round, by engine and size ("-": barrier)
    "gloo": {"8 B": 300, "64 KiB": 100, "64 MiB": 3, "1 KiB": 100, "16 MiB": 5, "-": 300},
    "mpi": {"8 B": 3000, "64 KiB": 500, "64 MiB": 5, "1 KiB": 2000, "16 MiB": 10, "-": 3000},
}
Sides = dict[str, Callable[[], object]]


def labels(op: str) -> tuple[str, ...]:
    """The sizes ``op`` is timed at."""
    if op == "barrier":
        return ("-",)
    if op in OBJECT_OPS:
        return OBJECT_SIZES
    return tuple(TENSOR_SIZES) if op in ("all_reduce", "sendrecv") else ("8 B", "64 KiB")


def make_object(label: str) -> dict[str, Any]:
    import numpy as np

    if label == "1 KiB":
        return {"step": 7, "name": "layer.0", "data": b"x" * 1000}
    return {"step": 7, "name": "layer.0", "data": np.ones(4 * 1024 * 1024, dtype=np.float32)}


def buffers(op: str, label: str, make: Callable[[int], Any], rank: int) -> dict[str, Any]:
    """``op``'s float32 buffers at ``label``, 2 ranks, as distcomm bench makes them: ``x`` the
    input, ``out`` the output (sendrecv: what is received), ``full`` root 0's whole buffer for
    gather and scatter, ``parts`` its halves (None off the root)."""
    count = TENSOR_SIZES[label]
    whole = max(2, count // 2 * 2)
    shapes = {"all_gather": (whole // 2, whole), "reduce_scatter": (whole, whole // 2)}
    shapes |= {"all_to_all": (whole, whole), "sendrecv": (count, count)}
    shapes |= {"gather": (whole // 2, 0), "scatter": (whole // 2, 0)}
    x, out = shapes.get(op, (count, 0))
    full = make(whole) if rank == 0 and op in ("gather", "scatter") else None
    parts = None if full is None else [full[: whole // 2], full[whole // 2 :]]
    return {"x": make(x), "out": make(out) if out else None, "full": full, "parts": parts}


def torch_zeros(count: int) -> Any:
    import torch

    return torch.zeros(count, dtype=torch.float32)


def numpy_zeros(count: int) -> Any:
    import numpy as np

    return np.zeros(count, dtype=np.float32)


def ping_pong(
    send: Callable[..., Any], recv: Callable[..., Any], b: dict[str, Any], rank: int
) -> Callable[[], object]:
    """sendrecv: rank 0 sends ``x`` to rank 1 and receives into ``out``; rank 1 the reverse."""
    x, y = b["x"], b["out"]
    if rank == 0:
        return lambda: (send(x, 1), recv(y, 1))
    return lambda: (recv(y, 0), send(x, 0))


def distcomm_side(op: str, b: dict[str, Any], rank: int) -> Callable[[], object]:
    """distcomm's function for a tensor operation (or barrier) on ``b``."""
    import distcomm

    x, out, parts = b["x"], b["out"], b["parts"]
    calls: Sides = {
        "all_reduce": lambda: distcomm.all_reduce(x),
        "broadcast": lambda: distcomm.broadcast(x, 0),
        "reduce": lambda: distcomm.reduce(x, 0),
        "all_gather": lambda: distcomm.all_gather_into_tensor(out, x),
        "reduce_scatter": lambda: distcomm.reduce_scatter_tensor(out, x),
        "all_to_all": lambda: distcomm.all_to_all_single(out, x),
        "gather": lambda: distcomm.gather(x, parts, 0),
        "scatter": lambda: distcomm.scatter(x, parts, 0),
        "barrier": distcomm.barrier,
    }
    return ping_pong(distcomm.send, distcomm.recv, b, rank) if op == "sendrecv" else calls[op]


def gloo_sides(op: str, label: str) -> Sides:
    """distcomm on gloo and its torch-based peers for one case."""
    import torch.distributed as dist

    if op in OBJECT_OPS:
        return gloo_object_sides(op, label)
    rank = dist.get_rank()
    b = buffers(op, "8 B" if op == "barrier" else label, torch_zeros, rank)
    x, out, parts = b["x"], b["out"], b["parts"]
    gather_into = getattr(dist, "all_gather_single", dist.all_gather_into_tensor)
    scatter_into = getattr(dist, "reduce_scatter_single", dist.reduce_scatter_tensor)
    torch_calls: Sides = {
        "all_reduce": lambda: dist.all_reduce(x),
        "broadcast": lambda: dist.broadcast(x, 0),
        "reduce": lambda: dist.reduce(x, 0),
        "all_gather": lambda: gather_into(out, x),
        "reduce_scatter": lambda: scatter_into(out, x),
        "all_to_all": lambda: dist.all_to_all_single(out, x),
        "gather": lambda: dist.gather(x, parts, 0),
        "scatter": lambda: dist.scatter(x, parts, 0),
        "barrier": dist.barrier,
        "sendrecv": ping_pong(dist.send, dist.recv, b, rank),
    }
    sides: Sides = {"distcomm": distcomm_side(op, b, rank), "torch.distributed": torch_calls[op]}
    for name, calls in _torch_peers(b, rank).items():
        if op in calls:
            sides[name] = calls[op]
    return sides


def gloo_object_sides(op: str, label: str) -> Sides:
    """distcomm's object operations on gloo against torch's (and Ignite's all_gather)."""
    import torch.distributed as dist

    import distcomm

    obj, rank = make_object(label), dist.get_rank()
    objs = [obj, obj] if rank == 0 else None
    out: list[Any] = [None, None]
    box: list[Any] = [None]
    ours: Sides = {
        "all_gather_object": lambda: distcomm.all_gather_object(obj),
        "broadcast_object": lambda: distcomm.broadcast_object(obj),
        "gather_object": lambda: distcomm.gather_object(obj, 0),
        "scatter_object": lambda: distcomm.scatter_object(objs, 0),
    }
    theirs: Sides = {
        "all_gather_object": lambda: dist.all_gather_object(out, obj),
        "broadcast_object": lambda: dist.broadcast_object_list([obj]),
        "gather_object": lambda: dist.gather_object(obj, out if rank == 0 else None, dst=0),
        "scatter_object": lambda: dist.scatter_object_list(box, objs, src=0),
    }
    sides: Sides = {"distcomm": ours[op], "torch.distributed": theirs[op]}
    idist = _ignite()
    if idist is not None and op == "all_gather_object":
        sides["ignite idist"] = lambda: idist.all_gather(obj)
    return sides


@functools.cache
def _ignite() -> Any:
    """Ignite's idist on the process group distcomm made, where installed (else None)."""
    try:
        import ignite.distributed as idist
    except ImportError:
        return None
    idist.sync()  # adopt the process group distcomm made
    return idist


@functools.cache
def _deepspeed() -> Any:
    """deepspeed.comm on the process group distcomm made, where installed (else None)."""
    try:
        import deepspeed.comm as ds
    except ImportError:
        return None
    ds.init_distributed(dist_backend="gloo")  # finds the process group distcomm made
    return ds


def _torch_peers(b: dict[str, Any], rank: int) -> dict[str, Sides]:
    """Ignite's and DeepSpeed's calls, where installed, on the existing process group: by peer,
    by operation (the operations a peer lacks are absent)."""
    x, out, parts = b["x"], b["out"], b["parts"]
    peers: dict[str, Sides] = {}
    idist = _ignite()
    if idist is not None:
        peers["ignite idist"] = {
            "all_reduce": lambda: idist.all_reduce(x),
            "all_gather": lambda: idist.all_gather(x),
            "broadcast": lambda: idist.broadcast(x, 0),
            "barrier": idist.barrier,
        }
    ds = _deepspeed()
    if ds is None:
        return peers
    wanted: dict[str, tuple[str, Callable[[Callable[..., Any]], Callable[[], object]]]] = {
        "all_reduce": ("all_reduce", lambda f: lambda: f(x)),
        "broadcast": ("broadcast", lambda f: lambda: f(x, 0)),
        "reduce": ("reduce", lambda f: lambda: f(x, 0)),
        "all_gather": ("all_gather_into_tensor", lambda f: lambda: f(out, x)),
        "reduce_scatter": ("reduce_scatter_tensor", lambda f: lambda: f(out, x)),
        "all_to_all": ("all_to_all_single", lambda f: lambda: f(out, x)),
        "gather": ("gather", lambda f: lambda: f(x, parts, 0)),
        "scatter": ("scatter", lambda f: lambda: f(x, parts, 0)),
        "barrier": ("barrier", lambda f: lambda: f()),
    }
    peers["deepspeed.comm"] = {
        op: wrap(getattr(ds, name)) for op, (name, wrap) in wanted.items() if hasattr(ds, name)
    }
    if hasattr(ds, "send") and hasattr(ds, "recv"):
        peers["deepspeed.comm"]["sendrecv"] = ping_pong(ds.send, ds.recv, b, rank)
    return peers


def mpi_sides(op: str, label: str) -> Sides:
    """distcomm on mpi and mpi4py's own calls for one case."""
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    if op in OBJECT_OPS:
        return mpi_object_sides(op, label)
    b = buffers(op, "8 B" if op == "barrier" else label, numpy_zeros, comm.rank)
    x, out, full = b["x"], b["out"], b["full"]
    root = comm.rank == 0
    calls: Sides = {
        "all_reduce": lambda: comm.Allreduce(MPI.IN_PLACE, x, MPI.SUM),
        "broadcast": lambda: comm.Bcast(x, 0),
        "reduce": (
            (lambda: comm.Reduce(MPI.IN_PLACE, x, MPI.SUM, 0))
            if root
            else (lambda: comm.Reduce(x, None, MPI.SUM, 0))
        ),
        "all_gather": lambda: comm.Allgather(x, out),
        "reduce_scatter": lambda: comm.Reduce_scatter_block(x, out, MPI.SUM),
        "all_to_all": lambda: comm.Alltoall(x, out),
        "gather": lambda: comm.Gather(x, full, 0),
        "scatter": lambda: comm.Scatter(full, x, 0),
        "barrier": comm.Barrier,
        "sendrecv": ping_pong(comm.Send, comm.Recv, b, comm.rank),
    }
    return {"distcomm": distcomm_side(op, b, comm.rank), "mpi4py": calls[op]}


def mpi_object_sides(op: str, label: str) -> Sides:
    """distcomm's object operations on mpi against mpi4py's pickle methods and pkl5's."""
    from mpi4py import MPI
    from mpi4py.util import pkl5

    import distcomm

    comm = MPI.COMM_WORLD
    obj, p5 = make_object(label), pkl5.Intracomm(comm)
    objs = [obj, obj] if comm.rank == 0 else None
    ours: Sides = {
        "all_gather_object": lambda: distcomm.all_gather_object(obj),
        "broadcast_object": lambda: distcomm.broadcast_object(obj),
        "gather_object": lambda: distcomm.gather_object(obj, 0),
        "scatter_object": lambda: distcomm.scatter_object(objs, 0),
    }
    sides: Sides = {"distcomm": ours[op]}
    for name, c in (("mpi4py", comm), ("mpi4py pkl5", p5)):
        sides[name] = {
            "all_gather_object": lambda c=c: c.allgather(obj),
            "broadcast_object": lambda c=c: c.bcast(obj, 0),
            "gather_object": lambda c=c: c.gather(obj, 0),
            "scatter_object": lambda c=c: c.scatter(objs, 0),
        }[op]
    return sides


def case_name(op: str, label: str) -> str:
    return op if label == "-" else f"{op} {label}"


def child(engine: str, rounds: int, ops: list[str]) -> None:
    """One rank of a job: every case of ``ops`` on ``engine``; rank 0 prints the samples as
    JSON (sendrecv's per message: half a round trip)."""
    import distcomm

    distcomm.init(backend=engine)
    results: dict[str, dict[str, list[float]]] = {}
    for op in ops:
        for label in labels(op):
            sides = (gloo_sides if engine == "gloo" else mpi_sides)(op, label)
            samples = interleaved(sides, CALLS[engine][label], rounds, sync=distcomm.barrier)
            if op == "sendrecv":
                samples = {name: [t / 2 for t in times] for name, times in samples.items()}
            results[case_name(op, label)] = samples
    if distcomm.get_rank() == 0:
        print(MARKER + json.dumps(results), flush=True)
    distcomm.finalize()


def job(engine: str, rounds: int, ops: list[str]) -> dict[str, dict[str, list[float]]]:
    bin_dir = Path(sys.executable).parent
    tail = [__file__, "--child", engine, "--rounds", str(rounds), "--ops", ",".join(ops)]
    if engine == "mpi":
        mpirun = bin_dir / "mpirun"  # the venv's MPICH, else the system's MPI
        argv = [str(mpirun) if mpirun.exists() else "mpirun", "-n", "2", sys.executable, *tail]
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


Results = dict[str, dict[str, dict[str, list[float]]]]  # engine -> case -> side -> samples


def peers() -> dict[str, list[str]]:
    """Each engine's peers that are installed here (the ones a job may time)."""
    import importlib.util

    gloo = ["torch.distributed"]
    gloo += [name for module, name in _OPTIONAL if importlib.util.find_spec(module) is not None]
    return {"gloo": gloo, "mpi": ["mpi4py", "mpi4py pkl5"]}


_OPTIONAL = (("ignite", "ignite idist"), ("deepspeed", "deepspeed.comm"))


def not_compared(results: Results, ops: list[str]) -> list[str]:
    """For each engine's peers, the operations of ``ops`` it was not timed on (it has no such
    call, or none this script times): one line per peer, "none" where it has them all."""
    lines = []
    for engine, by_case in results.items():
        covered: dict[str, set[str]] = {name: set() for name in peers()[engine]}
        for case, sides in by_case.items():
            for name in sides:
                covered.setdefault(name, set()).add(case.split()[0])
        for name, has in covered.items():
            if name != "distcomm":
                lacks = ", ".join(op for op in ops if op not in has) or "none"
                lines.append(f"{engine:<6} {name:<18} not compared: {lacks}")
    missing = [name for module, name in _OPTIONAL if name not in peers()["gloo"]]
    if missing:
        lines.append(f"not installed, not compared: {', '.join(missing)}")
    return lines


def plot(results: Results, path: str) -> None:
    """One panel per engine: each case's median time per implementation, log scale."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cases = max(len(by_case) for by_case in results.values())
    width = max(7.0, 0.45 * cases)
    figure, panels = plt.subplots(len(results), 1, figsize=(width, 5.5 * len(results)))
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


def parse_ops(text: str) -> list[str]:
    """``--ops``: a comma list of distcomm bench's operations."""
    ops = [op.strip() for op in text.split(",") if op.strip()]
    unknown = [op for op in ops if op not in OPS]
    if unknown or not ops:
        raise argparse.ArgumentTypeError(
            f"unknown operation {', '.join(unknown) or '(none)'}; valid: {', '.join(OPS)}"
        )
    return ops


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--json", help="also write the samples to this file")
    parser.add_argument("--plot", help="draw the medians to this PNG (needs matplotlib)")
    parser.add_argument(
        "--ops",
        type=parse_ops,
        default=OPS,
        help=f"comma-separated operations (default: all of distcomm bench's: {', '.join(OPS)})",
    )
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.rounds, args.ops)
        return
    start = time.monotonic()
    results = {engine: job(engine, args.rounds, args.ops) for engine in ("gloo", "mpi")}
    print(f"{args.rounds} rounds after a warm-up, {time.monotonic() - start:.0f} s; 2 ranks")
    print("\n".join(comparison_table(results)))
    print("barrier: per barrier; sendrecv: per message, half a round trip between ranks 0 and 1")
    print("Operations not compared with a peer (it has no such call, or none this script times):")
    print("\n".join(not_compared(results, args.ops)))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1) + "\n")
    if args.plot:
        plot(results, args.plot)


if __name__ == "__main__":
    main()
