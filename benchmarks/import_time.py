"""What ``import distcomm`` costs: ``python -X importtime -c "import distcomm"``, median of 7.

Run:  python benchmarks/import_time.py [--runs 7]

Each run is a fresh interpreter; the number is distcomm's cumulative import time as Python itself
reports it (``-X importtime``), which leaves out the interpreter's own start. It also lists the
modules the import loads beyond the standard library's already loaded ones (none of torch, numpy,
mpi4py, pluggy or importlib.metadata may be among them), and, for comparison, what the first
``distcomm.init()`` of a world of 1 loads on top.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys

MODULES = """
import json, sys
before = set(sys.modules)
import distcomm
after_import = set(sys.modules)
distcomm.init(backend="fakelink")
after_init = set(sys.modules)
distcomm.finalize()
print(json.dumps({"import": sorted(after_import - before), "init": len(after_init - after_import)}))
"""


def import_micros() -> int:
    """distcomm's cumulative import time in one fresh interpreter, in microseconds."""
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", "import distcomm"],
        capture_output=True,
        text=True,
        check=True,
    )
    line = next(row for row in done.stderr.splitlines() if row.rstrip().endswith("| distcomm"))
    return int(line.split("|")[1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=7)
    args = parser.parse_args()
    import_micros()  # warm the file cache
    times = [import_micros() / 1000 for _ in range(args.runs)]
    print(
        f"import distcomm: {statistics.median(times):.1f} ms median of {args.runs} "
        f"({min(times):.1f}-{max(times):.1f} ms)"
    )
    done = subprocess.run([sys.executable, "-c", MODULES], capture_output=True, text=True)
    loaded = json.loads(done.stdout)
    print(f"modules it loads: {', '.join(loaded['import'])}")
    print(f"the first init() (fakelink, a world of 1) loads {loaded['init']} more")


if __name__ == "__main__":
    main()
