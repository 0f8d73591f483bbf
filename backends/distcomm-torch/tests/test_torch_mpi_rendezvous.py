"""gloo under mpirun: MPI gives no master address, so rank 0's reaches the others over MPI."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest
from jobs import run_job

SCRIPT = """
import sys, distcomm, numpy as np, torch.distributed as dist
comm = distcomm.init(backend="gloo")
total = np.array([comm.rank + 1.0])
distcomm.all_reduce(total)
with open(f"{sys.argv[1]}/rank-{comm.rank}.txt", "w") as out:
    out.write(f"{comm.launch.method} {comm.rank} {comm.world_size} {total[0]} "
              f"{dist.get_backend()} {comm.launch.master_addr}")
distcomm.finalize()
"""


@pytest.mark.timeout(120)
def test_gloo_rendezvous_over_mpi(tmp_path: Path, mpirun: str) -> None:
    script = tmp_path / "rank.py"
    script.write_text(textwrap.dedent(SCRIPT))
    done = run_job([mpirun, "-n", "3", sys.executable, str(script), str(tmp_path)], timeout=100)
    assert done.returncode == 0, done.stderr
    lines = [(tmp_path / f"rank-{r}.txt").read_text() for r in range(3)]
    assert lines == [f"mpi {r} 3 6.0 gloo 127.0.0.1" for r in range(3)]
