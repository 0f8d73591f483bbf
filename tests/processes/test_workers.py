"""Tests of distcomm._processes.workers: ``run_processes``, the process machinery of ``spawn``.

``spawn`` (tests/testing/test_spawn.py) covers it with a backend initialised in every process;
these start processes that initialise nothing (``backend=None``), with the caller's variables
and rank numbers. Two runs of 2 processes; the functions they run are defined at the top level,
because each process imports them by name.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from jobs import children_left

import distcomm
from distcomm._processes.workers import run_processes
from distcomm.errors import RankFailedError


@pytest.fixture(autouse=True)
def no_children_left() -> Iterator[None]:
    yield
    assert children_left() == []


def variables(index: int) -> dict[str, str]:
    return {"WORKER_INDEX": str(index)}


# -- what the processes run ---------------------------------------------------------------------
def report(tag: str) -> tuple[str, str, bool, int]:
    """Process 0 finishes last, so that the order of the results is not the order of arrival."""
    if os.environ["WORKER_INDEX"] == "0":
        time.sleep(0.5)
    return os.environ["WORKER_INDEX"], tag, distcomm.is_initialized(), os.getpid()


def second_fails(directory: str) -> None:
    """Process 1 raises once process 0 has written its pid; process 0 sleeps a minute."""
    index = os.environ["WORKER_INDEX"]
    Path(directory, f"{index}.part").write_text(str(os.getpid()))
    Path(directory, f"{index}.part").replace(Path(directory, f"{index}.pid"))
    if index == "1":
        deadline = time.monotonic() + 30
        while not Path(directory, "0.pid").exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        raise ValueError("worker 1 gives up")
    time.sleep(60)


# -- tests --------------------------------------------------------------------------------------
@pytest.mark.timeout(120)
def test_results_come_back_in_process_order_and_nothing_is_initialised() -> None:
    results = run_processes(report, 2, ("x",), variables=variables, backend=None, timeout=60)
    assert [r[:3] for r in results] == [("0", "x", False), ("1", "x", False)]
    pids = {r[3] for r in results}
    assert len(pids) == 2 and os.getpid() not in pids
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    assert "WORKER_INDEX" not in os.environ, "the variables are the processes', not ours"


@pytest.mark.timeout(120)
def test_a_raising_process_is_reported_at_once_and_the_other_stopped(tmp_path: Path) -> None:
    start = time.monotonic()
    with pytest.raises(RankFailedError) as info:
        run_processes(
            second_fails,
            2,
            (str(tmp_path),),
            variables=variables,
            backend=None,
            timeout=None,
            first_rank=4,
            world_size=8,
        )
    elapsed = time.monotonic() - start
    assert elapsed < 30, f"took {elapsed:.0f} s: the failure waited for the sleeping process"
    assert info.value.rank == 5, "process 1 is rank first_rank + 1"
    assert str(info.value).startswith("rank 5 of 8 failed:\nTraceback (most recent call last):")
    assert info.value.traceback.startswith("Traceback (most recent call last):")
    assert "ValueError: worker 1 gives up" in info.value.traceback
    pids = [int(path.read_text()) for path in tmp_path.glob("*.pid")]
    assert len(pids) == 2
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
