"""``distcomm run --max-restarts N``: when a rank fails, every rank is stopped and a fresh world
started (a new run id and port, TORCHELASTIC_RESTART_COUNT and ``distcomm.restart_count()``
saying which restart), up to N more times; each failed attempt's summary is shown and the exit
status is the last attempt's. Real jobs on gloo."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from jobs import run_job

#: Rank 1 fails on the job's first attempt only; every rank then says what it saw.
FLAKY = """
import os, sys
import distcomm
comm = distcomm.init()
restart = distcomm.restart_count()
if restart == 0 and comm.rank == 1:
    sys.exit(f"rank 1 fails on attempt 0 (TORCHELASTIC_RESTART_COUNT="
             f"{os.environ['TORCHELASTIC_RESTART_COUNT']})")
total = distcomm.all_reduce(comm.rank)
print(f"rank {comm.rank}: restart {restart}, run {os.environ['DISTCOMM_RUN_ID']}, "
      f"port {os.environ['MASTER_PORT']}, sum {total}")
distcomm.finalize()
"""

#: Rank 1 fails on every attempt, with exit status 3 + the restart count, once rank 0 has said
#: which attempt it is in (else, on a loaded machine, rank 0 could be stopped before it prints).
ALWAYS = """
import os, pathlib, sys, time
restart = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
print(f"attempt {restart}: run {os.environ['DISTCOMM_RUN_ID']}", flush=True)
said = pathlib.Path(f"rank-0-said-attempt-{restart}")
if os.environ["RANK"] == "0":
    said.write_text("")
else:
    deadline = time.monotonic() + 60
    while not said.exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    sys.exit(3 + restart)
"""


def run(tmp_path: Path, script: str, *options: str) -> tuple[int, str, str]:
    program = tmp_path / "program.py"
    program.write_text(script)
    command = [sys.executable, "-m", "distcomm", "run", "-n", "2", "--backend", "gloo", *options]
    done = run_job([*command, str(program)], timeout=150, cwd=tmp_path)
    return done.returncode, done.stdout, done.stderr


@pytest.mark.timeout(180)
def test_a_rank_that_fails_once_is_restarted_with_every_rank_in_a_fresh_world(
    tmp_path: Path,
) -> None:
    status, out, err = run(tmp_path, FLAKY, "--max-restarts", "1")
    assert status == 0, err
    lines = sorted(line for line in out.splitlines() if line.startswith("[rank"))
    assert [line.split(":")[1].split(",")[0] for line in lines] == [" restart 1"] * 2, out
    assert all(line.endswith("sum 1") for line in lines), out
    said = [line for line in err.splitlines() if line.startswith("distcomm run: ")]
    assert said == [
        "distcomm run: rank 0: stopped by distcomm run (SIGTERM)",
        "distcomm run: rank 1 failed with exit code 1; stopped the other ranks",
        "distcomm run: attempt 1 of 2 failed (exit code 1); starting every rank again "
        "(restart 1 of 1)",
    ], err
    assert "rank 1 fails on attempt 0 (TORCHELASTIC_RESTART_COUNT=0)" in err


@pytest.mark.timeout(120)
def test_a_rank_that_always_fails_ends_after_n_plus_one_attempts_with_the_last_status(
    tmp_path: Path,
) -> None:
    status, out, err = run(tmp_path, ALWAYS, "--max-restarts", "2")
    assert status == 5, "the last attempt's exit status (3 + restart 2)"
    attempts = [line for line in out.splitlines() if line.startswith("[rank 0] attempt")]
    assert [line.split(":")[0] for line in attempts] == [
        "[rank 0] attempt 0",
        "[rank 0] attempt 1",
        "[rank 0] attempt 2",
    ], out
    assert len({line.split("run ")[1] for line in attempts}) == 3, "each attempt: a new run id"
    failed = [line for line in err.splitlines() if "failed with exit code" in line]
    assert failed == [
        f"distcomm run: rank 1 failed with exit code {c}; stopped the other ranks"
        for c in (3, 4, 5)
    ], err
    again = [line for line in err.splitlines() if "starting every rank again" in line]
    assert len(again) == 2 and "(restart 2 of 2)" in again[1], err


def test_a_negative_number_of_restarts_is_refused(tmp_path: Path) -> None:
    status, _, err = run(tmp_path, ALWAYS, "--max-restarts", "-1")
    assert status == 2 and "--max-restarts -1 must be at least 0" in err, err


@pytest.mark.stress
@pytest.mark.timeout(600)
def test_restarted_jobs_in_a_row_all_complete(
    tmp_path: Path, repetitions: Callable[[int], int]
) -> None:
    """The torchrun restart test's program under distcomm run --max-restarts 1, several times
    in a row (3; 10 under scripts/stress.sh)."""
    runs = repetitions(10)
    outcomes = [run(tmp_path, FLAKY, "--max-restarts", "1") for _ in range(runs)]
    failed = [(i, o) for i, o in enumerate(outcomes) if o[0] != 0 or o[1].count("restart 1") != 2]
    assert not failed, f"{len(failed)} of {runs} failed; the first: {failed[0]}"
