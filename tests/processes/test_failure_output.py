"""What ``distcomm run`` shows when a rank fails: the root cause's traceback once, at the end,
under a heading; one line for every other rank; one prefix per line. Real 4-rank gloo jobs, and
the pieces (reports, root cause, one-liners) on their own."""

from __future__ import annotations

import signal
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from jobs import run_job

from distcomm._processes import failure_summary
from distcomm._processes.failure_summary import root_cause, summary_line
from distcomm._runtime.failure_reports import COMMUNICATION

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


#: Rank 1 calls a collective that rank 0 never calls, and waits 2 s for it (a timeout of its own
#: operation; DISTCOMM_DEBUG=off: no agreement check before it, init's rendezvous keeps its
#: default timeout); rank 0 raises once rank 1's report is written, and exits first, while rank
#: 1 sleeps at exit: the root cause is rank 0's error, though the timeout came first.
TIMES_OUT = """
import atexit, os, pathlib, time
import numpy as np
import distcomm

distcomm.init()
if distcomm.get_rank() == 1:
    atexit.register(time.sleep, 60)
    distcomm.all_reduce(np.ones(4), async_op=True).wait(timeout=2)
reports, deadline = pathlib.Path(os.environ["DISTCOMM_RUN_REPORTS"]), time.monotonic() + 60
while not (reports / "rank-1.json").exists() and time.monotonic() < deadline:
    time.sleep(0.05)
raise ValueError("rank 0 gives up")
"""


@pytest.mark.timeout(90)
def test_a_rank_that_timed_out_is_said_to_have_timed_out(tmp_path: Path) -> None:
    script = tmp_path / "times_out.py"
    script.write_text(TIMES_OUT)
    command = [sys.executable, "-m", "distcomm", "run", "-n", "2", "--backend", "gloo"]
    done = run_job([*command, str(script)], timeout=80, cwd=tmp_path, env={"DISTCOMM_DEBUG": "off"})
    lines = done.stderr.splitlines()
    assert done.returncode == 1, done.stderr
    assert lines[0].startswith("distcomm run: the first error: rank 0 on "), done.stderr
    assert "[rank 0] ValueError: rank 0 gives up" in lines, done.stderr
    own = [line for line in lines if line.startswith("distcomm run: rank 1: ")]
    assert len(own) == 1, done.stderr
    assert own[0].startswith("distcomm run: rank 1: timed out in all_reduce (operation #"), own
    assert own[0].endswith(" after 2 s, waiting for rank 0"), own
    assert "peer went away" not in done.stderr
    assert lines[-1] == "distcomm run: rank 0 failed with exit code 1; stopped the other ranks"


#: A rank that raises and takes longer than the launcher's 2 s hold to exit (a slow atexit
#: handler, as a busy machine's gloo teardown can be): its traceback is the error all the same.
EXITS_SLOWLY = """
import atexit, time
import distcomm

distcomm.init()
atexit.register(time.sleep, 3)
raise ValueError("rank 0 gives up slowly")
"""


@pytest.mark.timeout(60)
def test_the_traceback_of_a_rank_that_is_slow_to_exit_comes_under_the_heading(
    tmp_path: Path,
) -> None:
    script = tmp_path / "exits_slowly.py"
    script.write_text(EXITS_SLOWLY)
    command = [sys.executable, "-m", "distcomm", "run", "-n", "1", "--backend", "FakeLink"]
    done = run_job([*command, str(script)], timeout=50, cwd=tmp_path)
    lines = done.stderr.splitlines()
    assert done.returncode == 1, done.stderr
    assert lines[0].startswith("distcomm run: the first error: rank 0 on "), done.stderr
    assert lines[0].endswith("(exit code 1):"), done.stderr
    assert lines[1] == "[rank 0] Traceback (most recent call last):", done.stderr
    assert "[rank 0] ValueError: rank 0 gives up slowly" in lines, done.stderr


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


def report(rank: int, kind: str, at: float = 1.0, **fields: Any) -> dict[str, Any]:
    """A made-up report of ``rank``, raised at time ``at``, as failure_reports writes it."""
    types = {"timeout": "DistTimeoutError", "mismatch": "CollectiveMismatchError"}
    entry = {"rank": rank, "time": at, "kind": kind, "type": types.get(kind, "EngineError")}
    return {**entry, "communication": kind in COMMUNICATION, "message": "m", **fields}


@pytest.mark.parametrize(
    ("reports", "first_failed", "root"),
    [
        ({}, 1, 1),  # no reports: the first rank to fail
        ({0: report(0, "lost peer", 1.0), 3: report(3, "other", 2.0)}, 0, 3),
        ({2: report(2, "other", 3.0), 3: report(3, "other", 2.0)}, 2, 3),  # the earliest
        ({0: report(0, "lost peer", 2.0), 1: report(1, "timeout", 1.0)}, 0, 1),  # all secondary
        # a collective mismatch is a root cause, even when another rank's timeout came first
        ({0: report(0, "timeout", 1.0), 1: report(1, "mismatch", 5.0)}, 0, 1),
        ({0: report(0, "rank failed", 1.0), 1: report(1, "interrupted", 2.0)}, 0, 1),
    ],
    ids=["no-reports", "real-after-lost", "earliest-real", "only-secondary", "mismatch", "ctrl-c"],
)
def test_the_root_cause_is_the_earliest_real_error(
    reports: dict[int, dict[str, Any]], first_failed: int, root: int
) -> None:
    assert root_cause(reports, first_failed) == root


TIMEOUT = report(1, "timeout", op="all_reduce", seq=12, limit=5.0, missing_ranks=[0, 2])
MISMATCH = report(1, "mismatch", op="broadcast", seq=7)


@pytest.mark.parametrize(
    ("status", "own", "root", "line"),
    [
        (
            1,
            TIMEOUT,
            None,
            "timed out in all_reduce (operation #12) after 5 s, waiting for ranks 0, 2",
        ),
        (
            1,
            report(2, "timeout", op="recv", seq=None, limit=0.5, missing_ranks=None),
            None,
            "timed out in recv after 0.5 s",
        ),
        (1, report(2, "timeout", missing_ranks=[]), None, "timed out"),
        (
            1,
            report(2, "timeout", op="barrier", seq=2, limit=None, missing_ranks=[1]),
            None,
            "timed out in barrier (operation #2), waiting for rank 1",
        ),
        (
            1,
            report(2, "lost peer", op="all_gather", seq=3),
            None,
            "a peer went away during all_gather (operation #3)",
        ),
        (
            1,
            report(2, "lost peer", type="RuntimeError", message="Connection reset by peer\nmore"),
            None,
            "a peer went away (RuntimeError: Connection reset by peer)",
        ),
        (
            1,
            report(2, "mismatch", op="all_reduce", seq=7),
            MISMATCH,
            "collective mismatch at operation #7",
        ),
        (1, report(2, "mismatch"), None, "collective mismatch"),
        (
            1,
            report(2, "rank failed", type="RankFailedError", message="rank 2 failed:\nTraceback"),
            None,
            "another rank failed (RankFailedError: rank 2 failed:)",
        ),
        (
            130,
            report(2, "interrupted", type="KeyboardInterrupt", message=""),
            None,
            "interrupted (KeyboardInterrupt)",
        ),
        (
            1,
            report(2, "other", type="ValueError", message="x" * 300),
            None,
            "also failed: ValueError: " + "x" * 99 + "...",
        ),
        (1, report(2, "other", type="SystemError", message=""), None, "also failed: SystemError"),
        (-signal.SIGTERM, None, None, "stopped by distcomm run (SIGTERM)"),
        (
            -signal.SIGTERM,
            None,
            MISMATCH,
            "stopped by distcomm run (SIGTERM) after rank 1's collective mismatch at operation #7",
        ),
        (
            -signal.SIGKILL,
            None,
            TIMEOUT,
            "stopped by distcomm run (SIGKILL); rank 1 timed out waiting for it",
        ),
        (
            -signal.SIGTERM,
            None,
            report(1, "timeout", missing_ranks=[0]),
            "stopped by distcomm run (SIGTERM)",
        ),
        (-signal.SIGTERM, None, report(1, "other"), "stopped by distcomm run (SIGTERM)"),
        (0, None, MISMATCH, "finished"),
        (None, None, None, "still running"),
        (3, None, MISMATCH, "exit code 3"),
        (
            -signal.SIGKILL,
            None,
            MISMATCH,
            "stopped by distcomm run (SIGKILL) after rank 1's collective mismatch at operation #7",
        ),
        (-signal.SIGSEGV, None, None, "killed by SIGSEGV (signal 11)"),
        (139, None, None, "exit code 139"),  # a rank's own exit code, not a signal
    ],
)
def test_a_line_says_what_happened_to_the_rank(
    status: int | None, own: dict[str, Any] | None, root: dict[str, Any] | None, line: str
) -> None:
    assert summary_line(2, status, own, root) == f"rank 2: {line}"


@pytest.mark.parametrize(
    ("code", "ended", "failed"),
    [
        (1, "exit code 1", "failed with exit code 1"),
        (128, "exit code 128", "failed with exit code 128"),
        (130, "exit code 130", "failed with exit code 130"),  # a rank's own sys.exit(130)
        (-signal.SIGKILL, "killed by SIGKILL (signal 9)", "was killed by SIGKILL (signal 9)"),
        (-signal.SIGTERM, "killed by SIGTERM (signal 15)", "was killed by SIGTERM (signal 15)"),
    ],
)
def test_how_a_rank_ended_names_the_signal(code: int, ended: str, failed: str) -> None:
    assert failure_summary.ended(code) == ended
    assert failure_summary.failed(code) == failed


@pytest.mark.parametrize(
    ("status", "ended"),
    [
        (137, "killed by SIGKILL (signal 9; exit code 137)"),
        (143, "killed by SIGTERM (signal 15; exit code 143)"),
        (255, "exit code 255"),  # 128 + 127: no such signal
        (3, "exit code 3"),
    ],
)
def test_a_launcher_s_128_plus_n_is_read_as_the_signal(status: int, ended: str) -> None:
    assert failure_summary.ended(status, launcher=True) == ended


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
