"""The catalogue's rows on mpi: one ``mpirun -n 2`` job runs them all (docs/errors.md).

Each rank runs ``error_rows.py`` as a script (:func:`error_rows.mpi_rank`): the ``init``
mistakes before init, ``init`` with the launcher's own rank and world size, the catalogue's
conformance checks, ``init`` again, and the finalized communicator; it writes what each row
raised to a JSON file, which the test reads.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import error_rows
import jobs
import pytest


@pytest.mark.timeout(150)
def test_rows_on_mpi(tmp_path: Path, mpirun: str) -> None:
    command = [mpirun, "-n", "2", sys.executable, error_rows.__file__, str(tmp_path)]
    done = jobs.run_job(command, timeout=120, cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    for rank in range(2):
        rows = json.loads((tmp_path / f"rank-{rank}.json").read_text())
        error_rows.check_launched_rows(
            rows, backend="mpi", method="mpi", rank=rank, variables=("PMI_RANK", "PMI_SIZE")
        )
        error_rows.expect_row(rows, "equal rank and world_size", "returned", f"({rank}, 2)")
        error_rows.expect_row(
            rows,
            "mpi with device=cuda",
            "InvalidArgumentError",
            "backend 'mpi' was given device='cuda', but this MPI is not CUDA-aware",
            "HINT:",
        )
