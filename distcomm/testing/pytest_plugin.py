"""distcomm's pytest plugin (entry point ``pytest11``): a failing rank ends the MPI job at once.

Under ``mpirun -n N python -m pytest --with-mpi`` every rank runs every test. When one rank
fails a multi-rank test (marked ``mpi``, as pytest-mpi does) while the others wait in a
collective, a plain run deadlocks until the job's time limit. This plugin prints the failing
rank's report to stderr, prefixed with its rank, and calls ``MPI_Abort``, so the job ends within
seconds with the report that explains it.

It is inert outside an MPI launch of more than one rank, and imports mpi4py only to abort.
"""

from __future__ import annotations

import os
import sys

import pytest

from distcomm.environment.mpi import detect

__all__ = ["pytest_runtest_logreport"]


@pytest.hookimpl(trylast=True)
def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Abort the MPI job when this rank fails (or errors in) a test marked ``mpi``."""
    if not report.failed or "mpi" not in report.keywords:
        return
    launch = detect(os.environ)
    if launch is None or launch.world_size < 2:
        return
    prefix = f"[rank {launch.rank}] "
    lines = [
        f"distcomm: rank {launch.rank} of {launch.world_size} failed {report.nodeid} "
        f"({report.when}); aborting the MPI job so that the other ranks do not wait forever.",
        *report.longreprtext.splitlines(),
    ]
    sys.stderr.write("".join(f"{prefix}{line}\n" for line in lines))
    sys.stderr.flush()
    from mpi4py import MPI

    MPI.COMM_WORLD.Abort(1)
