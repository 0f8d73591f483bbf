"""torch-native libraries right after ``distcomm.init()``: DDP, FSDP, HF Accelerate and
PyTorch-Ignite in one 2-rank job per launcher (tests/support/interop_clients.py): ``distcomm run``
(gloo, which makes torch's default group itself) and ``mpirun`` (mpi, with the group distcomm
makes beside it), and again with torch's group over distcomm
(``DISTCOMM_TORCH_GROUP=distcomm``). ``srun --mpi=pmi2``: tests/launchers/test_slurm.py. A
numpy-only program under mpirun makes no group, and does not even import torch."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from interop_records import check_interop
from jobs import run_job

CLIENTS = str(Path(__file__).resolve().parent / "support" / "interop_clients.py")


@pytest.mark.timeout(240)
@pytest.mark.usefixtures("aborted_mpich_job")
@pytest.mark.parametrize(
    ("launcher", "backend", "torch_group"),
    [
        ("distcomm run", "gloo", "auto"),
        ("mpirun", "mpi", "auto"),
        ("distcomm run", "gloo", "distcomm"),
        ("mpirun", "mpi", "distcomm"),
    ],
)
def test_torch_native_libraries_work_after_init(
    launcher: str, backend: str, torch_group: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """Beside (``"auto"``: torch's own Gloo group) and over distcomm (``"distcomm"``: torch's
    group ``"distcomm"`` on distcomm's communicator), the libraries give the same results."""
    if launcher == "mpirun":
        command = [request.getfixturevalue("mpirun"), "-n", "2", sys.executable]
    else:
        command = [sys.executable, "-m", "distcomm", "run", "-n", "2"]
    env = {"DISTCOMM_TORCH_GROUP": torch_group}
    done = run_job([*command, CLIENTS, str(tmp_path)], cwd=tmp_path, timeout=200, env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    check_interop(tmp_path, 2, backend, "gloo" if torch_group == "auto" else "distcomm")


NUMPY_ONLY = """
import sys
from pathlib import Path
import numpy as np
import distcomm

comm = distcomm.init()
x = np.ones(2)
distcomm.all_reduce(x)
seen = f"{comm.backend} {comm.torch_group} {'torch' in sys.modules} {x.tolist()}"
Path(sys.argv[1], f"rank-{comm.rank}.txt").write_text(seen)  # ranks' stdout interleave
"""


@pytest.mark.timeout(120)
@pytest.mark.usefixtures("aborted_mpich_job")
def test_a_numpy_only_program_under_mpirun_imports_no_torch(tmp_path: Path, mpirun: str) -> None:
    script = tmp_path / "numpy_only.py"
    script.write_text(NUMPY_ONLY)
    command = [mpirun, "-n", "2", sys.executable, str(script), str(tmp_path)]
    done = run_job(command, cwd=tmp_path, timeout=100)
    assert done.returncode == 0, done.stderr
    seen = [(tmp_path / f"rank-{rank}.txt").read_text() for rank in range(2)]
    assert seen == ["mpi None False [2.0, 2.0]"] * 2
