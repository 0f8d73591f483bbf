"""A late collective mismatch as a user's program makes it, for tests/test_late_mismatch.py.

    python late_mismatch.py KIND AT AFTER                one job: nothing set, nothing caught
    python late_mismatch.py --matrix OUTDIR [NAME ...]   scenarios (default: all), each on a
                                                         group of its own

In a scenario every rank makes ``AT - 1`` matching all-reduces of 4 float32 elements, then rank
1 differs at operation ``#AT`` (KIND: ``size``, 6 elements; ``dtype``, float64; ``op``, a
broadcast where the others all-reduce; ``root``, a broadcast from rank 1 where the others
broadcast from rank 0), then every rank makes ``AFTER`` more all-reduces and calls
``finalize()``.

KIND ``varying`` (not in the matrix) is the issue's table: every rank all-reduces arrays of
:data:`VARYING` sizes in turn, every size agreed on long before, and rank 1's call ``#AT`` has
the next size of the turn (torch CPU tensors where ``LATE_MISMATCH_LIB=torch``, else numpy).

The matrix runs scenarios (by :func:`name`) in one job, on a new group each (its operations
numbered from 1, timing out after :data:`GROUP_TIMEOUT` seconds, so that the ranks that waited
in the engine come back), catches what each rank raised, and writes ``OUTDIR/rank-N.json``:
scenario name -> ``[exception type, its seq, first line]`` (``["returned"]`` if nothing was
raised). Under an MPI launcher the matrix is not possible (MPI cannot give up a blocked
collective): the tests start one job per scenario instead.
"""

from __future__ import annotations

import itertools
import json
import os
import sys
from typing import Any

import numpy as np

import distcomm

KINDS = ("size", "dtype", "op", "root")
POSITIONS = (100, 2000, 5000)
AFTERS = (0, 50)
#: Seconds a scenario's group waits in a collective before its timeout (matrix only).
GROUP_TIMEOUT = 3.0


#: The sizes (float32 elements) of the ``varying`` kind, in turn: variable-length batches.
VARYING = [16 + 3 * i for i in range(37)]


def scenario(comm: Any, kind: str, at: int, after: int, end: Any = None) -> None:
    """One scenario on ``comm``, whose next operation is #1 (module docstring); ``end()``
    finalizes it (default: ``comm.finalize``)."""
    if kind == "varying":
        _varying(comm, at, after)
        (comm.finalize if end is None else end)()
        return
    good = np.zeros(4, dtype=np.float32)  # stays 0, however many sums
    for _ in range(at - 1):
        comm.all_reduce(good)
    odd = comm.rank == 1
    x = np.ones(4, dtype=np.float32)
    if kind == "size" and odd:
        x = np.ones(6, dtype=np.float32)
    elif kind == "dtype" and odd:
        x = np.ones(4, dtype=np.float64)
    if kind == "op" and odd:
        comm.broadcast(x, 0)
    elif kind == "root":
        comm.broadcast(x, 1 if odd else 0)
    else:
        comm.all_reduce(x)
    for _ in range(after):
        comm.all_reduce(good)
    (comm.finalize if end is None else end)()


def _varying(comm: Any, at: int, after: int) -> None:
    if os.environ.get("LATE_MISMATCH_LIB") == "torch":
        import torch

        arrays = [torch.zeros(n) for n in VARYING]
    else:
        arrays = [np.zeros(n, dtype=np.float32) for n in VARYING]
    for seq in range(1, at + after + 1):
        turn = seq + 1 if seq == at and comm.rank == 1 else seq
        comm.all_reduce(arrays[turn % len(VARYING)])


def name(kind: str, at: int, after: int) -> str:
    """A scenario's name: ``size@100+0``."""
    return f"{kind}@{at}+{after}"


def scenarios() -> list[tuple[str, int, int]]:
    """Every (kind, at, after) of the matrix."""
    return list(itertools.product(KINDS, POSITIONS, AFTERS))


def outcome(exc: BaseException | None) -> list[Any]:
    """What a rank reports of a scenario: the exception's type, its seq, its first line."""
    if exc is None:
        return ["returned"]
    first = (str(exc).splitlines() or [""])[0]
    return [type(exc).__name__, getattr(exc, "seq", None), first]


def matrix(folder: str, names: list[str]) -> None:
    """The scenarios ``names`` (all if none) on a group of their own each; this rank's
    outcomes to ``folder``."""
    world: Any = distcomm.init()
    results: dict[str, list[Any]] = {}
    chosen = [s for s in scenarios() if not names or name(*s) in names]
    failed = []  # finalized at the end: until then a rank that raised answers the others
    for kind, at, after in chosen:
        saved, world.timeout = world.timeout, GROUP_TIMEOUT
        try:
            group: Any = distcomm.new_group(range(world.world_size))  # takes the short timeout
        finally:
            world.timeout = saved
        try:
            scenario(group, kind, at, after)
        except Exception as exc:
            results[name(kind, at, after)] = outcome(exc)
            failed.append(group)
        else:
            results[name(kind, at, after)] = outcome(None)
    with open(os.path.join(folder, f"rank-{world.rank}.json"), "w", encoding="utf-8") as out:
        json.dump(results, out)
    distcomm.barrier()
    for group in failed:
        group.finalize()
    distcomm.finalize()


def main() -> None:
    if sys.argv[1] == "--matrix":
        matrix(sys.argv[2], sys.argv[3:])
        return
    kind, at, after = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    scenario(distcomm.init(), kind, at, after, end=distcomm.finalize)
    print(f"rank {distcomm.get_rank()}: finished", flush=True)


if __name__ == "__main__":
    main()
