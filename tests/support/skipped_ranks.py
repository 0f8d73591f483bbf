"""Rank functions in which one rank skips a collective, shared by the failure tests of every
backend (run in threads by tests/backend/test_engine_failures.py, in processes by the torch
tests)."""

from __future__ import annotations

import time
from typing import Any

import numpy as np

import distcomm
from distcomm.errors import DistTimeoutError

#: The timeout those tests give their worlds, in seconds.
TIMEOUT = 2.0


def skipped_barrier() -> tuple[str, Any, Any, Any, str, float]:
    """Every rank but 1 enters a barrier that rank 1 skips: it sleeps instead, until the others
    have timed out and been told where it sleeps, then finalizes (which cannot confirm the
    calls with ranks that have gone: a warning, or, while they are still there, the mismatch
    of the barrier it skipped)."""
    comm = distcomm.get_communicator()
    distcomm.all_reduce(np.ones(2))
    if comm.rank == 1:
        time.sleep(TIMEOUT * 4)
        try:
            distcomm.finalize()
        except distcomm.CollectiveMismatchError as exc:
            return ("slept", exc.op, exc.seq, None, str(exc), 0.0)
        return ("slept", None, None, None, "", 0.0)
    start = time.monotonic()
    try:
        distcomm.barrier()
    except DistTimeoutError as exc:
        elapsed = time.monotonic() - start
        return (type(exc).__name__, exc.op, exc.seq, exc.missing_ranks, str(exc), elapsed)
    return ("returned", None, None, None, "", 0.0)


def skipped_group_barrier() -> tuple[str, Any, Any, Any]:
    """In a group of world ranks 0 and 2 (its ranks 0 and 1), world rank 2 skips a barrier."""
    comm = distcomm.get_communicator()
    group = distcomm.new_group([0, 2])
    distcomm.barrier()
    if comm.rank != 0:
        if comm.rank == 2:
            time.sleep(comm.timeout * 2)  # type: ignore[attr-defined]
        return ("skipped", None, None, None)
    try:
        group.barrier()  # type: ignore[union-attr]
    except DistTimeoutError as exc:
        return (type(exc).__name__, exc.op, exc.seq, exc.missing_ranks)
    return ("returned", None, None, None)
