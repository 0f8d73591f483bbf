"""Tests of ``distcomm run`` (distcomm._processes.supervisor and the ``run`` subcommand of the
CLI).

Most run the real command in a subprocess (``python -m distcomm run ...``) on small scripts
written to tmp_path. Jobs that must be stopped have ranks that sleep 60 s: the subprocess
timeout of 30 s is what shows that they were stopped, and every rank writes its pid so that the
test can check that no process is left.
"""

from __future__ import annotations

import importlib.util
import io
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from jobs import RUN_VARIABLES as KEYS
from jobs import job_environment

from distcomm._processes.supervisor import run
from distcomm.cli import main
from distcomm.errors import InvalidArgumentError

needs_distcomm_torch = pytest.mark.skipif(
    importlib.util.find_spec("distcomm_torch") is None,
    reason="distcomm-torch is not installed (pip install ./backends/distcomm-torch)",
)


ENV_SCRIPT = f"""
import json, os, sys
print(json.dumps({{"env": {{k: os.environ.get(k) for k in {KEYS!r}}}, "argv": sys.argv[1:]}}))
print("to stderr", os.environ["RANK"], file=sys.stderr)
sys.stdout.write("no newline")
"""

#: The start of a script that records its pid in the directory given as its first argument.
PIDS = """
import os, pathlib, signal, subprocess, sys, time
RANK, WORLD = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
PIDS = pathlib.Path(sys.argv[1])

def record(name, pid):
    (PIDS / f"{name}.tmp").write_text(str(pid))
    os.replace(PIDS / f"{name}.tmp", PIDS / f"{name}.pid")

def wait_for(count):
    deadline = time.monotonic() + 20
    while len(list(PIDS.glob("*.pid"))) < count and time.monotonic() < deadline:
        time.sleep(0.05)

record(RANK, os.getpid())
"""


def distcomm_run(*args: str, cwd: Path, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "distcomm", "run", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=dict(os.environ),
        timeout=timeout,
        check=False,
    )


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def lines_of(text: str, rank: int) -> list[str]:
    prefix = f"[rank {rank}] "
    return [line[len(prefix) :] for line in text.splitlines() if line.startswith(prefix)]


def recorded_pids(directory: Path) -> list[int]:
    return [int(path.read_text()) for path in directory.glob("*.pid")]


def is_running(pid: int) -> bool:
    """Whether ``pid`` is a live process (a zombie has exited: only a wait by its parent is left,
    and some containers' PID 1 never waits for the orphans it inherits)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return True
    return stat.rsplit(b")", 1)[1].split()[0] not in (b"Z", b"X")


def assert_all_gone(pids: list[int]) -> None:
    deadline = time.monotonic() + 5
    while any(map(is_running, pids)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert [pid for pid in pids if is_running(pid)] == []


# -- what the ranks see ---------------------------------------------------------------------------
@pytest.mark.timeout(120)
def test_each_rank_gets_its_variables_and_prefixed_output(tmp_path: Path) -> None:
    script = write(tmp_path / "env.py", ENV_SCRIPT)
    result = distcomm_run("-n", "3", str(script), "-n", "5", "--flag", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert all(line.startswith("[rank ") for line in result.stdout.splitlines()), result.stdout
    ports = set()
    for rank in range(3):
        first, last = lines_of(result.stdout, rank)
        report = json.loads(first)
        env = report["env"]
        assert report["argv"] == ["-n", "5", "--flag"]
        assert (env["RANK"], env["WORLD_SIZE"]) == (str(rank), "3")
        assert (env["LOCAL_RANK"], env["LOCAL_WORLD_SIZE"]) == (str(rank), "3")
        assert (env["GROUP_RANK"], env["GROUP_WORLD_SIZE"]) == ("0", "1")
        assert env["MASTER_ADDR"] == "127.0.0.1" and env["PYTHONUNBUFFERED"] == "1"
        assert env["DISTCOMM_BACKEND"] is None
        ports.add(env["MASTER_PORT"])
        assert last == "no newline"
        assert lines_of(result.stderr, rank) == [f"to stderr {rank}"]
    assert len(ports) == 1 and 0 < int(ports.pop()) < 65536


@pytest.mark.timeout(60)
def test_a_module_and_a_double_dash(tmp_path: Path) -> None:
    write(tmp_path / "rankmod.py", "import os, sys\nprint(os.environ['RANK'], sys.argv[1:])\n")
    result = distcomm_run("-n", "2", "-m", "rankmod", "a", "-m", "b", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert sorted(result.stdout.splitlines()) == [
        "[rank 0] 0 ['a', '-m', 'b']",
        "[rank 1] 1 ['a', '-m', 'b']",
    ]
    script = write(tmp_path / "dash.py", "import sys\nprint(sys.argv[1:])\n")
    result = distcomm_run("-n", "1", "--", str(script), "--", "x", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "[rank 0] ['--', 'x']\n"


@pytest.mark.timeout(60)
def test_backend_sets_distcomm_backend_and_init_uses_it(tmp_path: Path) -> None:
    script = write(
        tmp_path / "init.py",
        "import os, distcomm\ndistcomm.init()\n"
        "print(os.environ['DISTCOMM_BACKEND'], distcomm.get_backend(), distcomm.get_world_size())\n"
        "distcomm.finalize()\n",
    )
    result = distcomm_run("-n", "1", "--backend", "FakeLink", str(script), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "[rank 0] fakelink fakelink 1\n"


@needs_distcomm_torch
@pytest.mark.timeout(120)
@pytest.mark.parametrize("nprocs", [2, 4])
def test_gloo_ranks_reduce_together(tmp_path: Path, nprocs: int) -> None:
    script = write(
        tmp_path / "reduce.py",
        "import distcomm\ndistcomm.init()\n"
        "total = distcomm.all_reduce(distcomm.get_rank() + 1)\n"
        "print(distcomm.get_backend(), distcomm.get_rank(), distcomm.get_world_size(), total)\n"
        "distcomm.finalize()\n",
    )
    result = distcomm_run("-n", str(nprocs), "--backend", "gloo", str(script), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    total = nprocs * (nprocs + 1) // 2
    for rank in range(nprocs):
        assert lines_of(result.stdout, rank) == [f"gloo {rank} {nprocs} {total}"]


# -- a rank that fails stops the job --------------------------------------------------------------
FAILING = (
    PIDS
    + """
if RANK == 0:  # a child of a rank is stopped with it (it shares the rank's process group)
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    record("child", child.pid)
if RANK == 2:  # a rank that ignores SIGTERM gets SIGKILL after the grace
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
if RANK == 1:
    wait_for(WORLD + 1)
    FAIL
time.sleep(60)
"""
)


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    ("fail", "code", "how", "shown"),
    [
        (
            "raise RuntimeError('rank one gives up')",
            1,
            "failed with exit code 1",
            "RuntimeError: rank one gives up",
        ),
        ("sys.exit(3)", 3, "failed with exit code 3", None),
        ("os.kill(os.getpid(), signal.SIGKILL)", 137, "was killed by SIGKILL (signal 9)", None),
        ("os.kill(os.getpid(), signal.SIGTERM)", 143, "was killed by SIGTERM (signal 15)", None),
    ],
    ids=["exception", "exit-3", "sigkill", "sigterm"],
)
def test_the_first_failing_rank_stops_the_others(
    tmp_path: Path, fail: str, code: int, how: str, shown: str | None
) -> None:
    """The launcher's status is the shell's (128 + N for signal N); its words name the signal."""
    script = write(tmp_path / "fail.py", FAILING.replace("FAIL", fail))
    pids = tmp_path / "pids"
    pids.mkdir()
    result = distcomm_run("-n", "4", "--grace", "1", str(script), str(pids), cwd=tmp_path)
    assert result.returncode == code, result.stderr
    assert result.stderr.splitlines()[-1] == f"distcomm run: rank 1 {how}; stopped the other ranks"
    assert "exit code 137" not in result.stderr and "exit code 143" not in result.stderr
    if shown is not None:
        errors = lines_of(result.stderr, 1)
        assert errors[0] == "Traceback (most recent call last):" and errors[-1] == shown
    recorded = recorded_pids(pids)
    assert len(recorded) == 5
    assert_all_gone(recorded)


def omp_notice(nprocs: int) -> str:
    """What distcomm run says first when it sets OMP_NUM_THREADS (the user's environment has
    none), as torchrun does."""
    return (
        f"distcomm run: OMP_NUM_THREADS=1 in each of the {nprocs} ranks, as torchrun sets it; "
        "export OMP_NUM_THREADS=N to choose"
    )


def start_launcher(*args: str, cwd: Path) -> subprocess.Popen[str]:
    """``distcomm run ARGS`` in a session of its own, as a user's job would start."""
    return subprocess.Popen(
        [sys.executable, "-m", "distcomm", "run", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
        cwd=cwd,
        env={k: v for k, v in job_environment().items() if k != "OMP_NUM_THREADS"},
        start_new_session=True,
    )


def wait_for_ranks(
    pids: Path, count: int, launcher: subprocess.Popen[str], marks: str = "*.pid"
) -> None:
    """Wait until ``count`` files ``marks`` are in ``pids`` (the ranks' pids, by default)."""
    deadline = time.monotonic() + 60
    while len(list(pids.glob(marks))) < count and time.monotonic() < deadline:
        assert launcher.poll() is None, launcher.communicate()
        time.sleep(0.05)
    assert len(list(pids.glob(marks))) == count, "the ranks did not start"


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    ("sig", "code", "ignore", "said"),
    [
        (signal.SIGINT, 130, False, "distcomm run: interrupted (Ctrl-C); stopped 2 ranks"),
        (
            signal.SIGTERM,
            143,
            True,
            "distcomm run: got SIGTERM; forwarded it to every rank (again to kill them now)",
        ),
    ],
    ids=["sigint", "sigterm-ignored-by-ranks"],
)
def test_a_signal_to_the_launcher_stops_every_rank(
    tmp_path: Path, sig: signal.Signals, code: int, ignore: bool, said: str
) -> None:
    ignoring = "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n" if ignore else ""
    script = write(tmp_path / "sleep.py", PIDS + ignoring + "time.sleep(60)\n")
    pids = tmp_path / "pids"
    pids.mkdir()
    launcher = start_launcher("-n", "2", "--grace", "1", str(script), str(pids), cwd=tmp_path)
    try:
        wait_for_ranks(pids, 2, launcher)
        launcher.send_signal(sig)
        _, stderr = launcher.communicate(timeout=30)
    finally:
        launcher.kill()
        launcher.wait()
    assert launcher.returncode == code, stderr
    assert stderr.splitlines() == [omp_notice(2), said]
    assert_all_gone(recorded_pids(pids))


#: Every rank loops in a collective and in time.sleep; an interrupted rank says so on stdout and
#: stderr (output that is no KeyboardInterrupt traceback is shown), then lets the interrupt end it.
INTERRUPTED = (
    PIDS
    + """
import numpy as np
import distcomm

distcomm.init()
distcomm.all_reduce(np.ones(4))
(PIDS / f"{RANK}.ready").touch()
try:
    while True:
        distcomm.all_reduce(np.ones(4))
        time.sleep(0.02 * (RANK + 1))
except KeyboardInterrupt:
    print(f"rank {RANK} interrupted", flush=True)
    print(f"rank {RANK} cleans up", file=sys.stderr, flush=True)
    raise
"""
)


@needs_distcomm_torch
@pytest.mark.timeout(150)
@pytest.mark.parametrize("backend", [["--backend", "gloo"], []], ids=["gloo", "default"])
def test_ctrl_c_says_interrupted_once_without_tracebacks(
    tmp_path: Path, backend: list[str]
) -> None:
    script = write(tmp_path / "loops.py", INTERRUPTED)
    pids = tmp_path / "pids"
    pids.mkdir()
    launcher = start_launcher("-n", "4", *backend, str(script), str(pids), cwd=tmp_path)
    try:
        wait_for_ranks(pids, 4, launcher, "*.ready")
        time.sleep(0.5)  # in their loops
        launcher.send_signal(signal.SIGINT)
        stdout, stderr = launcher.communicate(timeout=60)
    finally:
        launcher.kill()
        launcher.wait()
    assert launcher.returncode == 130, stderr
    said = [line for line in stderr.splitlines() if "interrupted" in line]
    assert said == ["distcomm run: interrupted (Ctrl-C); stopped 4 ranks"], stderr
    assert "Traceback" not in stderr and "KeyboardInterrupt" not in stderr, stderr
    for rank in range(4):
        assert lines_of(stdout, rank) == [f"rank {rank} interrupted"], stdout
        assert lines_of(stderr, rank) == [f"rank {rank} cleans up"], stderr
    assert_all_gone(recorded_pids(pids))


IGNORES_CTRL_C = (
    PIDS
    + """
if RANK == 1:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
(PIDS / f"{RANK}.ready").touch()
time.sleep(60)
"""
)


@pytest.mark.timeout(120)
def test_a_second_ctrl_c_kills_the_ranks_that_go_on(tmp_path: Path) -> None:
    script = write(tmp_path / "ignores.py", IGNORES_CTRL_C)
    pids = tmp_path / "pids"
    pids.mkdir()
    launcher = start_launcher("-n", "2", "--grace", "600", str(script), str(pids), cwd=tmp_path)
    try:
        wait_for_ranks(pids, 2, launcher, "*.ready")
        launcher.send_signal(signal.SIGINT)
        assert launcher.stderr is not None
        assert launcher.stderr.readline() == omp_notice(2) + "\n"
        waiting = launcher.stderr.readline()  # rank 0's KeyboardInterrupt traceback is dropped
        launcher.send_signal(signal.SIGINT)
        _, stderr = launcher.communicate(timeout=30)  # long before the grace of 600 s
    finally:
        launcher.kill()
        launcher.wait()
    assert launcher.returncode == 130, stderr
    assert waiting == "distcomm run: waiting for rank 1 to stop (Ctrl-C again to kill them now)\n"
    assert stderr.splitlines() == [
        "distcomm run: interrupted (Ctrl-C); stopped 2 ranks (1 with SIGKILL)"
    ]
    assert_all_gone(recorded_pids(pids))


# -- errors: nothing is started -------------------------------------------------------------------
@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["-n", "0", "SCRIPT"], "-n 0 must be at least 1"),
        (["-n", "2", "missing.py"], "script 'missing.py' not found"),
        (["-n", "2", "--backend", "ncl", "SCRIPT"], "did you mean 'nccl'?"),
        (["-n", "2"], "nothing to run"),
        (["-n", "2", "--"], "nothing to run"),
        (["-n", "2", "-m"], "-m needs a module name"),
        (["-n", "2", "--grace", "-1", "SCRIPT"], "--grace -1.0 must be >= 0"),
        (["SCRIPT"], "required: -n/--nprocs"),
        (["-n", "two", "SCRIPT"], "invalid int value: 'two'"),
        (["-n", "2", "--nproc", "3", "SCRIPT"], "unrecognized arguments: --nproc"),
    ],
)
def test_argument_errors_exit_2_before_starting_anything(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    args: list[str],
    message: str,
) -> None:
    monkeypatch.chdir(tmp_path)
    marker = tmp_path / "started"
    script = write(tmp_path / "touch.py", f"open({str(marker)!r}, 'w').close()\n")
    with pytest.raises(SystemExit) as exit_info:
        main(["run", *[str(script) if a == "SCRIPT" else a for a in args]])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "usage: distcomm run -n N" in err and message in err
    assert not marker.exists()


def test_an_unknown_backend_lists_the_valid_names(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["run", "-n", "1", "--backend", "ncl", __file__])
    err = capsys.readouterr().err
    assert "unknown backend 'ncl'; valid: " in err and "fakelink" in err and "HINT" in err


# -- the Python API -------------------------------------------------------------------------------
@pytest.mark.timeout(60)
def test_run_writes_to_the_given_streams(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)  # distcomm run sets it, and says so
    out, err = io.StringIO(), io.StringIO()
    code = "import os, sys; print('out'); print('err', os.environ['RANK'], file=sys.stderr)"
    assert run([sys.executable, "-c", code], 2, stdout=out, stderr=err) == 0
    assert sorted(out.getvalue().splitlines()) == ["[rank 0] out", "[rank 1] out"]
    expected = ["[rank 0] err 0", "[rank 1] err 1", omp_notice(2)]
    assert sorted(err.getvalue().splitlines()) == expected


@pytest.mark.timeout(60)
def test_run_replaces_undecodable_bytes() -> None:
    out = io.StringIO()
    code = "import sys; sys.stdout.buffer.write(b'bad \\xff byte\\n')"
    assert run([sys.executable, "-c", code], 1, stdout=out) == 0
    assert out.getvalue() == "[rank 0] bad \ufffd byte\n"


@pytest.mark.parametrize(
    ("argv", "nprocs", "grace", "message"),
    [
        ([], 1, 5.0, "cmd_argv=[]"),
        (["true"], 0, 5.0, "nprocs=0"),
        (["true"], True, 5.0, "nprocs=True"),
        (["true"], 1, -1.0, "grace=-1.0"),
    ],
)
def test_run_rejects_invalid_arguments(
    argv: list[str], nprocs: int, grace: float, message: str
) -> None:
    with pytest.raises(InvalidArgumentError, match="HINT") as info:
        run(argv, nprocs, grace=grace)
    assert message in str(info.value)


def test_the_launcher_imports_no_torch(tmp_path: Path) -> None:
    probe = (
        "import sys\nfrom distcomm._processes.supervisor import run\n"
        "code = run([sys.executable, '-c', 'pass'], 1, backend='gloo')\n"
        "print(code, sorted(m for m in ('torch', 'numpy') if m in sys.modules))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe],
        capture_output=True,
        text=True,
        env=dict(os.environ),
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == "0 []\n"


PREFIXED = """
import os, sys
rank = os.environ["RANK"]
print(f"[rank{rank}]: torch-style, prefixed by the rank itself", file=sys.stderr)
print("plain é", flush=True)
print(f"[rank{int(rank) + 1}]: another rank's prefix is kept", file=sys.stderr)
"""


@pytest.mark.timeout(60)
def test_one_prefix_per_line_and_every_rank_logged(tmp_path: Path) -> None:
    """torch's own [rankN]: prefix is taken off (no "[rank 1] [rank1]: "), and --log-dir keeps
    each rank's output as the rank wrote it, in files only the user can read."""
    script = write(tmp_path / "prefixed.py", PREFIXED)
    logs = tmp_path / "logs" / "run1"
    result = distcomm_run("-n", "2", "--log-dir", str(logs), str(script), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    for rank in (0, 1):
        assert "torch-style, prefixed by the rank itself" in lines_of(result.stderr, rank)
        assert f"[rank{rank + 1}]: another rank's prefix is kept" in lines_of(result.stderr, rank)
        assert lines_of(result.stdout, rank) == ["plain é"]
        log = logs / f"rank-{rank}.log"
        assert (log.stat().st_mode & 0o777) == 0o600
        text = log.read_text(encoding="utf-8")
        assert f"[rank{rank}]: torch-style" in text and "plain é" in text
    assert (logs.stat().st_mode & 0o777) == 0o700
    assert "[rank0]:" not in result.stderr


def test_a_log_dir_that_cannot_be_made_is_a_usage_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    script = write(tmp_path / "ok.py", "print('never runs')\n")
    result = distcomm_run("-n", "2", "--log-dir", str(blocker / "logs"), str(script), cwd=tmp_path)
    assert result.returncode == 2
    assert "--log-dir" in result.stderr and "HINT" in result.stderr
    assert "never runs" not in result.stdout
