"""A rank that is late: the others' DistTimeoutError shows where it is, with the name of the
function it sleeps in, on every backend (tests/support/straggler.py is each rank's body): gloo under
``distcomm run``, mpi under ``mpirun`` (where a blocked call ends the job with that diagnostic),
and fakelink thread-ranks. The stacks are asked for out of band (torch's store, MPI's side
channel, the fabric) while the late ranks sleep; the mpi suite (``mpirun pytest --with-mpi``)
checks the error of a timed-out Work there."""

from __future__ import annotations

import sys
import threading
from pathlib import Path

import numpy as np
import pytest
from jobs import run_job

import distcomm
from distcomm.testing import run_threads

STRAGGLER = str(Path(__file__).resolve().parent.parent / "support" / "straggler.py")
#: Below every limit of the run: the timed-out ranks ask, the late ones answer, all within it.
TIMEOUT = {"DISTCOMM_TIMEOUT": "2"}


def shows_the_late_ranks(message: str, inner: str = "wait_for(flags") -> None:
    """``message`` names the late ranks 1 and 3, grouped under one stack, the function they
    sleep in and the line there (``inner``)."""
    assert "ranks that had not arrived: [1, 3]" in message, message
    assert "Where the ranks that had not arrived are (Python stacks" in message, message
    assert "  ranks 1, 3:" in message, message
    assert "in load_a_huge_shard" in message, message
    assert inner in message, message


@pytest.mark.timeout(120)
def test_gloo_names_where_the_late_ranks_are(tmp_path: Path) -> None:
    command = [sys.executable, "-m", "distcomm", "run", "-n", "4", "--backend", "gloo"]
    done = run_job([*command, STRAGGLER, str(tmp_path)], cwd=tmp_path, env=TIMEOUT, timeout=100)
    assert done.returncode == 0, done.stderr
    for rank in (0, 2):
        start = done.stdout.index(f"[rank {rank}] rank {rank}: all_reduce (operation #1)")
        end = done.stdout.index("HINT", start)
        block = "\n".join(
            line.removeprefix(f"[rank {rank}] ") for line in done.stdout[start:end].splitlines()
        )
        shows_the_late_ranks(block)
    assert "c10d" not in done.stderr and "TCPStore" not in done.stderr, done.stderr


@pytest.mark.timeout(120)
@pytest.mark.usefixtures("aborted_mpich_job")
def test_mpi_ends_a_blocked_job_naming_where_the_late_ranks_are(
    tmp_path: Path, mpirun: str
) -> None:
    done = run_job(
        [mpirun, "-n", "4", sys.executable, STRAGGLER, str(tmp_path)],
        cwd=tmp_path,
        env=TIMEOUT,
        timeout=100,
    )
    assert done.returncode != 0
    start = done.stderr.index("all_reduce (operation #1) on mpi 'world' (4 ranks) did not complete")
    shows_the_late_ranks(done.stderr[start : done.stderr.index("MPI_Abort", start)])


@pytest.mark.timeout(60)
def test_thread_ranks_name_where_the_late_ranks_are(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DISTCOMM_TIMEOUT", "1")
    released = threading.Event()
    lock = threading.Lock()
    timed_out: list[int] = []

    def load_a_huge_shard() -> None:
        released.wait(30)

    def rank() -> tuple[str, dict[int, str]] | None:
        if distcomm.get_rank() % 2:
            load_a_huge_shard()
            return None
        try:
            distcomm.all_reduce(np.ones(2))
            return None
        except distcomm.DistTimeoutError as exc:
            return str(exc), exc.stacks
        finally:
            with lock:
                timed_out.append(distcomm.get_rank())
                if len(timed_out) == 2:
                    released.set()

    results = run_threads(rank, 4, timeout=40)
    for found in results[0::2]:
        assert found is not None, "the all-reduce returned without the late ranks"
        message, stacks = found
        shows_the_late_ranks(message, "released.wait(30)")
        assert sorted(stacks) == [1, 3] and "load_a_huge_shard" in stacks[1], stacks
