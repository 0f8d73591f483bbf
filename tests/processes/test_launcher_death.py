"""Nothing outlives its job: a rank that called ``distcomm.init()`` ends when its launcher dies
(distcomm/_runtime/launcher_watch.py, docs/launch.md).

Each job below has 2 ranks (tests/support/orphan_ranks.py) that call ``init()``, fork a child
each (as a DataLoader starts its workers) and then sleep, or wait in a collective (rank 0 in a
barrier that rank 1 never joins: stuck in the engine). The test kills the launcher with SIGKILL
and checks, 3 s later, that no rank and no rank's child is alive, that each rank's last line
names the launcher, and that neither /dev/shm nor the job's temporary directory holds anything
of it. mpirun's ranks end by MPICH's doing; ``DISTCOMM_DETACH=1`` keeps them running. srun
(``scancel -s KILL``): tests/launchers/test_slurm.py.
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from jobs import dev_shm_names, find_mpirun, in_use, job_environment
from orphan_ranks import WITHIN, alive, pids_of, wait_for_the_end

RANKS = Path(__file__).resolve().parents[1] / "support" / "orphan_ranks.py"
#: The topology file hydra's proxy gives the ranks of its node (distcomm_mpi.leftovers).
TOPOLOGY = "/tmp/hydra_hwloc_xmlfile_*"


def kill_and_check(
    launcher: subprocess.Popen[bytes], pids: list[int], name: str, stderr: Path
) -> None:
    """SIGKILL the launcher: within WITHIN seconds every rank and child must be gone, each
    rank's last line must name the launcher, and /dev/shm hold nothing new."""
    shm_before = dev_shm_names()
    os.kill(launcher.pid, signal.SIGKILL)
    launcher.wait()
    left = wait_for_the_end(pids)
    assert not left, f"alive {WITHIN} s after {name} was killed: {left} (of {pids})"
    text = stderr.read_text(errors="replace")
    for rank in (0, 1):
        line = f"distcomm: rank {rank}: its launcher ({name}, pid {launcher.pid}) went away"
        assert line in text, f"no last line of rank {rank} naming {name}:\n{text[-3000:]}"
    assert dev_shm_names() <= shm_before, f"left in /dev/shm: {dev_shm_names() - shm_before}"


def start(
    command: list[str], tmp_path: Path, waiting: str, env: dict[str, str] | None = None
) -> tuple[subprocess.Popen[bytes], Path, Path]:
    """Start ``command`` (a launcher and its arguments) on the rank program, in its own
    session, with a temporary directory of its own: ``(launcher, temporary directory, the file
    of its stderr)``."""
    temp = tmp_path / "tmp"
    temp.mkdir()
    stderr = tmp_path / "stderr.txt"
    with stderr.open("wb") as err:
        launcher = subprocess.Popen(
            [*command, str(RANKS), str(tmp_path), waiting],
            cwd=tmp_path,
            env={**job_environment(), "TMPDIR": str(temp), **(env or {})},
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=err,
            start_new_session=True,
        )
    return launcher, temp, stderr


RUN = [sys.executable, "-m", "distcomm", "run", "-n", "2", "--backend", "gloo"]


@pytest.mark.timeout(180)
@pytest.mark.parametrize("waiting", ["sleep", "collective"])
def test_ranks_end_with_a_killed_distcomm_run(tmp_path: Path, waiting: str) -> None:
    trace = {"DISTCOMM_TRACE": "50", "DISTCOMM_TRACE_DIR": str(tmp_path / "trace")}
    launcher, temp, stderr = start(RUN, tmp_path, waiting, trace)
    kill_and_check(launcher, pids_of(tmp_path, launcher), "distcomm run", stderr)
    assert list(temp.iterdir()) == [], f"left in the temporary directory: {list(temp.iterdir())}"
    # each rank's flight recorder, dumped as it ended: rank 0's last call is the barrier
    dumps = [json.loads((tmp_path / "trace" / f"rank-{r}.json").read_text()) for r in (0, 1)]
    if waiting == "collective":
        last = dumps[0]["entries"][-1]
        assert last["op"] == "barrier" and last.get("completed") is None, last


@pytest.mark.timeout(180)
@pytest.mark.parametrize("waiting", ["sleep", "collective"])
def test_ranks_end_with_a_killed_torchrun_agent(tmp_path: Path, waiting: str) -> None:
    torchrun = shutil.which("torchrun", path=os.path.dirname(sys.executable))
    assert torchrun is not None, "torchrun not found (it comes with torch)"
    command = [torchrun, "--nproc-per-node", "2"]
    launcher, temp, stderr = start(command, tmp_path, waiting, {"DISTCOMM_BACKEND": "gloo"})
    kill_and_check(launcher, pids_of(tmp_path, launcher), "torchrun", stderr)
    # torchrun's own torchelastic_* folder too: its agent can no longer remove it
    assert list(temp.iterdir()) == [], f"left in the temporary directory: {list(temp.iterdir())}"


@pytest.mark.timeout(180)
def test_ranks_end_with_a_killed_mpirun(tmp_path: Path) -> None:
    """MPICH's proxies end the ranks (SIGKILL) when mpirun goes away; MPICH's files in /dev/shm
    and hydra's topology file lost their names at init (distcomm_mpi.leftovers): none is left."""
    mpirun = find_mpirun()
    assert mpirun is not None, "mpirun not found (MPICH comes with the mpi extra)"
    topology_before = set(glob.glob(TOPOLOGY))
    launcher, _, _ = start([mpirun, "-n", "2", sys.executable], tmp_path, "collective")
    pids = pids_of(tmp_path, launcher)
    shm_before = dev_shm_names()
    os.kill(launcher.pid, signal.SIGKILL)
    launcher.wait()
    left = wait_for_the_end(pids)
    assert not left, f"alive {WITHIN} s after mpirun was killed: {left} (of {pids})"
    assert dev_shm_names() <= shm_before, f"left in /dev/shm: {dev_shm_names() - shm_before}"
    new = set(glob.glob(TOPOLOGY)) - topology_before
    assert not new - in_use(new), f"hydra's topology file left: {new}"


@pytest.mark.timeout(180)
def test_detach_keeps_the_ranks_running_after_their_launcher(tmp_path: Path) -> None:
    launcher, _, stderr = start(RUN, tmp_path, "sleep", {"DISTCOMM_DETACH": "1"})
    pids = pids_of(tmp_path, launcher)
    os.kill(launcher.pid, signal.SIGKILL)
    launcher.wait()
    time.sleep(WITHIN)
    running = [pid for pid in pids if alive(pid)]
    for pid in pids:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    assert running == pids, f"DISTCOMM_DETACH=1, yet ended: {set(pids) - set(running)}"
    assert "went away" not in stderr.read_text(errors="replace")


ENV = {"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}
SLURM = {"SLURM_JOB_ID": "7", "SLURM_STEP_ID": "0", "SLURM_PROCID": "0", "SLURM_NTASKS": "2"}
SLURM |= {"SLURM_LOCALID": "0", "SLURM_NODEID": "0", "SLURM_JOB_NODELIST": "vm"}


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        ({**ENV, "DISTCOMM_RUN_PID": "4242"}, ("distcomm run", 4242)),
        ({**ENV, "TORCHELASTIC_RUN_ID": "job"}, ("torchrun", os.getppid())),
        (SLURM, ("srun", os.getppid())),
        ({"PMI_RANK": "0", "PMI_SIZE": "2"}, ("mpirun", os.getppid())),
        (ENV, None),  # variables set by hand: no launcher known
        ({**ENV, "TORCHELASTIC_RUN_ID": "a1", "DISTCOMM_RUN_ID": "a1"}, None),  # spawn's ranks
        ({}, None),  # python train.py
        ({**ENV, "DISTCOMM_RUN_PID": "4242", "DISTCOMM_DETACH": "1"}, None),
    ],
)
def test_which_launcher_a_rank_watches(environ: dict[str, str], expected: object) -> None:
    import distcomm
    from distcomm._runtime.launcher_watch import launcher_of

    launch = distcomm.detect_environment(environ=environ)
    assert launcher_of(launch, environ) == expected, (launch.method, environ)
