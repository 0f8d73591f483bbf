"""Under a real torchrun (the one that comes with torch): distcomm uses the agent's store, so a
successful job prints nothing on stderr but torchrun's own notices."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest
from jobs import run_job

HELLO = Path(__file__).resolve().parents[2] / "examples" / "hello.py"


@pytest.mark.timeout(180)
def test_torchrun_hello_prints_no_noise(tmp_path: Path) -> None:
    torchrun = shutil.which("torchrun", path=os.path.dirname(sys.executable))
    assert torchrun is not None, "torchrun not found (it comes with torch)"
    # TMPDIR: torchrun leaves a torchelastic_* folder in the temporary directory
    command = ["env", f"TMPDIR={tmp_path}", torchrun, "--nproc-per-node", "2", str(HELLO)]
    done = run_job(command, timeout=150, cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.splitlines() == [
        "2 ranks on gloo (env launch): sum of ranks 1 (expected 1)",
        "hello from rank-0, rank-1",
    ]
    # torchrun's notices (its OMP_NUM_THREADS banner) come from torch/distributed/run.py
    noise = [line for line in done.stderr.splitlines() if "torch/distributed/run.py" not in line]
    assert noise == [], "lines on stderr from distcomm or c10d:\n" + "\n".join(noise)
