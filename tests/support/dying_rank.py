"""The body of each rank in the "a rank dies" tests, under any launcher.

    python dying_rank.py OUT_DIR BACKEND DYING_RANK

Every rank initialises (BACKEND ``auto`` leaves the choice to distcomm) and runs one all-reduce;
then rank DYING_RANK raises ValueError while the others enter a second all-reduce. Each
survivor that gets an answer writes ``OUT_DIR/rank-<rank>.json``: the error type, message,
``missing_ranks`` and the seconds it waited ("returned" if the all-reduce returned, which is
wrong). Under MPI launchers the dying rank ends the job instead, and nobody writes.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import numpy as np

import distcomm


def main() -> None:
    out, backend, dying = sys.argv[1], sys.argv[2], int(sys.argv[3])
    comm = distcomm.init(backend=None if backend == "auto" else backend)
    distcomm.all_reduce(np.ones(4))
    if comm.rank == dying:
        raise ValueError(f"rank {dying} breaks on purpose")
    start = time.monotonic()
    try:
        distcomm.all_reduce(np.ones(4))
        report = {"error": "returned", "message": "", "missing": None}
    except distcomm.DistcommError as exc:
        missing = getattr(exc, "missing_ranks", None)
        report = {
            "error": type(exc).__name__,
            "message": str(exc),
            "missing": None if missing is None else list(missing),
        }
    report.update(seconds=time.monotonic() - start, backend=comm.backend)
    Path(out, f"rank-{comm.rank}.json").write_text(json.dumps(report))


if __name__ == "__main__":
    main()
