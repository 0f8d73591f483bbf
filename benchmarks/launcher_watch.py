"""What watching the launcher costs a normal job: ``distcomm run -n 4 examples/hello.py`` with
the ranks watching their launcher (the default) against ``DISTCOMM_DETACH=1`` (no watcher).

Run:  python benchmarks/launcher_watch.py [--rounds 7] [-n 4] [--backend gloo]
      (by hand, not in CI; about 1 minute on this 2-core machine)

Each round runs the whole job once each way, the two taking turns (benchmarks/timing.py), after
a warm-up job of each; a job's time is its wall time from start to exit, launcher included. The
table gives each side's median (min-max) and the median (min-max) of the per-round ratio
detached / watching: about 1 means that watching costs the job nothing measurable.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

from timing import comparison_table, interleaved

HELLO = Path(__file__).resolve().parents[1] / "examples" / "hello.py"


def job(nprocs: int, backend: str, detach: bool) -> None:
    """One ``distcomm run`` of examples/hello.py, which must succeed."""
    env = {**os.environ, "DISTCOMM_DETACH": "1" if detach else "0"}
    command = [sys.executable, "-m", "distcomm", "run", "-n", str(nprocs), "--backend", backend]
    done = subprocess.run([*command, str(HELLO)], env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"the job failed ({done.returncode}):\n{done.stdout}{done.stderr}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("-n", "--nprocs", type=int, default=4)
    parser.add_argument("--backend", default="gloo")
    args = parser.parse_args()
    sides = {
        "distcomm": lambda: job(args.nprocs, args.backend, False),  # watching: the default
        "detached": lambda: job(args.nprocs, args.backend, True),
    }
    samples = interleaved(sides, 1, args.rounds)  # after a warm-up job of each
    case = f"distcomm run -n {args.nprocs}"
    print("\n".join(comparison_table({args.backend: {case: samples}})))
    print("distcomm: the ranks watch their launcher (default); detached: DISTCOMM_DETACH=1")


if __name__ == "__main__":
    main()
