"""Repository-wide pytest rules.

With CI=true a skipped test is a failure: every engine and tool the suite needs (torch, numpy,
the example plugin, and later mpi4py, mpirun, srun) is installed there, so a skip means a broken
install, not a missing machine. Only skips for what CI cannot have are allowed: a GPU, or an MPI
world of the wrong size; their reasons start with one of ``ALLOWED_SKIPS``.
"""

from __future__ import annotations

import os

import pytest

ALLOWED_SKIPS = ("needs CUDA", "needs world size")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):  # type: ignore[no-untyped-def]
    outcome = yield
    report = outcome.get_result()
    if os.environ.get("CI") != "true" or not report.skipped:
        return
    reason = str(report.longrepr[2]) if isinstance(report.longrepr, tuple) else str(report.longrepr)
    if reason.startswith("Skipped: "):
        reason = reason[len("Skipped: ") :]
    if not reason.startswith(ALLOWED_SKIPS):
        report.outcome = "failed"
        report.longrepr = f"skipped under CI=true, which must run everything: {reason}"
