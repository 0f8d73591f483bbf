"""A peer's object cannot run code in real jobs: gloo under ``distcomm run -n 2``, mpi under
``mpirun -n 2``. Rank 1 sends an object whose ``__reduce__`` is ``os.system("touch MARKER")``
through ``all_gather_object``, or rank 0 through ``broadcast_object``: the receiving ranks
raise ObjectRefusedError naming ``posix.system`` and the sender, the job ends (not by a
timeout), and MARKER is never created (tests/support/hostile_objects.py)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import hostile_objects
import pytest
from jobs import run_job

SYSTEM = f"{os.system.__module__}.system"


def _launcher(name: str, request: pytest.FixtureRequest) -> list[str]:
    if name == "mpirun":
        return [request.getfixturevalue("mpirun"), "-n", "2", sys.executable]
    return [sys.executable, "-m", "distcomm", "run", "-n", "2", "--backend", "gloo"]


@pytest.mark.timeout(200)
@pytest.mark.parametrize(("op", "sender"), [("all_gather_object", 1), ("broadcast_object", 0)])
@pytest.mark.parametrize("launcher", ["distcomm run", "mpirun"])
def test_a_hostile_object_is_refused_and_the_job_ends(
    launcher: str, op: str, sender: int, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    marker = tmp_path / "pwned"
    command = [*_launcher(launcher, request), hostile_objects.__file__, op, str(marker)]
    done = run_job(command, timeout=150, cwd=tmp_path, env={"DISTCOMM_TIMEOUT": "60"})
    said = done.stdout + done.stderr
    assert not marker.exists(), f"the hostile object ran its command:\n{said[-4000:]}"
    assert done.returncode != 0, f"the job ended well:\n{said[-4000:]}"
    refusal = f"ObjectRefusedError: {op} (operation #"
    assert refusal in said, said[-4000:]
    assert f"refused rank {sender}'s object: it names {SYSTEM}" in said, said[-4000:]
    receivers = [0, 1] if op == "all_gather_object" else [1]  # the sender's own copy too
    for rank in receivers:  # its traceback, or distcomm run's line for a later failure
        told = (f"[rank {rank}] distcomm.errors.{refusal}", f"rank {rank}: also failed: {refusal}")
        assert any(line in said for line in told), (rank, said[-4000:])
    assert "DistTimeoutError" not in said and "timed out" not in said, said[-4000:]
    assert "finished" not in done.stdout, done.stdout
