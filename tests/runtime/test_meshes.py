"""A 2 x 2 mesh on 4 ranks, as a trainer builds it: data parallel along ``dp``, tensor parallel
along ``tp``, and DDP on ``mesh.torch()``'s ``dp`` group, under ``distcomm run`` (gloo) and
``mpirun`` (mpi, with torch's group made beside it). The program: tests/support/mesh_training.py.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import mesh_training
import pytest
from jobs import run_job

from distcomm.meshes import layout


def test_layout_is_row_major_as_torchs() -> None:
    assert layout((2, 3), ("dp", "tp"), 6) == {
        "dp": [(0, 3), (1, 4), (2, 5)],
        "tp": [(0, 1, 2), (3, 4, 5)],
    }
    assert layout((2, 1, 2), ("a", "b", "c"), 4)["c"] == [(0, 1), (2, 3)]


@pytest.mark.timeout(200)
@pytest.mark.parametrize("launcher", ["distcomm run", "mpirun"])
def test_a_two_by_two_mesh_trains_with_ddp_along_dp(
    launcher: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    program = [sys.executable, mesh_training.__file__, str(tmp_path)]
    if launcher == "mpirun":
        command = [request.getfixturevalue("mpirun"), "-n", "4", *program]
    else:
        command = [sys.executable, "-m", "distcomm", "run", "-n", "4", *program[1:]]
    done = run_job(command, timeout=150, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    seen = [json.loads((tmp_path / f"rank-{r}.json").read_text()) for r in range(4)]
    assert {s["backend"] for s in seen} == {"mpi" if launcher == "mpirun" else "gloo"}
    assert [s["coordinate"] for s in seen] == [[0, 0], [0, 1], [1, 0], [1, 1]]
    assert [s["dp_sum"] for s in seen] == [2.0, 4.0, 2.0, 4.0]  # 0+2, 1+3
    assert [s["tp"] for s in seen] == [[0.0, 10.0]] * 2 + [[20.0, 30.0]] * 2
    weights = [s["weights"] for s in seen]
    assert weights[0] == weights[2] and weights[1] == weights[3], "DDP kept a dp group apart"
    assert weights[0] != weights[1], "the dp groups trained on different data: they differ"
