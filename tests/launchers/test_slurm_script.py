"""scripts/slurm.sh leaves the machine as it found it: its cluster runs from a private directory,
so ``start`` and ``stop`` neither touch ``/etc/slurm/slurm.conf`` nor stop a slurmd, slurmctld
or munged that someone else runs, and ``stop`` leaves none of its own daemons behind.

The cluster here has its own directory (DISTCOMM_SLURM_DIR) and ports (DISTCOMM_SLURM_PORT), so
it runs beside the session cluster of test_slurm.py without meeting it. Root only, like that.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest
from jobs import job_environment

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "slurm.sh"
ETC = Path("/etc/slurm")
ETC_CONF = ETC / "slurm.conf"
#: The first port this test's cluster tries: far from the session cluster's (16817 on).
PORT = 16917
SENTINEL_CONF = b"# A sentinel of tests/launchers/test_slurm_script.py.\nNot=Slurm\n"
#: Programs that someone else runs, named as the daemons that ``stop`` must leave alone.
SENTINEL_NAMES = ("slurmd", "slurmctld", "munged")


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie does not: where PID 1 is no init, nothing may reap it)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"


def mentions(pid: int, text: bytes) -> bool:
    """Whether ``text`` is in the command line or the environment of ``pid``."""
    for part in ("cmdline", "environ"):
        try:
            if text in Path(f"/proc/{pid}/{part}").read_bytes():
                return True
        except OSError:
            pass
    return False


def processes_of(private: Path) -> list[int]:
    """Live processes that name ``private`` (the daemons, slurmscriptd, slurmstepd: Slurm's
    inherit SLURM_CONF, munged has its paths on its command line)."""
    return [
        int(entry.name)
        for entry in Path("/proc").iterdir()
        if entry.name.isdigit()
        and int(entry.name) != os.getpid()
        and alive(int(entry.name))
        and mentions(int(entry.name), str(private).encode())
    ]


def comm_becomes(pid: int, name: str) -> bool:
    """Whether process ``pid`` gets the name ``name`` within 5 s (Popen may return before the
    kernel has renamed the child to what it executed)."""
    for _ in range(50):
        with contextlib.suppress(OSError):
            if Path(f"/proc/{pid}/comm").read_text().strip() == name:
                return True
        time.sleep(0.1)
    return False


def script(command: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(SCRIPT), command],
        env=env,
        capture_output=True,
        text=True,
        timeout=540,  # start may install Slurm with apt first
        stdin=subprocess.DEVNULL,
    )


@pytest.mark.timeout(600)
def test_start_and_stop_leave_system_slurm_alone() -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root: scripts/slurm.sh installs and starts Slurm and munge")
    etc_existed = ETC.exists()
    backup = ETC / "slurm.conf.distcomm-test-backup"
    assert not backup.exists(), f"{backup} is left from an earlier run: move it back by hand"
    bin_dir = Path(tempfile.mkdtemp(prefix="distcomm-sentinels-"))
    private = Path(tempfile.mkdtemp(prefix="distcomm-slurm-test-", dir="/run"))
    env = {**job_environment(), "DISTCOMM_SLURM_DIR": str(private)}
    env["DISTCOMM_SLURM_PORT"] = str(PORT)
    sentinels: list[subprocess.Popen[bytes]] = []
    started = False
    try:
        # Someone else's configuration (a real one moves aside, to come back byte for byte)...
        ETC.mkdir(exist_ok=True)
        if ETC_CONF.exists():
            os.replace(ETC_CONF, backup)
        ETC_CONF.write_bytes(SENTINEL_CONF)
        # ...and someone else's daemons: sleep, by the daemons' names.
        for name in SENTINEL_NAMES:
            shutil.copy(shutil.which("sleep") or "/bin/sleep", bin_dir / name)
            sentinels.append(subprocess.Popen([str(bin_dir / name), "300"]))
        for name, sentinel in zip(SENTINEL_NAMES, sentinels, strict=True):
            assert comm_becomes(sentinel.pid, name), f"sentinel {name} is not running"

        done = script("start", env)
        started = True
        assert done.returncode == 0, f"start failed:\n{done.stdout}{done.stderr}"
        pid_files = [private / "run/slurmctld.pid", private / "run/slurmd.pid"]
        pid_files.append(private / "munge/munged.pid")
        pids = [int(p.read_text()) for p in pid_files]
        assert all(alive(pid) for pid in pids), pids
        conf = f"{private}/slurm.conf"
        assert script("env", env).stdout == f"export SLURM_CONF={conf}\n"
        job = subprocess.run(
            ["srun", "-n", "1", "--time=1", "true"],
            env={**job_environment(), "SLURM_CONF": conf},
            capture_output=True,
            text=True,
            timeout=60,
            stdin=subprocess.DEVNULL,
        )
        assert job.returncode == 0, job.stdout + job.stderr

        done = script("stop", env)
        started = False
        assert done.returncode == 0, f"stop failed:\n{done.stdout}{done.stderr}"
        assert ETC_CONF.read_bytes() == SENTINEL_CONF
        for name, sentinel in zip(SENTINEL_NAMES, sentinels, strict=True):
            assert sentinel.poll() is None, f"stop ended someone else's {name}"
        assert not any(alive(pid) for pid in pids), f"stop left its daemons: {pids}"
        for _ in range(50):  # slurmscriptd ends just after slurmctld
            left = processes_of(private)
            if not left:
                break
            time.sleep(0.1)
        assert not left, f"processes of the stopped cluster are left: {left}"
        assert not private.exists(), f"stop left {sorted(private.rglob('*'))}"
    finally:
        if started:
            script("stop", env)
        for sentinel in sentinels:
            sentinel.kill()
            sentinel.wait()
        shutil.rmtree(bin_dir, ignore_errors=True)
        shutil.rmtree(private, ignore_errors=True)
        ETC_CONF.unlink(missing_ok=True)
        if backup.exists():
            os.replace(backup, ETC_CONF)
        if not etc_existed:
            # Not empty only where start installed Slurm with apt just now: its package's files.
            with contextlib.suppress(OSError):
                ETC.rmdir()
