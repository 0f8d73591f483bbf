"""The rows of docs/errors.md that run inside the ranks of a launched world (gloo, mpi).

Each function tries the user mistakes of some rows and records what each one raised as
``[exception type name, message]`` (``["returned", repr]`` when it raised nothing), so that the
test outside the world asserts on plain, picklable data. Every mistake here raises before
anything is sent, on the rank that made it, so one world of 2 serves every row: the gloo test
runs them in one ``spawn``, the mpi test in one ``mpirun -n 2`` job (this module's
:func:`run_mpi_job`, as a script).

Run as a script, this is the body of each rank of that MPI job:
``python error_rows.py OUTDIR`` writes ``OUTDIR/rank-N.json``.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import distcomm
from distcomm.protocol import Communicator
from distcomm.testing.conformance import run_all

#: The conformance checks that back rows of docs/errors.md (they run on every backend).
ERROR_CHECKS = (
    "invalid_ranks",
    "not_a_tensor",
    "unknown_reduce_op",
    "unsupported_dtypes",
    "scatter_lists_of_the_wrong_length",
)

Outcome = list[str]


def caught(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Outcome:
    """``[type name, message]`` of what ``fn(*args, **kwargs)`` raised, else ``["returned",
    repr(value)]``."""
    try:
        value = fn(*args, **kwargs)
    except Exception as exc:
        return [type(exc).__name__, str(exc)]
    return ["returned", repr(value)]


@contextmanager
def variable(name: str, value: str) -> Iterator[None]:
    """Set ``os.environ[name]`` to ``value`` inside the block; restore it after."""
    before = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if before is None:
            del os.environ[name]
        else:
            os.environ[name] = before


def uninitialised_rows(backend: str) -> dict[str, Outcome]:
    """Rows 1, 2, 4 (init), 5 and 6 in a launched world of 2 that is not initialised.

    Nothing here reaches a rendezvous: every call is refused first (were one not, its short
    timeout would end the wait).
    """

    def init(**kwargs: Any) -> Communicator:
        return distcomm.init(timeout=10, **kwargs)

    launch = distcomm.detect_environment()
    rank, world = launch.rank, launch.world_size
    rows = {
        "unknown backend": caught(distcomm.init, backend="ncl"),
        "unknown method": caught(distcomm.init, backend=backend, method="slrum"),
        "nccl without a GPU": caught(distcomm.init, backend="nccl"),
        "gloo with device=cuda": caught(distcomm.init, backend="gloo", device="cuda"),
        "rank out of range": caught(init, backend=backend, rank=5, world_size=world),
        "world_size disagrees": caught(init, backend=backend, world_size=world + 1),
        "rank disagrees": caught(init, backend=backend, rank=(rank + 1) % world),
    }
    with variable("DISTCOMM_BACKEND", "glo"):
        rows["unknown DISTCOMM_BACKEND"] = caught(distcomm.init)
    with variable("DISTCOMM_INIT_METHOD", "slrum"):
        rows["unknown DISTCOMM_INIT_METHOD"] = caught(distcomm.init, backend=backend)
    rows["still uninitialised"] = ["returned", repr(distcomm.is_initialized())]
    return rows


def running_rows(backend: str) -> dict[str, Outcome]:
    """The conformance checks of the catalogue (rows 1's op, 3, 5's src/dst, 11) and row 7,
    on the running world."""
    comm = distcomm.get_communicator()
    rows = {"conformance": ["returned", repr(run_all(ERROR_CHECKS))]}
    rows["init again, another backend"] = caught(distcomm.init, backend="fakelink")
    rows["init again, another timeout"] = caught(distcomm.init, timeout=4321)
    same = distcomm.init(backend=backend, rank=comm.rank, world_size=comm.world_size)
    rows["init again, same arguments"] = ["returned", repr(same is comm is distcomm.init())]
    return rows


def finalized_rows(comm: Communicator) -> dict[str, Outcome]:
    """Row 8: finalize the world, then use its communicator and the module-level API."""
    import numpy as np

    distcomm.barrier()  # no rank finalizes while another is still in a collective
    distcomm.finalize()
    return {
        "finalized comm.all_reduce": caught(comm.all_reduce, np.ones(2)),
        "finalized comm.broadcast_object": caught(comm.broadcast_object, 1),
        "all_reduce after finalize": caught(distcomm.all_reduce, np.ones(2)),
        "barrier after finalize": caught(distcomm.barrier),
    }


def gloo_rank() -> dict[str, Outcome]:
    """The body of each rank of the gloo test (``spawn`` has initialised it)."""
    comm = distcomm.get_communicator()
    rows = running_rows("gloo")
    rows.update(finalized_rows(comm))
    rows.update(uninitialised_rows("gloo"))
    return rows


def mpi_rank(out: str) -> None:
    """The body of each rank of the mpi test's ``mpirun -n 2`` job."""
    rows = uninitialised_rows("mpi")
    rows["mpi with device=cuda"] = caught(distcomm.init, backend="mpi", device="cuda")
    launch = distcomm.detect_environment()
    # Row 6: values equal to the launcher's are accepted.
    comm = distcomm.init(backend="mpi", rank=launch.rank, world_size=launch.world_size)
    rows["equal rank and world_size"] = ["returned", repr((comm.rank, comm.world_size))]
    rows.update(running_rows("mpi"))
    rows.update(finalized_rows(comm))
    with open(os.path.join(out, f"rank-{launch.rank}.json"), "w") as file:
        json.dump(rows, file)


def expect_row(rows: dict[str, Outcome], row: str, kind: str, *parts: str) -> None:
    """Assert that ``rows[row]`` raised (or returned) ``kind`` with every one of ``parts`` in
    its message."""
    got = rows.get(row)
    assert got is not None, f"row {row!r} did not run; rows: {sorted(rows)}"
    assert got[0] == kind, f"row {row!r}: expected {kind}, got {got}"
    missing = [part for part in parts if part not in got[1]]
    assert not missing, f"row {row!r}: the message lacks {missing}: {got[1]}"


def check_launched_rows(
    rows: dict[str, Outcome], *, backend: str, method: str, rank: int, variables: tuple[str, str]
) -> None:
    """Assert every row of a launched world of 2 (``variables``: the launcher's rank and world
    size variables, e.g. ``("RANK", "WORLD_SIZE")``)."""
    rank_var, size_var = variables
    other = 1 - rank
    expect_row(rows, "conformance", "returned", repr(list(ERROR_CHECKS)))
    expect_row(
        rows,
        "unknown backend",
        "BackendNotFoundError",
        "unknown backend 'ncl'; available: ",
        "gloo",
        "HINT: did you mean 'nccl'?",
    )
    expect_row(
        rows,
        "unknown DISTCOMM_BACKEND",
        "BackendNotFoundError",
        "unknown backend 'glo' (from DISTCOMM_BACKEND); available: ",
        "HINT: did you mean 'gloo'?",
    )
    for row, source in (("unknown method", ""), ("unknown DISTCOMM_INIT_METHOD", " (from ")):
        expect_row(
            rows,
            row,
            "InvalidArgumentError",
            f"unknown launch method 'slrum'{source}",
            "single_node, slurm",
            "HINT: did you mean 'slurm'?",
        )
    expect_row(
        rows,
        "nccl without a GPU",
        "BackendUnavailableError",
        "backend 'nccl' cannot run here: ",
        "HINT: nccl moves CUDA tensors only; for CPU tensors use ",
        "gloo",
    )
    expect_row(
        rows, "gloo with device=cuda", "InvalidArgumentError", "device='cuda'", "'gloo'", "HINT:"
    )
    expect_row(
        rows,
        "rank out of range",
        "InvalidArgumentError",
        "rank=5 is not a rank of a world of 2",
        "valid ranks are 0..1",
        "HINT:",
    )
    expect_row(
        rows,
        "world_size disagrees",
        "InvalidArgumentError",
        f"init(world_size=3) disagrees with the {method} launch, which says world_size=2 "
        f"(from {size_var})",
        "HINT: omit world_size= to use the launcher's value, or start 3 processes",
    )
    expect_row(
        rows,
        "rank disagrees",
        "InvalidArgumentError",
        f"init(rank={other}) disagrees with the {method} launch, which says rank={rank} "
        f"(from {rank_var})",
        "HINT: omit rank= to use the launcher's value.",
    )
    expect_row(rows, "still uninitialised", "returned", "False")
    expect_row(
        rows,
        "init again, another backend",
        "AlreadyInitializedError",
        f"backend='fakelink' (running: {backend!r})",
        "HINT: call distcomm.finalize() first",
    )
    expect_row(
        rows, "init again, another timeout", "AlreadyInitializedError", "timeout=4321.0 (running: "
    )
    expect_row(rows, "init again, same arguments", "returned", "True")
    for row in ("finalized comm.all_reduce", "finalized comm.broadcast_object"):
        expect_row(
            rows, row, "DistcommError", f"{backend} 'world'", "can no longer be used: finalized"
        )
        expect_row(rows, row, "DistcommError", "HINT:")
    for row in ("all_reduce after finalize", "barrier after finalize"):
        expect_row(
            rows,
            row,
            "NotInitializedError",
            f"the {method} launch says this is rank {rank} of 2",
            "HINT: call distcomm.init()",
        )


if __name__ == "__main__":
    mpi_rank(sys.argv[1])
