"""The MPI suite (``mpi_tests/``) inside real MPI jobs of 1, 2 and 4 ranks (MPICH from PyPI):
``mpirun -n N python -m pytest --with-mpi``, every rank running every test; distcomm's pytest
plugin ends the job as soon as one rank fails a test marked ``mpi``."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
from jobs import run_job

ROOT = Path(__file__).resolve().parents[3]
SUITE = "backends/distcomm-mpi/mpi_tests"


@pytest.mark.timeout(400)
@pytest.mark.parametrize("nprocs", [1, 2, 4])
def test_the_mpi_suite_passes_on_every_rank(nprocs: int, mpirun: str) -> None:
    pytest_args = ["-m", "pytest", "--with-mpi", "-q", "-p", "no:cacheprovider", "--timeout=300"]
    pytest_args += ["--timeout-method=thread", SUITE]
    done = run_job([mpirun, "-n", str(nprocs), sys.executable, *pytest_args], cwd=ROOT, timeout=360)
    said = done.stdout + done.stderr
    assert done.returncode == 0, said[-6000:]
    # each rank's last line: "N passed[, M skipped] in S s" (skips: pytest-mpi's world sizes)
    summaries = re.findall(r"(\d+) passed(?:, (\d+) skipped)? in [\d.]+s", done.stdout)
    assert len(summaries) == nprocs, said[-6000:]
    assert len({passed for passed, _ in summaries}) == 1, summaries  # the same on every rank
    assert "failed" not in done.stdout and "error" not in done.stdout.lower(), said[-6000:]
