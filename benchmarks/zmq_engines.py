"""The zmq plugin against gloo and mpi: distcomm.all_reduce of 8 B, 64 KiB and 64 MiB, 2 ranks.

Run:  python benchmarks/zmq_engines.py [--rounds 5] [--reps 5]
      (needs examples/distcomm-zmq installed: pip install ./examples/distcomm-zmq)

One run interleaves 2-rank jobs: each round, one job per engine (zmq and gloo under
``distcomm run -n 2 --backend B``, mpi under ``mpirun -n 2``), the order rotating round by round;
a first round (not counted) warms up. A job times ``distcomm.all_reduce`` of a float32 numpy
array: after a warm-up, ``--reps`` blocks of a fixed number of calls, each after a barrier; its
time per call is its fastest block. The table gives each engine's median time per call (min-max
over rounds) and the median (min-max) of the per-round ratio engine / zmq (above 1: zmq is
faster).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

from checkouts import run_job
from timing import cell, ratio

SIZES = {"8 B": 2, "64 KiB": 16 * 1024, "64 MiB": 16 * 1024 * 1024}  # float32 elements
CALLS = {
    "zmq": {"8 B": 2000, "64 KiB": 500, "64 MiB": 5},
    "gloo": {"8 B": 1000, "64 KiB": 500, "64 MiB": 5},
    "mpi": {"8 B": 20000, "64 KiB": 2000, "64 MiB": 5},
}
MARKER = "ZMQ-ENGINES-RESULT "


def child(backend: str, reps: int) -> None:
    """One rank of a job: time all_reduce on ``backend``; rank 0 prints a JSON line."""
    import numpy as np

    import distcomm

    distcomm.init(backend=backend)
    arrays = {label: np.zeros(numel, dtype=np.float32) for label, numel in SIZES.items()}

    def per_call(x: object, calls: int) -> float:
        distcomm.barrier()
        start = time.perf_counter()
        for _ in range(calls):
            distcomm.all_reduce(x)
        return (time.perf_counter() - start) / calls

    for label, x in arrays.items():
        per_call(x, max(1, CALLS[backend][label] // 10))
    blocks: dict[str, list[float]] = {label: [] for label in arrays}
    for _ in range(reps):
        for label, x in arrays.items():
            blocks[label].append(per_call(x, CALLS[backend][label]))
    if distcomm.get_rank() == 0:
        times = {label: min(samples) for label, samples in blocks.items()}
        print(MARKER + json.dumps(times), flush=True)
    distcomm.finalize()


def command(backend: str, script: str, reps: int) -> list[str]:
    bin_dir = Path(sys.executable).parent
    tail = [sys.executable, script, "--child", backend, "--reps", str(reps)]
    if backend == "mpi":
        return [str(bin_dir / "mpirun"), "-n", "2", *tail]
    return [sys.executable, "-m", "distcomm", "run", "-n", "2", "--backend", backend, *tail[1:]]


def one_job(backend: str, reps: int) -> dict[str, float]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DISTCOMM_", "MASTER_"))}
    env.setdefault("OMP_NUM_THREADS", "1")
    out = run_job(command(backend, __file__, reps), env, os.getcwd(), 600)
    for line in out.splitlines():
        if MARKER in line:
            times: dict[str, float] = json.loads(line.split(MARKER, 1)[1])
            return times
    raise SystemExit(f"{backend}: no result in the job's output:\n{out}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.reps)
        return
    engines = list(CALLS)
    samples: dict[str, dict[str, list[float]]] = {e: {s: [] for s in SIZES} for e in engines}
    start = time.monotonic()
    for round_ in range(args.rounds + 1):
        order = engines[round_ % 3 :] + engines[: round_ % 3]
        for engine in order:
            times = one_job(engine, args.reps)
            label = "warm-up" if round_ == 0 else f"round {round_}/{args.rounds}"
            print(f"  {label:<11} {engine:<4}: done", flush=True)
            if round_:
                for size, seconds in times.items():
                    samples[engine][size].append(seconds)
    print(f"\n{args.rounds} rounds after a warm-up, {time.monotonic() - start:.0f} s; 2 ranks")
    print(f"{'size':<7} {'engine':<6} {'per call: median (min-max)':>30} {'engine / zmq':>24}")
    for size in SIZES:
        zmq = samples["zmq"][size]
        for engine in engines:
            mine = samples[engine][size]
            versus = "" if engine == "zmq" else ratio(mine, zmq)
            print(f"{size:<7} {engine:<6} {cell(mine):>30} {versus:>24}")
    medians = {e: statistics.median(samples[e]["64 MiB"]) for e in engines}
    print(f"64 MiB medians: {', '.join(f'{e} {v * 1e3:.1f} ms' for e, v in medians.items())}")


if __name__ == "__main__":
    main()
