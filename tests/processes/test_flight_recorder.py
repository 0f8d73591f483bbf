"""DISTCOMM_TRACE and ``distcomm trace``: a real 4-rank gloo job in which rank 3 skips a barrier;
the dumps name that rank and that operation. A real 4-rank MPI job that a rank aborts while rank
3 is elsewhere: rank 3 dumps too, asked first. Also: the signal, the permissions, bad settings."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
from jobs import run_job

import distcomm
from distcomm.errors import InvalidArgumentError, NotInitializedError

SKIPS = """
import numpy as np
import distcomm

distcomm.init()
rank = distcomm.get_rank()
for step in range(5):
    distcomm.all_reduce(np.ones(8, dtype=np.float32))
if rank != 3:
    distcomm.barrier()  # rank 3 skips it
distcomm.all_reduce(np.ones(8, dtype=np.float32))
distcomm.finalize()
"""


@pytest.mark.timeout(150)
def test_distcomm_trace_names_the_rank_that_skipped_and_the_operation(tmp_path: Path) -> None:
    script = tmp_path / "skips.py"
    script.write_text(SKIPS)
    traces = tmp_path / "traces"
    env = ["env", "DISTCOMM_TRACE=100", "DISTCOMM_TIMEOUT=4", "DISTCOMM_DEBUG=off"]
    env.append(f"DISTCOMM_TRACE_DIR={traces}")
    command = [sys.executable, "-m", "distcomm", "run", "-n", "4", "--backend", "gloo"]
    done = run_job([*env, *command, str(script)], timeout=120, cwd=tmp_path)
    assert done.returncode != 0, done.stdout + done.stderr
    dumps = sorted(traces.glob("rank-*.json"))
    assert [p.name for p in dumps] == [f"rank-{r}.json" for r in range(4)], done.stderr
    assert (traces.stat().st_mode & 0o777) == 0o700
    assert all((p.stat().st_mode & 0o777) == 0o600 for p in dumps)
    rank3 = json.loads((traces / "rank-3.json").read_text())
    ops = [e["op"] for e in rank3["entries"]]
    assert ops == ["all_reduce"] * 6 and rank3["entries"][-1]["site"].endswith("in <module>")
    said = run_job([sys.executable, "-m", "distcomm", "trace", str(traces)], timeout=60)
    assert said.returncode == 0, said.stderr
    first = next(line for line in said.stdout.splitlines() if "diverge" in line)
    assert "operation #6" in first and "ranks [0, 1, 2] called barrier" in first
    assert "rank 3 called all_reduce" in first and "skips.py:11" in first


WANDERS = """
import time
import numpy as np
import distcomm

def wander_off():
    time.sleep(60)

distcomm.init()
for step in range(5):
    distcomm.all_reduce(np.ones(8, dtype=np.float32))
if distcomm.get_rank() == 3:
    wander_off()
distcomm.barrier()
"""


@pytest.mark.timeout(150)
@pytest.mark.usefixtures("aborted_mpich_job")
def test_before_an_mpi_abort_every_rank_dumps(tmp_path: Path, mpirun: str) -> None:
    """The ranks in the barrier time out and one ends the job (MPI_Abort, which leaves no time
    for atexit); first it asks every rank to dump, rank 3 too, asleep elsewhere."""
    script = tmp_path / "wanders.py"
    script.write_text(WANDERS)
    traces = tmp_path / "traces"
    env = {"DISTCOMM_TRACE": "100", "DISTCOMM_TIMEOUT": "2", "DISTCOMM_TRACE_DIR": str(traces)}
    done = run_job([mpirun, "-n", "4", sys.executable, str(script)], env=env, cwd=tmp_path)
    assert done.returncode != 0 and "MPI_Abort" in done.stderr, done.stdout + done.stderr
    dumps = sorted(p.name for p in traces.glob("rank-*.json"))
    assert dumps == [f"rank-{r}.json" for r in range(4)], done.stderr
    said = run_job([sys.executable, "-m", "distcomm", "trace", str(traces)], timeout=60)
    assert said.returncode == 0, said.stderr
    assert "rank 3 stopped early: its last operation was #5 (all_reduce" in said.stdout
    assert "the others reached #6 (barrier)" in said.stdout, said.stdout


SIGNALLED = """
import os, signal
import numpy as np
import distcomm

distcomm.init()
distcomm.all_reduce(np.ones(2))
os.kill(os.getpid(), signal.SIGUSR2)  # dumps, and goes on
print("alive", flush=True)
"""


@pytest.mark.timeout(60)
def test_the_signal_dumps_and_the_rank_goes_on(tmp_path: Path) -> None:
    script = tmp_path / "signalled.py"
    script.write_text(SIGNALLED)
    env = ["env", "DISTCOMM_TRACE=10", f"DISTCOMM_TRACE_DIR={tmp_path / 't'}"]
    done = run_job([*env, sys.executable, str(script)], timeout=50, cwd=tmp_path)
    assert done.returncode == 0 and done.stdout == "alive\n", done.stderr
    dump = json.loads((tmp_path / "t" / "rank-0.json").read_text())
    assert [e["op"] for e in dump["entries"]] == ["all_reduce"]


def test_bad_settings_and_no_recorder(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(NotInitializedError, match="DISTCOMM_TRACE"):
        distcomm.dump_trace()
    for name, value in (("DISTCOMM_TRACE", "many"), ("DISTCOMM_TRACE_SIGNAL", "SIGNOPE")):
        with monkeypatch.context() as patch:
            patch.setenv("DISTCOMM_TRACE", "5")
            patch.setenv(name, value)
            with pytest.raises(InvalidArgumentError, match=rf"{name}=.*HINT"):
                distcomm.init()
            assert not distcomm.is_initialized()


def test_trace_of_a_folder_without_dumps_says_so(tmp_path: Path) -> None:
    done = run_job([sys.executable, "-m", "distcomm", "trace", str(tmp_path)], timeout=30)
    assert done.returncode == 2 and "HINT" in done.stderr and str(tmp_path) in done.stderr
    assert not os.listdir(tmp_path)
