"""What ``distcomm run`` shows when a rank fails: the root cause's traceback once, at the end,
under a heading; one line for every other rank; one prefix per line. Real 4-rank gloo jobs, and
the pieces (reports, root cause, one-liners) on their own."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest
from jobs import run_job

from distcomm._processes.failures import root_cause, summary_line
from distcomm._runtime.failure_reports import is_communication_error
from distcomm.errors import DistTimeoutError, EngineError, RankFailedError

RAISES = """
import time
import numpy as np
import distcomm

distcomm.init()
rank = distcomm.get_rank()
distcomm.all_reduce(np.ones(4))
if rank == 2:
    SLOW
    raise ValueError("rank 2 breaks on purpose")
distcomm.all_reduce(np.ones(4))
distcomm.finalize()
"""
# rank 2 closes its connections first and exits last: its peers fail ("connection closed") and
# exit before it, which is what often happens in real jobs
SLOW_TO_DIE = """try:
        raise ValueError("rank 2 breaks on purpose")
    finally:
        import torch.distributed
        torch.distributed.destroy_process_group()
        time.sleep(1.5)"""


def run_failing(tmp_path: Path, slow: str) -> tuple[int, list[str]]:
    script = tmp_path / "fails.py"
    script.write_text(RAISES.replace("SLOW", slow))
    command = [sys.executable, "-m", "distcomm", "run", "-n", "4", "--backend", "gloo"]
    done = run_job([*command, str(script)], timeout=120, cwd=tmp_path)
    return done.returncode, done.stderr.splitlines()


@pytest.mark.timeout(150)
@pytest.mark.parametrize("slow", ["time.sleep(0.2)", SLOW_TO_DIE], ids=["raises", "dies-last"])
def test_the_root_cause_once_and_a_line_per_other_rank(tmp_path: Path, slow: str) -> None:
    code, lines = run_failing(tmp_path, slow)
    text = "\n".join(lines)
    assert code == 1, text
    assert sum("Traceback (most recent call last):" in line for line in lines) == 1, text
    heading = lines.index(next(line for line in lines if "the first error:" in line))
    assert lines[heading].startswith("distcomm run: the first error: rank 2 on "), text
    assert lines[heading + 1] == "[rank 2] Traceback (most recent call last):", text
    assert "[rank 2] ValueError: rank 2 breaks on purpose" in lines[heading + 2 :], text
    for rank in (0, 1, 3):
        own = [line for line in lines if line.startswith(f"distcomm run: rank {rank}: ")]
        assert len(own) == 1, text
        assert "peer went away" in own[0] or "stopped by distcomm run" in own[0], text
        assert not any(line.startswith(f"[rank {rank}] ") for line in lines), text
    assert "[rank2]:" not in text and "[rank0]:" not in text
    assert lines[-1] == "distcomm run: rank 2 failed with exit code 1; stopped the other ranks"


LOGS_A_TRACEBACK = """
import time, traceback
try:
    raise KeyError("handled")
except KeyError:
    traceback.print_exc()
time.sleep(3)
print("still going", flush=True)
"""


@pytest.mark.timeout(60)
def test_a_logged_traceback_of_a_rank_that_goes_on_is_shown(tmp_path: Path) -> None:
    script = tmp_path / "logs.py"
    script.write_text(LOGS_A_TRACEBACK)
    start = time.monotonic()
    done = run_job([sys.executable, "-m", "distcomm", "run", "-n", "1", str(script)], timeout=50)
    assert done.returncode == 0, done.stderr
    assert "[rank 0] KeyError: 'handled'" in done.stderr.splitlines()
    assert done.stdout.splitlines() == ["[rank 0] still going"]
    assert time.monotonic() - start < 30


def test_communication_errors_are_told_apart() -> None:
    assert is_communication_error(DistTimeoutError("barrier timed out"))
    assert is_communication_error(RankFailedError(3, "boom"))
    assert is_communication_error(EngineError("all_reduce failed: Connection closed by peer"))
    assert is_communication_error(RuntimeError("[pair.cc:534] Connection reset by peer"))
    assert not is_communication_error(RuntimeError("CUDA out of memory"))
    assert not is_communication_error(ValueError("Connection closed by peer"))


def test_the_root_cause_is_the_earliest_real_error() -> None:
    reports = {
        0: {"rank": 0, "time": 1.0, "communication": True},
        2: {"rank": 2, "time": 3.0, "communication": False},
        3: {"rank": 3, "time": 2.0, "communication": False},
    }
    assert root_cause(reports, first_failed=0) == 3
    assert root_cause({0: reports[0]}, first_failed=1) == 0  # only secondary errors: earliest
    assert root_cause({}, first_failed=1) == 1  # no reports: the first rank to fail
    gone = {"type": "EngineError", "message": "x" * 300, "communication": True}
    line = summary_line(1, 1, gone)
    assert line.startswith("rank 1: peer went away (EngineError: xxx") and len(line) < 160
    assert summary_line(4, 143, None) == "rank 4: stopped by distcomm run (SIGTERM)"
    assert summary_line(5, 0, None) == "rank 5: finished"
    assert summary_line(6, 3, None) == "rank 6: exit code 3"


PRINTS_THEN_DIES = """
import os, sys, time, traceback
if os.environ["RANK"] == "1":
    try:
        raise ValueError("bad shard")
    except ValueError:
        traceback.print_exc()
    time.sleep(3)  # the traceback is written after 2 s, while the rank goes on
    sys.exit(4)
time.sleep(30)
"""


@pytest.mark.timeout(60)
def test_a_root_traceback_already_written_is_not_written_again(tmp_path: Path) -> None:
    script = tmp_path / "prints.py"
    script.write_text(PRINTS_THEN_DIES)
    command = [sys.executable, "-m", "distcomm", "run", "-n", "2", "--grace", "1", str(script)]
    done = run_job(command, timeout=50, cwd=tmp_path)
    lines = done.stderr.splitlines()
    assert done.returncode == 4, done.stderr
    assert sum("Traceback" in line for line in lines) == 1, done.stderr
    heading = "distcomm run: the first error: rank 1 (exit code 4); its traceback is above"
    assert lines.index(heading) > lines.index("[rank 1] ValueError: bad shard"), done.stderr
    assert lines[-1] == "distcomm run: rank 1 failed with exit code 4; stopped the other ranks"
