"""Ranks whose launcher dies: tests/processes/test_launcher_death.py, tests/launchers/test_slurm.py.

    python orphan_ranks.py OUT_DIR sleep|collective

Each rank calls ``distcomm.init()``, forks a child (as a DataLoader starts its workers), writes
``OUT_DIR/rank-<rank>.pids`` (its pid and its child's; rank 0 also ``OUT_DIR/step``, the Slurm
step, under srun), then sleeps; with ``collective``, rank 0 first waits in a barrier that rank 1
never joins (stuck in the engine). The test side's helpers follow: the pids once written, and
whether they are gone in time.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

#: Seconds the ranks have to end after their launcher's death (issue 41's acceptance).
WITHIN = 3.0


def main() -> None:
    import distcomm

    folder, waiting = Path(sys.argv[1]), sys.argv[2]
    distcomm.init()
    rank = distcomm.get_rank()
    child = os.fork()
    if child == 0:  # a worker of this rank's, as a DataLoader's: it must not outlive the rank
        time.sleep(600)
        os._exit(0)
    if rank == 0 and "SLURM_STEP_ID" in os.environ:
        (folder / "step").write_text(f"{os.environ['SLURM_JOB_ID']}.{os.environ['SLURM_STEP_ID']}")
    (folder / f"rank-{rank}.tmp").write_text(f"{os.getpid()} {child}")
    (folder / f"rank-{rank}.tmp").rename(folder / f"rank-{rank}.pids")  # whole, or not there
    if waiting == "collective" and rank == 0:
        distcomm.barrier()  # rank 1 never comes: rank 0 waits in the engine
    time.sleep(600)


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie does not)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as stat:
            return stat.read().rpartition(")")[2].split()[0] != "Z"
    except OSError:
        return False


def pids_of(folder: Path, launcher: subprocess.Popen[bytes], ranks: int = 2) -> list[int]:
    """Every rank's pid and its child's, once all ranks wrote them; if they do not within 120 s
    (or the launcher ends first), the launcher's session is killed and the test fails."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and launcher.poll() is None:
        files = sorted(folder.glob("rank-*.pids"))
        if len(files) == ranks:
            return [int(pid) for file in files for pid in file.read_text().split()]
        time.sleep(0.2)
    with contextlib.suppress(OSError):
        os.killpg(launcher.pid, signal.SIGKILL)
    raise AssertionError(
        f"the ranks did not start (launcher exit {launcher.poll()}): {sorted(folder.iterdir())}"
    )


def wait_for_the_end(pids: list[int]) -> list[int]:
    """Those of ``pids`` still alive :data:`WITHIN` seconds from now (then killed: nothing of
    the test is left behind)."""
    deadline = time.monotonic() + WITHIN
    while time.monotonic() < deadline and any(alive(p) for p in pids):
        time.sleep(0.1)
    left = [p for p in pids if alive(p)]
    for pid in left:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    return left


if __name__ == "__main__":
    main()
