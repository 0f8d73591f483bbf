"""torch's groups over distcomm (``DISTCOMM_TORCH_GROUP=distcomm``) under real launchers, one
2-rank job per engine (tests/support/torch_under.py): gloo and the zmq plugin under
``distcomm run``, mpi under ``mpirun``. DDP matches an in-process reference and distcomm's hooks
see its all-reduces; a mismatch through torch is distcomm's CollectiveMismatchError on every
rank; a missing rank is named by distcomm's timeout. FSDP2, DeviceMesh and torch's calls over
mpi: backends/distcomm-mpi/mpi_tests/test_mpi_torch_under.py; HF Accelerate and Ignite over
distcomm: tests/test_interop.py."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from jobs import run_job

SCRIPT = str(Path(__file__).resolve().parent / "support" / "torch_under.py")
LINES = Path(SCRIPT).read_text().splitlines()
LATE = 1


@pytest.mark.timeout(240)
@pytest.mark.usefixtures("aborted_mpich_job")
@pytest.mark.parametrize(
    ("launcher", "backend", "engine_future"),
    [("distcomm run", "gloo", True), ("distcomm run", "zmq", True), ("mpirun", "mpi", False)],
    ids=["gloo", "zmq", "mpirun-mpi"],
)
def test_torch_s_groups_over_distcomm_under_a_launcher(
    launcher: str,
    backend: str,
    engine_future: bool,
    tmp_path: Path,
    request: pytest.FixtureRequest,
) -> None:
    """``engine_future``: whether the engine's Work has torch's future (gloo's; on one node,
    gloo's and zmq's all-reduces go through node memory, whose worker completes one), so that
    torch gets an all-reduce's work started, completing with it (DDP overlaps its backward),
    instead of done when it returns."""
    if launcher == "mpirun":
        command = [request.getfixturevalue("mpirun"), "-n", "2", sys.executable]
    else:
        command = [sys.executable, "-m", "distcomm", "run", "-n", "2", "--backend", backend]
    env = {"DISTCOMM_TORCH_GROUP": "distcomm", "TORCH_UNDER_TIMEOUT": "6"}
    done = run_job([*command, SCRIPT, str(tmp_path)], cwd=tmp_path, timeout=200, env=env)
    said_by_job = done.stdout[-4000:] + done.stderr[-4000:]
    for rank in range(2):
        seen = json.loads((tmp_path / f"rank-{rank}.json").read_text())
        assert (seen["backend"], seen["torch_backend"], seen["over"]) == (
            backend,
            "distcomm",
            True,
        ), seen
        assert seen["engine_future"] is engine_future, seen
        started = "_Started" if engine_future else "_Done"
        assert seen["torch_work"] == started, f"rank {rank}: {seen['torch_work']}, not {started}"
        ddp = seen["ddp"]
        assert ddp["worst"] <= 1e-5, f"rank {rank}: DDP is {ddp['worst']} off the reference"
        assert ddp["hooked"] == ddp["expected"], f"rank {rank}: the hooks saw {ddp}"
        said = seen["mismatch"]
        assert said.startswith("CollectiveMismatchError: "), f"rank {rank}: {said}"
        assert "shape (3,)" in said and "shape (4,)" in said, said
        line = next(n for n, text in enumerate(LINES, 1) if "# MISMATCH" in text)
        assert f"torch_under.py:{line}" in said, f"not the user's line {line}: {said}"
    named = f"ranks that had not arrived: [{LATE}]"
    if not seen["cancellable"]:  # the engine ends the job with the timeout's diagnostic
        assert done.returncode != 0 and named in done.stderr, said_by_job
        return
    assert done.returncode == 0, said_by_job
    assert (tmp_path / f"missing-{LATE}.txt").read_text() == "slept"
    said = (tmp_path / "missing-0.txt").read_text()
    assert said.startswith("DistTimeoutError: ") and named in said, said
