"""A collective mismatch late in a job, 4 ranks, nothing set: no rank ends as if nothing happened,
and every rank's error names the first diverging operation (tests/support/late_mismatch.py holds the
program and its scenarios: a size, dtype, op or root mismatch at operation #100, #2000 or
#5000, followed by 0 or 50 more calls before ``finalize()``).

- fakelink thread-ranks and mpi under ``mpirun -n 4``: every scenario as its own world or job.
  Under mpirun the job ends (MPI cannot give up a blocked collective): one report per rank,
  each line ``[rank N]``-prefixed, ending at the user's line, and /dev/shm as it was.
- gloo and the zmq plugin under ``distcomm run -n 4``: scenarios that cover every kind,
  position and number of calls after, in one job, each on a group of its own (a short group
  timeout brings back the ranks that waited in the engine: seconds a scenario), and, as a user
  runs it, uncaught, two scenarios whose summary names the mismatch for every rank.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

import late_mismatch
import pytest
from jobs import dev_shm_names, run_job

import distcomm
from distcomm.testing import run_threads

PROGRAM = late_mismatch.__file__
SCENARIOS = late_mismatch.scenarios()
IDS = [late_mismatch.name(*s) for s in SCENARIOS]
#: What every rank must have raised, by scenario: the error and the first diverging operation.
MISMATCH = "CollectiveMismatchError"


@pytest.mark.timeout(120)
@pytest.mark.parametrize(("kind", "at", "after"), SCENARIOS, ids=IDS)
def test_thread_ranks_all_name_the_first_diverging_operation(
    kind: str, at: int, after: int
) -> None:
    def body() -> list[Any]:
        try:
            late_mismatch.scenario(distcomm.get_communicator(), kind, at, after)
        except Exception as exc:
            return late_mismatch.outcome(exc)
        return late_mismatch.outcome(None)

    results = run_threads(body, 4, timeout=100)
    assert [r[:2] for r in results] == [[MISMATCH, at]] * 4, results


@pytest.mark.timeout(200)
@pytest.mark.usefixtures("aborted_mpich_job")
@pytest.mark.parametrize(("kind", "at", "after"), SCENARIOS, ids=IDS)
def test_under_mpirun_the_job_ends_with_whole_prefixed_reports_naming_it(
    kind: str, at: int, after: int, tmp_path: Path, mpirun: str
) -> None:
    shm = dev_shm_names()
    command = [mpirun, "-n", "4", sys.executable, PROGRAM, kind, str(at), str(after)]
    done = run_job(command, timeout=150, cwd=tmp_path)
    err = done.stderr
    assert done.returncode != 0, "a job whose ranks disagreed ended well"
    assert "finished" not in done.stdout, done.stdout
    assert f"{MISMATCH}: collective mismatch at operation #{at} " in err, err[-3000:]
    # MPICH's own "Abort(1) on node ..." lines are the only ones without a rank's prefix
    lines = re.sub(r"Abort\(\d+\) on node [^\n]*?process \d+", "\n", err).splitlines()
    unprefixed = [line for line in lines if line.strip() and not re.match(r"\[rank \d\] ", line)]
    assert not unprefixed, err[-3000:]
    for rank in range(4):
        mine = [i for i, line in enumerate(lines) if line.startswith(f"[rank {rank}] ")]
        assert len([i for i in mine if "Traceback" in lines[i]]) <= 1, f"rank {rank}: {err}"
        if mine:
            whole = list(range(mine[0], mine[-1] + 1))
            assert mine == whole, f"rank {rank}'s report is interleaved with another's:\n{err}"
    assert f'{PROGRAM}", line' in err, "the user's line"
    assert "distcomm/backend" not in err and "_pipeline" not in err, "an internal frame"
    assert not dev_shm_names() - shm, "the aborted job left files in /dev/shm"


#: Scenarios that cover every kind, the first two positions and every number of calls after (a
#: gloo or zmq scenario takes seconds: the ranks in the engine come back at the group's timeout,
#: and 4 gloo ranks on 2 cores take 5 ms an all-reduce, so #5000 alone took 25 s; every kind at
#: #5000 runs under mpirun and on thread ranks, where the same mismatch check decides).
COVERING = [("size", 100, 0), ("dtype", 2000, 50), ("op", 2000, 0), ("root", 100, 50)]


@pytest.mark.timeout(400)
@pytest.mark.parametrize("backend", ["gloo", "zmq"])
def test_scenarios_in_one_job_every_rank_names_the_operation(backend: str, tmp_path: Path) -> None:
    names = [late_mismatch.name(*s) for s in COVERING]
    command = [sys.executable, "-m", "distcomm", "run", "-n", "4", "--backend", backend]
    done = run_job([*command, PROGRAM, "--matrix", str(tmp_path), *names], timeout=360)
    assert done.returncode == 0, done.stderr[-4000:]
    wrong = {}
    for rank in range(4):
        results = json.loads((tmp_path / f"rank-{rank}.json").read_text())
        for scenario, (_, at, _) in zip(names, COVERING, strict=True):
            if results[scenario][:2] != [MISMATCH, at]:
                wrong[(rank, scenario)] = results[scenario]
    assert not wrong, wrong


@pytest.mark.timeout(200)
@pytest.mark.parametrize("backend", ["gloo", "zmq"])
@pytest.mark.parametrize(("kind", "at", "after"), [("size", 100, 0), ("dtype", 2000, 50)])
def test_distcomm_run_names_the_mismatch_for_every_rank(
    backend: str, kind: str, at: int, after: int, tmp_path: Path
) -> None:
    command = [sys.executable, "-m", "distcomm", "run", "-n", "4", "--backend", backend]
    done = run_job([*command, PROGRAM, kind, str(at), str(after)], timeout=150, cwd=tmp_path)
    assert done.returncode == 1, done.stderr[-4000:]
    assert "finished" not in done.stdout, done.stdout
    said = done.stderr
    assert f"{MISMATCH}: collective mismatch at operation #{at} " in said, said[-4000:]
    root = int(re.findall(r"distcomm run: the first error: rank (\d)", said)[0])
    assert re.search(rf"\[rank {root}\] distcomm.errors.{MISMATCH}: .* #{at} ", said), said
    for rank in set(range(4)) - {root}:
        line = f"distcomm run: rank {rank}: "
        told = [x for x in said.splitlines() if x.startswith(line)]
        assert len(told) == 1 and f"collective mismatch at operation #{at}" in told[0], said
    assert "distcomm/backend" not in said and "_pipeline" not in said, "an internal frame"


#: The launchers of the varying-sizes table: (backend, the array library, the launcher).
VARYING_JOBS = [("gloo", "torch", "distcomm run"), ("zmq", "numpy", "distcomm run")]


def _varying_command(backend: str, launcher: str, at: int, mpirun: str | None) -> list[str]:
    program = [sys.executable, PROGRAM, "varying", str(at), "50"]
    if launcher == "mpirun":
        return [str(mpirun), "-n", "2", *program]
    return [sys.executable, "-m", "distcomm", "run", "-n", "2", "--backend", backend, *program]


def _check_varying_job(done: Any, at: int, shm: set[str]) -> None:
    """Both ranks' calls at ``#at`` named (the sizes of the turn's next two) by rank 1, whose
    call was a step the ranks never made (confirmed first, while rank 0 waits in the engine):
    no engine's abort, and nothing left in /dev/shm."""
    said = done.stderr
    assert done.returncode != 0, "a job whose ranks disagreed ended well"
    assert "finished" not in done.stdout, done.stdout
    assert f"{MISMATCH}: collective mismatch at operation #{at} " in said, said[-4000:]
    sizes = late_mismatch.VARYING
    mine, theirs = sizes[at % len(sizes)], sizes[(at + 1) % len(sizes)]
    assert re.search(rf"rank 0: all_reduce, shape \({mine},\), float32, {mine} elements", said)
    assert re.search(rf"rank 1: all_reduce, shape \({theirs},\), float32, {theirs} elements", said)
    for engine_said in ("gloo::EnforceNotMet", "Message truncated", "Fatal error", "SIGABRT"):
        assert engine_said not in said, f"the engine saw the mismatch first:\n{said[-4000:]}"
    assert not dev_shm_names() - shm, "the job left files in /dev/shm"


@pytest.mark.timeout(200)
@pytest.mark.parametrize("at", [700, 2500])
@pytest.mark.parametrize(("backend", "lib", "launcher"), VARYING_JOBS, ids=["gloo", "zmq"])
def test_a_late_mismatch_among_varying_sizes_is_named_before_the_engine_sees_it(
    backend: str, lib: str, launcher: str, at: int, tmp_path: Path
) -> None:
    """37 sizes in turn, each agreed on long before, rank 1 one size off at ``#at``: without the
    check of a varying op's calls, Gloo ended the process from C and zmq raised a ValueError."""
    shm = dev_shm_names()
    command = _varying_command(backend, launcher, at, None)
    done = run_job(command, timeout=150, cwd=tmp_path, env={"LATE_MISMATCH_LIB": lib})
    _check_varying_job(done, at, shm)


@pytest.mark.timeout(200)
@pytest.mark.usefixtures("aborted_mpich_job")
@pytest.mark.parametrize("at", [700, 2500])
def test_under_mpirun_a_late_mismatch_among_varying_sizes_is_named_before_mpi_sees_it(
    at: int, tmp_path: Path, mpirun: str
) -> None:
    """The same under ``mpirun -n 2`` with numpy: without the check, MPICH ended the job from C
    ("Message truncated"), or one rank hung until the timeout."""
    shm = dev_shm_names()
    done = run_job(_varying_command("mpi", "mpirun", at, mpirun), timeout=150, cwd=tmp_path)
    _check_varying_job(done, at, shm)
