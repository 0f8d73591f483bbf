"""distcomm of two checkouts (an old and a new source tree) against each other.

Run:  python benchmarks/checkouts.py --old /tmp/old-distcomm --new . [--rounds 7]
          [--rows all_reduce|objects] [--backends gloo,mpi] [--reps 5]

One run interleaves 2-rank jobs of both trees: each round, for each backend, a job of one tree
then a job of the other, the tree that goes first alternating round by round; a first round
(not counted) warms up. A job imports its tree alone: PYTHONPATH holds the tree and its
``backends/*`` folders (ahead of the editable installs; entry points still come from the
installed metadata), and it runs a copy of this script from an empty temporary folder, so that
neither the script's folder nor the working directory can shadow the tree. Every rank reports
the files of ``distcomm``, ``distcomm_torch`` and ``distcomm_mpi`` it imported, and the run stops
if one lies outside the job's tree. mpi jobs start with ``mpirun -n 2``, gloo jobs with
``distcomm run -n 2 --backend gloo`` (both from the folder of this Python, a venv's bin); both
get ``DISTCOMM_BACKEND`` and, unless set, ``OMP_NUM_THREADS=1`` (2 ranks on few cores).

A job times, through the public API only, the rows of ``--rows``:

- ``all_reduce`` (the default): ``distcomm.all_reduce`` of a float32 numpy array and a float32
  CPU torch tensor (zeros) of 8 bytes and of 64 MiB; the acceptance thresholds: median ratio
  new / old <= 1.05 at 8 B, <= 1.02 at 64 MiB.
- ``objects``: the object rows of benchmarks/peers.py (``all_gather_object``,
  ``broadcast_object``, ``gather_object``, ``scatter_object`` of its 1 KiB and 16 MiB objects,
  as many calls per block as peers.py makes); threshold: median ratio <= 1.05.

Each row: after a warm-up of a tenth of the calls, ``--reps`` blocks of a fixed number of calls,
each after a barrier, the rows taking turns; the job's time per call is its fastest block (the
least disturbed by other work on the machine), which rank 0 prints as a JSON line. The table
gives, per backend and row, each tree's median time per call with the min-max over rounds, the
median (min-max) of the per-round ratio new / old, and the verdict against the row's threshold;
the exit status is 1 if one fails. With ``--old`` and ``--new`` two copies of one commit, the
ratios show the noise, which other work on the machine makes large: the load average before and
after is printed. Default run (all_reduce): 4.5 to 6 minutes on 2 cores; objects: about 6.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from timing import cell, ratio

SIZES = {"8 B": 2, "64 MiB": 16 * 1024 * 1024}  # float32 elements
CALLS = {
    "mpi": {"8 B": 20000, "64 MiB": 5},
    "gloo": {"8 B": 1000, "64 MiB": 5},
}
#: The largest acceptable median ratio new / old, by row suite and size.
THRESHOLDS = {
    "all_reduce": {"8 B": 1.05, "64 MiB": 1.02},
    "objects": {"1 KiB": 1.05, "16 MiB": 1.05},
}
MODULES = ("distcomm", "distcomm_torch", "distcomm_mpi")
MARKER = "CHECKOUTS-RESULT "


# -- a job's rank -----------------------------------------------------------------------------
Rows = dict[str, tuple[Callable[[], object], int]]  # row -> (one call, calls per block)


def all_reduce_rows(backend: str) -> Rows:
    """``distcomm.all_reduce`` of numpy arrays and torch tensors (module docstring)."""
    import numpy as np
    import torch

    import distcomm

    makers = {
        "numpy": lambda n: np.zeros(n, dtype=np.float32),
        "torch": lambda n: torch.zeros(n, dtype=torch.float32),
    }
    rows: Rows = {}
    for kind, make in makers.items():
        for label, numel in SIZES.items():
            x = make(numel)
            rows[f"{kind} {label}"] = (lambda x=x: distcomm.all_reduce(x), CALLS[backend][label])
    return rows


def object_rows(backend: str) -> Rows:
    """The object rows of benchmarks/peers.py, through distcomm's public functions."""
    from peers import CALLS as PEERS_CALLS
    from peers import OBJECT_OPS, OBJECT_SIZES, make_object

    import distcomm

    world = distcomm.get_world_size()
    rows: Rows = {}
    for op in OBJECT_OPS:
        for label in OBJECT_SIZES:
            obj = make_object(label)
            call = {
                "all_gather_object": lambda o=obj: distcomm.all_gather_object(o),
                "broadcast_object": lambda o=obj: distcomm.broadcast_object(o),
                "gather_object": lambda o=obj: distcomm.gather_object(o, 0),
                "scatter_object": lambda o=obj: distcomm.scatter_object([o] * world, 0),
            }[op]
            rows[f"{op} {label}"] = (call, PEERS_CALLS[backend][label])
    return rows


ROWS = {"all_reduce": all_reduce_rows, "objects": object_rows}


def child(backend: str, suite: str, reps: int) -> None:
    """One rank of a job: time ``suite``'s rows on ``backend``; rank 0 prints a JSON line."""
    import distcomm

    comm = distcomm.init(backend=backend)
    import distcomm_mpi
    import distcomm_torch

    files = {m.__name__: m.__file__ for m in (distcomm, distcomm_torch, distcomm_mpi)}
    rows = ROWS[suite](backend)

    def per_call(fn: Callable[[], object], calls: int) -> float:
        distcomm.barrier()
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        return (time.perf_counter() - start) / calls

    for fn, calls in rows.values():
        per_call(fn, max(1, calls // 10))  # warm-up
    blocks: dict[str, list[float]] = {row: [] for row in rows}
    for _ in range(reps):  # the rows take turns, so that each one's blocks spread over the job
        for row, (fn, calls) in rows.items():
            blocks[row].append(per_call(fn, calls))
    times = {row: min(samples) for row, samples in blocks.items()}  # the least disturbed block
    distcomm.barrier()
    rank = distcomm.get_rank()
    result = {
        "rank": rank,
        "backend": getattr(comm, "backend_name", backend),
        "files": files,
        "times": times,
    }
    if rank == 0:
        print(MARKER + json.dumps(result), flush=True)
    else:  # rank 0 reports the times; every rank its imports (on stderr, apart from rank 0's)
        print(MARKER + json.dumps({"rank": rank, "files": files}), file=sys.stderr, flush=True)
    distcomm.finalize()


# -- the parent -------------------------------------------------------------------------------
def search_path(tree: Path) -> list[str]:
    """PYTHONPATH entries that make Python import ``tree``'s distcomm and backends."""
    if not (tree / "distcomm" / "__init__.py").is_file():
        raise SystemExit(f"{tree} is no distcomm checkout (no distcomm/__init__.py)")
    backends = sorted(p for p in (tree / "backends").glob("*") if p.is_dir())
    return [str(tree), *(str(p) for p in backends)]


def run_job(argv: list[str], env: dict[str, str], cwd: str, timeout: float) -> str:
    """Run one job in its own process group; return its output; stop the group on any exit."""
    proc = subprocess.Popen(
        argv,
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        raise SystemExit(f"job timed out after {timeout:.0f} s: {' '.join(argv)}") from None
    finally:
        if proc.poll() is None:  # timed out or interrupted: SIGTERM (launchers forward it)
            for sig, wait in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 5.0)):
                try:
                    os.killpg(proc.pid, sig)
                    proc.communicate(timeout=wait)
                    break
                except (ProcessLookupError, subprocess.TimeoutExpired):
                    continue
    if proc.returncode != 0:
        tail = "\n".join((out + err).splitlines()[-30:])
        raise SystemExit(f"job failed (exit {proc.returncode}): {' '.join(argv)}\n{tail}")
    return out + "\n" + err


def marked(out: str, marker: str, what: str) -> Any:
    """The JSON a job's rank printed after ``marker`` (its first line that has it); ``what``
    names the job when there is none."""
    for line in out.splitlines():
        if marker in line:
            return json.loads(line.split(marker, 1)[1])
    raise SystemExit(f"{what}: no result in the job's output:\n{out[-3000:]}")


def parse(out: str, tree: Path, backend: str) -> dict[str, Any]:
    """Rank 0's result from a job's output, after checking that every rank imported ``tree``."""
    decoder = json.JSONDecoder()  # a launcher may join two ranks' lines: decode from each marker
    results = [decoder.raw_decode(part)[0] for part in out.split(MARKER)[1:]]
    if sorted(r["rank"] for r in results) != [0, 1]:
        raise SystemExit(f"{backend} job of {tree}: no result from each of 2 ranks:\n{out}")
    for result in results:
        for module in MODULES:
            path = Path(result["files"][module]).resolve()
            if not path.is_relative_to(tree):
                raise SystemExit(
                    f"{backend} job of {tree}: rank {result['rank']} imported {module} from "
                    f"{path}, outside the tree. HINT: is the module in the tree's layout?"
                )
    (first,) = [r for r in results if r["rank"] == 0]
    if first["backend"] != backend:
        raise SystemExit(f"job for {backend} ran on backend {first['backend']!r}")
    return first


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--child", metavar="BACKEND", help=argparse.SUPPRESS)
    parser.add_argument("--old", type=Path, help="the old checkout (its root folder)")
    parser.add_argument("--new", type=Path, help="the new checkout (its root folder)")
    parser.add_argument("--rounds", type=int, default=7, help="counted rounds after a warm-up")
    parser.add_argument("--rows", choices=sorted(ROWS), default="all_reduce", help="what to time")
    parser.add_argument("--backends", default="gloo,mpi", help="comma-separated: gloo, mpi")
    parser.add_argument("--reps", type=int, default=5, help="timed blocks per job (fastest taken)")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds allowed per job")
    args = parser.parse_args()
    if args.child:
        child(args.child, args.rows, args.reps)
        return
    sys.stdout.reconfigure(line_buffering=True)  # type: ignore[union-attr]  # progress: stderr
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a job running then is stopped too
    if args.old is None or args.new is None:
        parser.error("--old and --new are required")
    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    if not backends or set(backends) - set(CALLS):
        parser.error(f"--backends {args.backends!r}: valid names are {', '.join(CALLS)}")
    if args.rounds < 1 or args.reps < 1:
        parser.error("--rounds and --reps must be at least 1")
    trees = {"old": args.old.resolve(), "new": args.new.resolve()}
    paths = {side: search_path(tree) for side, tree in trees.items()}
    bin_dir = Path(sys.executable).parent
    launchers = {
        "mpi": [str(bin_dir / "mpirun"), "-n", "2", sys.executable],
        "gloo": [str(bin_dir / "distcomm"), "run", "-n", "2", "--backend", "gloo"],
    }
    for backend in backends:
        if not Path(launchers[backend][0]).is_file():
            raise SystemExit(f"{launchers[backend][0]} not found (the launcher for {backend})")
    for side, tree in trees.items():
        print(f"{side}: {tree}")
    if trees["old"] == trees["new"]:
        print("(old and new are the same tree: the ratios show the noise)")

    samples: dict[tuple[str, str, str], list[float]] = {}  # (backend, side, row) -> per round
    load_before = os.getloadavg()[0]
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="distcomm-checkouts-") as workdir:
        here = Path(__file__).resolve().parent
        for name in ("checkouts.py", "timing.py", "peers.py"):
            shutil.copy(here / name, Path(workdir) / name)
        script = str(Path(workdir) / "checkouts.py")
        for round_ in range(args.rounds + 1):
            order = ("old", "new") if round_ % 2 == 0 else ("new", "old")
            for backend in backends:
                for side in order:
                    env = dict(os.environ)
                    env["PYTHONPATH"] = os.pathsep.join(paths[side])
                    env["DISTCOMM_BACKEND"] = backend
                    env.setdefault("OMP_NUM_THREADS", "1")
                    argv = [*launchers[backend], script, "--child", backend, "--rows", args.rows]
                    argv += ["--reps"]
                    began = time.perf_counter()
                    out = run_job([*argv, str(args.reps)], env, workdir, args.timeout)
                    result = parse(out, trees[side], backend)
                    took = time.perf_counter() - began
                    what = "warm-up" if round_ == 0 else f"round {round_}/{args.rounds}"
                    print(f"  {what:<11} {backend:<4} {side}: {took:4.1f} s", file=sys.stderr)
                    if round_ == 0:
                        files = "  ".join(f"{m}={result['files'][m]}" for m in MODULES)
                        print(f"{side} {backend}: {files}")
                        continue
                    for row, seconds in result["times"].items():
                        samples.setdefault((backend, side, row), []).append(seconds)
    wall = time.perf_counter() - start

    print(
        f"\n{args.rounds} rounds after a warm-up round, {args.reps} blocks per job, {wall:.0f} s; "
        f"load average {load_before:.2f} before, {os.getloadavg()[0]:.2f} after "
        f"({os.cpu_count()} CPUs)"
    )
    print("per call: median (min-max) over rounds; new/old: per round; min/min: fastest rounds")
    thresholds = THRESHOLDS[args.rows]
    header = ("backend", "row", "old", "new", "new/old", "min/min", "limit", "verdict")
    print("{:<7} {:<24} {:>24} {:>24} {:>20} {:>7} {:>5} {}".format(*header))
    failed = []
    rows = dict.fromkeys((backend, row) for backend, side, row in samples if side == "old")
    for backend, row in rows:
        old, new = samples[(backend, "old", row)], samples[(backend, "new", row)]
        limit = thresholds[" ".join(row.split()[-2:])]  # the row's size: "8 B", "1 KiB"
        median = statistics.median(a / b for a, b in zip(new, old, strict=True))
        ok = median <= limit
        if not ok:
            failed.append(f"{backend} {row} ({median:.3f})")
        print(
            f"{backend:<7} {row:<24} {cell(old, 2):>24} {cell(new, 2):>24} "
            f"{ratio(new, old):>20} {min(new) / min(old):>7.3f} {limit:>5.2f} "
            f"{'ok' if ok else 'FAIL'}"
        )
    limits = ", ".join(f"<= {limit} at {label}" for label, limit in thresholds.items())
    if failed:
        print(f"verdict: FAIL (median new/old {limits}): {', '.join(failed)}")
        sys.exit(1)
    print(f"verdict: PASS (median new/old {limits} on {', '.join(backends)})")


if __name__ == "__main__":
    main()
