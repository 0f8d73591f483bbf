"""The issue's case as a user meets it: a fresh job, nothing set, rank 0 all-reduces 6 elements and
the others 4. Without the check, gloo ranks 1-3 returned wrong sums and MPICH aborted the job
("Message truncated"); with it every rank raises CollectiveMismatchError and the job goes on.

Real engines, real launchers: gloo under ``distcomm run -n 4``, mpi under ``mpirun -n 2`` and
``-n 4``.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
from jobs import run_job

JOB = """
import numpy as np

import distcomm

comm = distcomm.init()
x = np.ones(6 if comm.rank == 0 else 4, dtype=np.float32)  # a bug: rank 0's batch is larger
try:
    distcomm.all_reduce(x)
    print(f"rank {comm.rank}: returned {x.tolist()}", flush=True)
except distcomm.CollectiveMismatchError as exc:
    print(f"rank {comm.rank}: mismatch {[row['numel'] for row in exc.table]}", flush=True)
y = np.ones(2)
distcomm.all_reduce(y)  # the communicator is still usable
print(f"rank {comm.rank}: then {y.tolist()}", flush=True)
distcomm.finalize()
"""


@pytest.mark.timeout(200)
@pytest.mark.parametrize(
    ("backend", "size"), [("gloo", 4), ("mpi", 2), ("mpi", 4)], ids=["gloo-4", "mpi-2", "mpi-4"]
)
def test_a_size_mismatch_raises_on_every_rank_with_nothing_set(
    backend: str, size: int, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    script = tmp_path / "mismatch.py"
    script.write_text(JOB)
    if backend == "gloo":
        command = [sys.executable, "-m", "distcomm", "run", "-n", str(size), "--backend", "gloo"]
    else:
        command = [request.getfixturevalue("mpirun"), "-n", str(size), sys.executable]
    done = run_job([*command, str(script)])
    assert done.returncode == 0, done.stdout + done.stderr
    # mpirun interleaves the ranks' lines (one may follow another without a newline)
    said = set(re.findall(r"rank (\d+): (\w+) (\[[^\]]*\])", done.stdout))
    counts = str([6] + [4] * (size - 1))
    then = str([float(size)] * 2)
    expected = {(str(r), "mismatch", counts) for r in range(size)}
    assert said == expected | {(str(r), "then", then) for r in range(size)}, done.stdout
