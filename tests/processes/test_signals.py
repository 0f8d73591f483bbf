"""``distcomm run`` ended by SIGINT or SIGTERM leaves nothing in the temporary directory: its
``distcomm-run-*`` folder (the ranks' failure reports) is removed on every way out
(distcomm._processes.signals keeps the signals from cutting its making or its removal short).

Each launcher runs with ``TMPDIR`` set to a fresh folder that must be empty at the end: once with
the signal sent at set moments from outside (right after start, while Python starts, while the
ranks run), and once from inside, at the two narrowest moments (just after the folder is made,
and just before it is removed), where a signal used to end the launcher or raise
KeyboardInterrupt between the step and its cleanup.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from jobs import job_environment

#: A rank that records its pid, then sleeps (the launcher must stop it).
SLEEPER = """
import os, pathlib, sys, time
pathlib.Path(sys.argv[1], os.environ["RANK"] + ".pid").write_text(str(os.getpid()))
time.sleep(60)
"""

#: ``distcomm run -n 2 SCRIPT`` in a process that signals itself at a set step of distcomm run:
#: just after ``tempfile.mkdtemp`` made the run's folder ("made"), or just before
#: ``shutil.rmtree`` removes it ("removing").
SIGNALS_ITSELF = """
import os, shutil, signal, sys, tempfile
from distcomm.cli import main

sig, when, script = getattr(signal, sys.argv[1]), sys.argv[2], sys.argv[3]
make, remove = tempfile.mkdtemp, shutil.rmtree

def mkdtemp(*args, **kwargs):
    path = make(*args, **kwargs)
    if when == "made" and "distcomm-run-" in path:
        os.kill(os.getpid(), sig)
    return path

def rmtree(path, *args, **kwargs):
    if when == "removing" and "distcomm-run-" in str(path):
        os.kill(os.getpid(), sig)
    return remove(path, *args, **kwargs)

tempfile.mkdtemp, shutil.rmtree = mkdtemp, rmtree
sys.exit(main(["run", "-n", "2", script]))
"""


def launcher(command: list[str], tmp: Path, cwd: Path) -> subprocess.Popen[str]:
    """``command`` in a session of its own (a signal to it reaches nothing else), TMPDIR=tmp."""
    return subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
        cwd=cwd,
        env={**job_environment(), "TMPDIR": str(tmp)},
        start_new_session=True,
    )


def is_running(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return False
    return stat.rsplit(b")", 1)[1].split()[0] not in (b"Z", b"X")


def _ended_within(job: subprocess.Popen[str], seconds: float) -> bool:
    try:
        job.wait(timeout=seconds)
    except subprocess.TimeoutExpired:
        return False
    return True


def leftovers(tmp: Path) -> list[str]:
    return sorted(path.name for path in tmp.glob("distcomm-run-*"))


@pytest.mark.timeout(90)
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["sigint", "sigterm"])
@pytest.mark.parametrize("moment", ["at-once", "0.2s", "0.5s", "ranks-running"])
def test_a_signal_at_any_moment_leaves_no_run_folder(
    tmp_path: Path, sig: signal.Signals, moment: str
) -> None:
    tmp, pids = tmp_path / "tmp", tmp_path / "pids"
    tmp.mkdir()
    pids.mkdir()
    (tmp_path / "sleeper.py").write_text(SLEEPER)
    command = [sys.executable, "-m", "distcomm", "run", "-n", "2", "sleeper.py", str(pids)]
    job = launcher(command, tmp, tmp_path)
    try:
        if moment == "ranks-running":
            deadline = time.monotonic() + 60
            while len(list(pids.glob("*.pid"))) < 2 and time.monotonic() < deadline:
                assert job.poll() is None, job.communicate()
                time.sleep(0.05)
            assert leftovers(tmp), "the run's folder is there while the ranks run"
        elif moment != "at-once":
            time.sleep(float(moment.removesuffix("s")))
        job.send_signal(sig)
        if moment == "at-once":
            # Before distcomm's first line runs, a SIGINT is Python's KeyboardInterrupt, which
            # Python drops when it lands in a callback of its import machinery ("Exception
            # ignored in: ... _get_module_lock"): as a user would, press Ctrl-C again.
            while job.poll() is None and not _ended_within(job, 3):
                job.send_signal(sig)
        _, err = job.communicate(timeout=60)
    finally:
        job.kill()
        job.wait()
    if moment == "ranks-running":
        assert job.returncode == 128 + sig, err
    assert leftovers(tmp) == [], (job.returncode, err)
    ranks = [int(path.read_text()) for path in pids.glob("*.pid")]
    deadline = time.monotonic() + 5
    while any(map(is_running, ranks)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(map(is_running, ranks)), "a rank outlived its launcher"


@pytest.mark.timeout(90)
@pytest.mark.parametrize("sig", ["SIGINT", "SIGTERM"])
@pytest.mark.parametrize("when", ["made", "removing"])
def test_a_signal_between_a_step_and_its_cleanup_leaves_no_run_folder(
    tmp_path: Path, sig: str, when: str
) -> None:
    """Just after the folder is made, the launcher starts no rank and ends with 128 + N; just
    before it is removed (every rank finished well), the job's status stands."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    (tmp_path / "driver.py").write_text(SIGNALS_ITSELF)
    (tmp_path / "hello.py").write_text("print('hello')\n")
    command = [sys.executable, "driver.py", sig, when, "hello.py"]
    job = launcher(command, tmp, tmp_path)
    try:
        out, err = job.communicate(timeout=60)
    finally:
        job.kill()
        job.wait()
    assert leftovers(tmp) == [], (job.returncode, err)
    if when == "made":
        assert job.returncode == 128 + getattr(signal, sig), err
        assert out == "", "no rank was started"
    else:
        assert job.returncode == 0, err
        assert sorted(out.splitlines()) == ["[rank 0] hello", "[rank 1] hello"], out
    assert "Traceback" not in err, err
