"""DISTCOMM_TRACE and ``distcomm trace``: a real 4-rank gloo job in which rank 3 skips a barrier;
the dumps name that rank and that operation. A real 4-rank MPI job that a rank aborts while rank
3 is elsewhere: rank 3 dumps too, asked first. The black box: on gloo and mpi, a rank waiting
inside the engine dumps on the signal, and a rank killed by SIGKILL leaves its last calls. Also:
the signal, a forked child's signals, the permissions, bad settings, a dump's cached records."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
from jobs import job_environment, run_job

import distcomm
from distcomm._runtime.flight_recorder import FlightRecorder
from distcomm.backend._pipeline import recording
from distcomm.errors import InvalidArgumentError, NotInitializedError

T = TypeVar("T")

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
    assert "ranks [0, 1, 2] reached #6 (barrier)" in said.stdout, said.stdout


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
    bad = [("DISTCOMM_TRACE", "many"), ("DISTCOMM_TRACE_SIGNAL", "SIGNOPE")]
    bad.append(("DISTCOMM_TRACE_SIGNAL", "SIGKILL"))  # no handler can catch it
    for name, value in bad:
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


BLACK_BOX = """
import os, time
import numpy as np
import distcomm

distcomm.init()
rank = distcomm.get_rank()
for n in range(1, 6):
    distcomm.all_reduce(np.ones(n, dtype=np.float32))
with open(f"pid-{rank}.tmp", "w") as out:
    out.write(str(os.getpid()))
os.replace(f"pid-{rank}.tmp", f"pid-{rank}")
if rank == 0:
    distcomm.barrier()  # never joined: rank 0 waits inside the engine
else:
    time.sleep(120)
"""


@contextlib.contextmanager
def _started(
    command: list[str], env: dict[str, str], cwd: Path | None = None
) -> Iterator[subprocess.Popen[str]]:
    """``command`` started with its stdin, stdout and stderr piped (text); killed at the end
    if still running."""
    job = subprocess.Popen(
        command,
        cwd=cwd,
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        yield job
    finally:
        if job.poll() is None:
            job.kill()
            job.communicate()


def _until(what: str, seconds: float, look: Callable[[], T | None]) -> T:
    """``look()``'s first answer that is not None within ``seconds`` (an OSError is none); else
    fail naming ``what``."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            found = look()
        except OSError:
            found = None
        if found is not None:
            return found
        assert time.monotonic() < deadline, f"{what}: not within {seconds} s"
        time.sleep(0.05)


def _dumps(folder: Path, ranks: range, check: Callable[[dict[str, Any]], bool]) -> Any:
    """Each rank's dump in ``folder`` once every one passes ``check``; else None."""
    found = {}
    for rank in ranks:
        try:
            document = json.loads((folder / f"rank-{rank}.json").read_text())
        except (OSError, ValueError):
            return None
        if not check(document):
            return None
        found[rank] = document
    return found


def _runs(pid: int) -> bool:
    """Whether process ``pid`` runs (not gone, nor a zombie its launcher has not reaped yet)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _calls(document: dict[str, Any]) -> list[tuple[str, bool]]:
    return [(e["op"], e["completed"] is not None) for e in document["entries"]]


@pytest.mark.timeout(150)
@pytest.mark.parametrize("backend", ["gloo", "mpi"], ids=["gloo-distcomm-run", "mpi-mpirun"])
def test_a_rank_inside_the_engine_dumps_on_the_signal_and_a_killed_rank_leaves_its_calls(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """Three ranks: rank 0 waits in a barrier (inside Gloo or MPI), ranks 1 and 2 sleep. Each
    rank's file is its black box, kept current; SIGUSR2 makes the ranks dump within 3 s (sent
    to ``distcomm run``, which passes it on to each; under mpirun, to ranks 0 and 1); rank 2,
    killed by SIGKILL, leaves its calls (under mpirun, its black box), which ``distcomm trace``
    (the folder of jobs, by default) reads."""
    script = tmp_path / "black_box.py"
    script.write_text(BLACK_BOX)
    if backend == "gloo":
        launcher = [sys.executable, "-m", "distcomm", "run", "-n", "3", "--backend", "gloo"]
    else:
        request.getfixturevalue("aborted_mpich_job")  # hydra's files, left by the killed job
        launcher = [request.getfixturevalue("mpirun"), "-n", "3"]
    env = {**job_environment(), "DISTCOMM_TRACE": "50", "DISTCOMM_TIMEOUT": "100"}
    pids: dict[int, int] = {}
    try:
        with _started([*launcher, sys.executable, str(script)], env, tmp_path) as job:
            pids = _until(
                "every rank's pid file",
                60,
                lambda: (
                    {r: int((tmp_path / f"pid-{r}").read_text()) for r in range(3)}
                    if all((tmp_path / f"pid-{r}").exists() for r in range(3))
                    else None
                ),
            )
            jobs = tmp_path / "distcomm-trace"
            (folder,) = _until("the job's folder", 5, lambda: list(jobs.iterdir()) or None)
            boxes = _until(
                "the black boxes",
                5,
                lambda: _dumps(
                    folder,
                    range(3),
                    lambda d: (
                        d["reason"] == "black box" and len(d["entries"]) == 5 + (d["rank"] == 0)
                    ),
                ),
            )
            assert _calls(boxes[0]) == [("all_reduce", True)] * 5 + [("barrier", False)], boxes[0]
            assert _calls(boxes[2]) == [("all_reduce", True)] * 5, boxes[2]
            assert [e["shape"] for e in boxes[2]["entries"]] == [[n] for n in range(1, 6)]
            sent = time.time()
            signalled = range(3) if backend == "gloo" else range(2)
            if backend == "gloo":  # distcomm run passes it on to every rank
                os.kill(job.pid, signal.SIGUSR2)
            else:  # each rank in turn, rank 2 left out
                for rank in signalled:
                    os.kill(pids[rank], signal.SIGUSR2)
            dumped = _until(
                f"the dumps of rank 0 (inside the engine) and ranks {list(signalled)[1:]} (asleep) "
                "on SIGUSR2",
                3,
                lambda: _dumps(
                    folder, signalled, lambda d: d["reason"] == "SIGUSR2" and d["dumped"] >= sent
                ),
            )
            assert _calls(dumped[0])[-1] == ("barrier", False), dumped[0]
            os.kill(pids[2], signal.SIGKILL)
            out, err = job.communicate(timeout=60)
    finally:
        deadline = time.monotonic() + 10  # the launcher has ended every rank, or does
        while (left := [p for p in pids.values() if _runs(p)]) and time.monotonic() < deadline:
            time.sleep(0.05)
        for pid in left:
            os.kill(pid, signal.SIGKILL)
    assert not left, f"the launcher left ranks {left} running"
    assert job.returncode != 0, out + err
    assert "this rank's last calls" not in err, "distcomm run says where they are, once"
    if backend == "gloo":
        assert f"distcomm run: DISTCOMM_TRACE: the ranks' last calls go to {folder}\n" in err
        assert f"distcomm run: the ranks' last calls: distcomm trace {folder}\n" in err, err
    said = run_job([sys.executable, "-m", "distcomm", "trace"], timeout=60, cwd=tmp_path)
    assert said.returncode == 0, said.stderr
    lines = said.stdout.splitlines()
    assert lines[:2] == [
        f"{folder.relative_to(tmp_path)}: the newest of 1 job in distcomm-trace",
        "3 of 3 ranks dumped: 0, 1, 2",
    ]
    boxes_left = [
        line.split(" left only")[0] for line in lines if "left only its black box" in line
    ]
    assert boxes_left == ([] if backend == "gloo" else ["rank 2"]), lines
    if boxes_left:
        assert "(its last call: #5 all_reduce; written" in lines[2], lines
    assert "rank 2 stopped early: its last operation was #5 (all_reduce" in said.stdout


FORKS = """
import multiprocessing, os, signal, threading, time
import numpy as np
import distcomm

def child():
    time.sleep(60)

def fork_and_stop():
    worker = multiprocessing.get_context("fork").Process(target=child)
    worker.start()
    time.sleep(0.3)
    worker.terminate()  # SIGTERM to the child: its own signal, not its parent's
    worker.join()
    print(worker.exitcode, flush=True)

distcomm.init()
distcomm.all_reduce(np.ones(2))
fork_and_stop()
thread = threading.Thread(target=fork_and_stop)  # forked from a thread that is not the main one
thread.start()
thread.join()
time.sleep(0.5)
print("alive", flush=True)
"""


@pytest.mark.timeout(60)
def test_a_forked_child_stopped_by_sigterm_leaves_its_parent_and_its_file_alone(
    tmp_path: Path,
) -> None:
    """A data loader's workers are forked and stopped with SIGTERM: a child's signal must not
    reach the parent's black box (which would end the parent), nor its copy of the ring write
    the parent's file."""
    script = tmp_path / "forks.py"
    script.write_text(FORKS)
    env = {"DISTCOMM_TRACE": "10", "DISTCOMM_TRACE_DIR": str(tmp_path / "t")}
    done = run_job([sys.executable, str(script)], env=env, timeout=50, cwd=tmp_path)
    assert done.returncode == 0 and done.stdout == "-15\n-15\nalive\n", done.stdout + done.stderr
    dump = json.loads((tmp_path / "t" / "rank-0.json").read_text())
    assert dump["reason"] == "exit" and dump["pid"] != int(done.stdout.split()[0]), dump


def test_a_dump_encodes_an_entry_again_until_its_call_finished(tmp_path: Path) -> None:
    """The black box rewrites the file often: it keeps each finished entry's JSON, and must not
    keep the JSON of an entry written while its call still ran."""
    recorder = FlightRecorder(3, str(tmp_path / "rank-0.json"), 0, 1)
    kind = recording.head("all_reduce", (0,), "float32", 8, None)
    entries = [[kind, seq, (2,), None, 1.0, None, None] for seq in range(1, 5)]
    entries[0][recording.COMPLETED] = 2.0
    for entry in entries[:2]:
        recorder.add(entry)
    assert recorder.changed()
    first = json.loads(Path(recorder.dump("black box")).read_text())
    assert [e["completed"] for e in first["entries"]] == [2.0, None] and not recorder.changed()
    entries[1][recording.COMPLETED] = 3.0
    assert recorder.changed()
    for entry in entries[2:]:
        recorder.add(entry)
    entries[3][recording.ERROR] = "DistTimeoutError: waited"
    second = json.loads(Path(recorder.dump("exit")).read_text())
    assert second["entries"] == recorder.records()
    assert [(e["seq"], e["completed"], e["error"]) for e in second["entries"]] == [
        (2, 3.0, None),
        (3, None, None),
        (4, None, "DistTimeoutError: waited"),
    ]
    recorder.close("exit")
    closed = Path(recorder.path).read_text()
    entries[2][recording.COMPLETED] = 4.0
    recorder.dump("black box")  # after the last write: nothing
    assert Path(recorder.path).read_text() == closed and '"reason": "exit"' in closed


BURST = """
import os, sys, time
import numpy as np
import distcomm

distcomm.init()
for step in range(2000):
    distcomm.all_reduce(np.ones(1, dtype=np.float32))
print("ready", os.getpid(), flush=True)
sys.stdin.readline()  # the signals come meanwhile; then the test writes a line
print("alive", flush=True)
"""


@pytest.mark.timeout(60)
def test_a_burst_of_the_signal_is_answered_and_the_rank_goes_on(tmp_path: Path) -> None:
    """A hundred signals 2 ms apart (DISTCOMM_TRACE_SIGNAL=SIGUSR1, whose default would end the
    rank) while the main thread is in Python: a handler that came in the middle of another's
    write used to wait for that write's lock forever."""
    script = tmp_path / "burst.py"
    script.write_text(BURST)
    env = {**job_environment(), "DISTCOMM_TRACE": "2000", "DISTCOMM_TRACE_SIGNAL": "SIGUSR1"}
    env["DISTCOMM_TRACE_DIR"] = str(tmp_path / "t")
    with _started([sys.executable, str(script)], env) as job:
        assert job.stdout is not None
        pid = int(job.stdout.readline().split()[1])
        for _ in range(100):
            os.kill(pid, signal.SIGUSR1)
            time.sleep(0.002)
        out, err = job.communicate("go\n", timeout=30)
    assert job.returncode == 0 and out == "alive\n", (job.returncode, out, err)
    dump = json.loads((tmp_path / "t" / "rank-0.json").read_text())
    assert dump["reason"] == "exit" and len(dump["entries"]) == 2000, dump["reason"]
    assert os.listdir(tmp_path / "t") == ["rank-0.json"], "a write left its temporary file"


EXITING = """
import os
import numpy as np
import distcomm

distcomm.init()
for step in range(100000):
    distcomm.all_reduce(np.ones(1, dtype=np.float32))
print("exiting", flush=True)  # then the last write: 100000 entries, a few tenths of a second
"""


@pytest.mark.timeout(90)
def test_sigterm_during_the_last_write_ends_the_rank_by_sigterm_after_it(tmp_path: Path) -> None:
    """The handler that comes in the middle of the exit's write does not write (the write goes
    on), and the rank ends by SIGTERM once it is done: its file is whole, nothing is left."""
    script = tmp_path / "exiting.py"
    script.write_text(EXITING)
    env = {**job_environment(), "DISTCOMM_TRACE": "100000"}
    env["DISTCOMM_TRACE_DIR"] = str(tmp_path / "t")
    with _started([sys.executable, str(script)], env) as job:
        assert job.stdout is not None
        assert job.stdout.readline() == "exiting\n"
        os.kill(job.pid, signal.SIGTERM)
        _, err = job.communicate(timeout=60)
    assert job.returncode == -signal.SIGTERM, (job.returncode, err)
    dump = json.loads((tmp_path / "t" / "rank-0.json").read_text())
    assert dump["reason"] in ("exit", "SIGTERM") and len(dump["entries"]) == 100000
    assert os.listdir(tmp_path / "t") == ["rank-0.json"], "a write left its temporary file"


def test_an_earlier_jobs_files_in_the_same_folder_are_replaced_at_init(tmp_path: Path) -> None:
    """A folder named by DISTCOMM_TRACE_DIR (or mpirun's, which has no job id) holds the last
    job's files: at init each rank writes its own, and rank 0 removes those of ranks beyond
    this job's world."""
    folder = tmp_path / "t"
    folder.mkdir()
    for rank in (0, 2):
        (folder / f"rank-{rank}.json").write_text(json.dumps({"rank": rank, "entries": []}))
    script = tmp_path / "starts.py"
    script.write_text(
        "import distcomm\ndistcomm.init()\nprint(sorted(__import__('os')"
        f".listdir({str(folder)!r})), flush=True)\n"
    )
    env = {"DISTCOMM_TRACE": "10", "DISTCOMM_TRACE_DIR": str(folder)}
    done = run_job([sys.executable, str(script)], env=env, timeout=50, cwd=tmp_path)
    assert done.returncode == 0 and done.stdout == "['rank-0.json']\n", done.stdout + done.stderr


RAISES = """
import numpy as np
import distcomm

distcomm.init()
distcomm.all_reduce(np.ones(2))
if distcomm.get_rank() == 1:
    raise ValueError("a bug")
distcomm.barrier()
"""


@pytest.mark.timeout(90)
@pytest.mark.usefixtures("aborted_mpich_job")
def test_under_mpirun_a_ranks_failure_report_says_where_its_calls_are(
    tmp_path: Path, mpirun: str
) -> None:
    """No distcomm run to say it: the rank's report ends with the line, in the same write."""
    script = tmp_path / "raises.py"
    script.write_text(RAISES)
    done = run_job(
        [mpirun, "-n", "2", sys.executable, str(script)],
        env={"DISTCOMM_TRACE": "10"},
        timeout=60,
        cwd=tmp_path,
    )
    folder = tmp_path / "distcomm-trace" / "mpi-local"
    line = (
        f"[rank 1] distcomm: this rank's last calls: {folder / 'rank-1.json'}; every rank's: "
        f"distcomm trace {folder}\n"
    )
    assert done.returncode != 0 and line in done.stderr, done.stderr
    assert done.stderr.index("[rank 1] ValueError: a bug") < done.stderr.index(line)
