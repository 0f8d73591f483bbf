"""Under a real torchrun (the one that comes with torch): distcomm uses the agent's store, so a
successful job prints nothing on stderr but torchrun's own notices."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from jobs import job_environment, run_job

HELLO = Path(__file__).resolve().parents[2] / "examples" / "hello.py"
ELASTIC = HELLO.parent / "elastic_train.py"


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


#: Rank 1 fails on the job's first attempt, after init and a collective (torchrun restarts it).
FLAKY = """
import sys
import distcomm
comm = distcomm.init()
total = distcomm.all_reduce(comm.rank + 1)
if distcomm.restart_count() == 0 and comm.rank == 1:
    sys.exit("rank 1 fails on the first attempt")
print(f"rank {comm.rank}: restart {distcomm.restart_count()}: sum {total}", flush=True)
distcomm.finalize()
"""


@pytest.mark.stress
@pytest.mark.timeout(900)
def test_torchrun_restarts_complete_every_time(
    tmp_path: Path, repetitions: Callable[[int], int]
) -> None:
    """torchrun --max-restarts 1, several times in a row (3; 10 under scripts/stress.sh): the
    second attempt's init never reads a peer's address that the first attempt left in the
    agent's store (before: about half the runs ended with "Connection refused" or hung; raw
    torch.distributed does the same)."""
    torchrun = shutil.which("torchrun", path=os.path.dirname(sys.executable))
    assert torchrun is not None, "torchrun not found (it comes with torch)"
    program = tmp_path / "flaky.py"
    program.write_text(FLAKY)
    command = ["env", f"TMPDIR={tmp_path}", torchrun, "--nproc-per-node", "2", "--max-restarts"]
    failed = []
    runs = repetitions(10)
    for run in range(runs):
        done = run_job([*command, "1", str(program)], timeout=80, cwd=tmp_path)
        # the ranks write to one pipe unprefixed: their lines may interleave
        finished = [f"rank {r}: restart 1: sum 3" in done.stdout for r in (0, 1)]
        if done.returncode != 0 or not all(finished):
            failed.append((run, done.returncode, done.stdout, done.stderr[-2000:]))
    assert not failed, f"{len(failed)} of {runs} restarted jobs failed; the first: {failed[0]}"


@pytest.mark.timeout(300)
def test_the_elastic_example_resumes_under_torchrun(tmp_path: Path) -> None:
    """examples/elastic_train.py: rank 1 fails at epoch 3 of the first attempt; torchrun starts
    both again, they resume from the checkpoint and end with the uninterrupted run's weights."""
    torchrun = shutil.which("torchrun", path=os.path.dirname(sys.executable))
    assert torchrun is not None, "torchrun not found (it comes with torch)"
    example = [str(ELASTIC), "--epochs", "5", "--steps", "10"]
    plain = run_job(
        [sys.executable, "-m", "distcomm", "run", "-n", "2", *example, "--checkpoint", "a"],
        timeout=120,
        cwd=tmp_path,
    )
    command = ["env", f"TMPDIR={tmp_path}", torchrun, "--nproc-per-node", "2", "--max-restarts"]
    done = run_job(
        [*command, "1", *example, "--checkpoint", "b", "--crash-at", "3"], timeout=200, cwd=tmp_path
    )
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert lines[:2] == ["start: from epoch 0 of 5", "restart 1: from epoch 3 of 5"], lines
    assert lines[-1] == plain.stdout.splitlines()[-1].removeprefix("[rank 0] "), plain.stdout


#: A rank that writes its environment to OUT/env-<RANK>.json.
ENVIRONMENT = """
import json, os, sys
with open(os.path.join(sys.argv[1], f"env-{os.environ['RANK']}.json"), "w") as out:
    json.dump(dict(os.environ), out)
"""
#: What only torchrun sets, and why distcomm run does not: its agent's error files (distcomm run
#: has its own failure reports) and the signals its agent forwards.
TORCHRUN_ONLY = {"TORCHELASTIC_ERROR_FILE", "TORCHELASTIC_SIGNALS_TO_HANDLE"}
#: What only distcomm run sets: its run protocol, and unbuffered output (lines arrive as printed).
DISTCOMM_ONLY = {
    "DISTCOMM_RUN_ID",
    "DISTCOMM_RUN_PID",
    "DISTCOMM_RUN_REPORTS",
    "DISTCOMM_RUN_STDERR",
    "PYTHONUNBUFFERED",
}
#: Left out of the user's environment here: what both set only where the user did not, and
#: what distcomm run sets, which torchrun's ranks would otherwise inherit.
LEFT_OUT = {"OMP_NUM_THREADS", "TORCH_NCCL_ASYNC_ERROR_HANDLING", "PYTHONUNBUFFERED"}
#: Set by both, to other values: each job's own port and run id; rank 0 serves the store (no
#: agent store); the loopback address, which "localhost" may not resolve to first.
DIFFERENT = {"MASTER_PORT", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_USE_AGENT_STORE", "MASTER_ADDR"}


@pytest.mark.timeout(180)
def test_distcomm_run_sets_what_torchrun_sets(tmp_path: Path) -> None:
    """Issue 42: a rank's environment under ``distcomm run -n 2`` and ``torchrun
    --nproc-per-node 2``, variable by variable, from the same user environment (no
    OMP_NUM_THREADS: both set it to 1 and say so)."""
    torchrun = shutil.which("torchrun", path=os.path.dirname(sys.executable))
    assert torchrun is not None, "torchrun not found (it comes with torch)"
    program = tmp_path / "environment.py"
    program.write_text(ENVIRONMENT)
    seen = {}
    launchers = {
        "torchrun": [torchrun, "--nproc-per-node", "2"],
        "distcomm run": [sys.executable, "-m", "distcomm", "run", "-n", "2"],
    }
    for name, command in launchers.items():
        out = tmp_path / name.replace(" ", "-")
        out.mkdir()
        env = {k: v for k, v in job_environment().items() if k not in LEFT_OUT}
        done = subprocess.run(
            [*command, str(program), str(out)],
            env={**env, "TMPDIR": str(tmp_path)},
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=150,
            stdin=subprocess.DEVNULL,
        )
        assert done.returncode == 0, done.stdout + done.stderr
        assert "OMP_NUM_THREADS" in done.stderr, f"{name} did not say that it sets it"
        seen[name] = [json.loads((out / f"env-{r}.json").read_text()) for r in (0, 1)]
    for rank in (0, 1):
        theirs, ours = seen["torchrun"][rank], seen["distcomm run"][rank]
        assert set(theirs) - set(ours) == TORCHRUN_ONLY, f"rank {rank}: only torchrun sets"
        assert set(ours) - set(theirs) == DISTCOMM_ONLY, f"rank {rank}: only distcomm run sets"
        differ = {k for k in set(theirs) & set(ours) if theirs[k] != ours[k]}
        assert differ == DIFFERENT, {k: (theirs[k], ours[k]) for k in differ}
        assert ours["OMP_NUM_THREADS"] == "1" and ours["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "1"
