"""The mpi backend under a real mpirun (MPICH from PyPI): the conformance kit and selection.

Each job is one ``mpirun -n N python ...``: the conformance kit, as a plugin author runs it, at
N = 1, 2, 4. The same checks also run as pytest tests inside ``mpirun -n N pytest --with-mpi``
(``mpi_tests/``), which the test command runs at N = 1, 2, 4.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import jobs
import pytest

from distcomm.testing.conformance import CHECKS


def run_job(
    mpirun: str, tmp_path: Path, nprocs: int, *command: str
) -> subprocess.CompletedProcess[str]:
    return jobs.run_job([mpirun, "-n", str(nprocs), *command], timeout=240, cwd=tmp_path)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("nprocs", [1, 2, 4])
def test_mpi_passes_the_conformance_kit_under_mpirun(
    tmp_path: Path, nprocs: int, mpirun: str
) -> None:
    """The kit a plugin author runs: ``mpirun -n N python -m pytest --pyargs
    distcomm.testing.conformance --distcomm-backend=mpi``."""
    kit = ["-m", "pytest", "-q", "-p", "no:cacheprovider", "--pyargs"]
    kit += ["distcomm.testing.conformance", "--distcomm-backend=mpi"]
    done = run_job(mpirun, tmp_path, nprocs, sys.executable, *kit)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    # mpirun interleaves the ranks' output, even within lines: count pytest's last words
    assert done.stdout.count(f"{len(CHECKS)} passed in ") == nprocs, done.stdout[-4000:]
    assert f"distcomm conformance: mpi, {nprocs} rank" in done.stdout


@pytest.mark.timeout(120)
def test_info_under_mpirun_shows_mpi(tmp_path: Path, mpirun: str) -> None:
    # Each rank writes its own file: two JSON documents on one stdout could interleave.
    command = f'"{sys.executable}" -m distcomm info --json > "{tmp_path}/info-$PMI_RANK.json"'
    done = run_job(mpirun, tmp_path, 2, "sh", "-c", command)
    assert done.returncode == 0, done.stderr
    for rank in range(2):
        report = json.loads((tmp_path / f"info-{rank}.json").read_text())
        assert report["selected"] == {"backend": "mpi", "method": "mpi"}
        assert (report["launch"]["rank"], report["launch"]["world_size"]) == (rank, 2)
        mpi = next(b for b in report["backends"] if b["name"] == "mpi")
        assert mpi["available"] and mpi["distribution"] == "distcomm-mpi"


DETECT = """
import json, sys
import distcomm
from distcomm._plugins.loader import get_registry
from distcomm._runtime.selection import select_backend

launch = distcomm.detect_environment()
selection = select_backend(get_registry(), launch)
loaded = "mpi4py" in sys.modules
comm = distcomm.init()
with open(f"{sys.argv[1]}/detect-{launch.rank}.json", "w") as out:
    json.dump([launch.method, launch.world_size, selection.backend, loaded,
               "mpi4py.MPI" in sys.modules, comm.backend], out)
distcomm.finalize()
"""


@pytest.mark.timeout(120)
def test_detection_under_mpirun_imports_no_mpi4py(tmp_path: Path, mpirun: str) -> None:
    """Detecting the launch, loading every plugin and choosing mpi leave mpi4py unimported;
    ``init()`` is what starts MPI."""
    script = tmp_path / "detect.py"
    script.write_text(textwrap.dedent(DETECT))
    done = run_job(mpirun, tmp_path, 2, sys.executable, str(script), str(tmp_path))
    assert done.returncode == 0, done.stdout + done.stderr
    for rank in range(2):
        seen = json.loads((tmp_path / f"detect-{rank}.json").read_text())
        assert seen == ["mpi", 2, "mpi", False, True, "mpi"]


STUCK = """
import pathlib, sys, time, distcomm
comm = distcomm.init(backend="mpi", timeout=3)
if comm.rank == 1:
    time.sleep(60)  # skips the barrier: rank 0 would wait forever
pathlib.Path(sys.argv[1]).write_text(str(time.time()))
distcomm.barrier()
"""


@pytest.mark.timeout(120)
@pytest.mark.usefixtures("aborted_mpich_job")
def test_watchdog_aborts_a_blocked_job_with_a_diagnostic(tmp_path: Path, mpirun: str) -> None:
    script = tmp_path / "stuck.py"
    script.write_text(textwrap.dedent(STUCK))
    entered = tmp_path / "entered"
    done = run_job(mpirun, tmp_path, 2, sys.executable, str(script), str(entered))
    assert time.time() - float(entered.read_text()) < 2 * 3, "not ended within twice the timeout"
    assert done.returncode != 0
    said = "distcomm: rank 0: barrier (operation #1) on mpi 'world' (2 ranks) did not complete"
    assert said in done.stderr, done.stderr[-4000:]
    assert "ranks that had not arrived: [1] (rank 1 has run no collective)" in done.stderr
    assert "aborts the job (MPI_Abort, although DISTCOMM_ON_TIMEOUT=raise)" in done.stderr


STUCK_WAITS = """
import time, numpy as np, distcomm
# debug="off": the async all_reduce is issued at once (its mismatch check would wait for rank 1)
comm = distcomm.init(backend="mpi", timeout=2, debug="off")
if comm.rank == 0:
    late = distcomm.all_reduce(np.ones(2), async_op=True)  # operation #1
    distcomm.recv(np.zeros(1), src=1, tag=5) if {recv} else late.wait()
else:
    time.sleep(60)
"""


@pytest.mark.timeout(120)
@pytest.mark.usefixtures("aborted_mpich_job")
@pytest.mark.parametrize(
    ("recv", "label"),
    [(True, "recv from rank 1 (tag 5)"), (False, "all_reduce (operation #1)")],
)
def test_the_watchdog_names_a_blocked_wait(
    tmp_path: Path, mpirun: str, recv: bool, label: str
) -> None:
    """A receive, or an async collective's Work, waited for past the timeout: the diagnostic
    names that wait, not whatever collective came last."""
    script = tmp_path / "stuck.py"
    script.write_text(textwrap.dedent(STUCK_WAITS.format(recv=recv)))
    done = run_job(mpirun, tmp_path, 2, sys.executable, str(script))
    assert done.returncode != 0
    said = f"distcomm: rank 0: {label} on mpi 'world' (2 ranks) did not complete within 2 s"
    assert said in done.stderr, done.stderr[-4000:]


DYING = Path(jobs.__file__).resolve().parent / "dying_rank.py"


@pytest.mark.timeout(120)
@pytest.mark.usefixtures("aborted_mpich_job")
@pytest.mark.parametrize(("backend", "nprocs"), [("mpi", 4), ("gloo", 3)])
def test_a_rank_that_raises_ends_the_job_at_once(
    tmp_path: Path, mpirun: str, backend: str, nprocs: int
) -> None:
    """Plain mpirun, the default timeout (30 minutes): rank 1's uncaught exception ends the
    whole job within seconds, with its traceback, on mpi and on gloo (rendezvous over MPI)."""
    start = time.monotonic()
    done = run_job(
        mpirun, tmp_path, nprocs, sys.executable, str(DYING), str(tmp_path), backend, "1"
    )
    assert time.monotonic() - start < 60
    assert done.returncode != 0
    assert done.stderr.count("ValueError: rank 1 breaks on purpose") == 1, done.stderr
    assert "distcomm: rank 1 died of an uncaught ValueError (traceback above)" in done.stderr
    assert "MPI_Abort" in done.stderr
    assert not list(tmp_path.glob("rank-*.json")), "a survivor's all_reduce returned"


@pytest.mark.timeout(120)
@pytest.mark.usefixtures("aborted_mpich_job")
def test_without_abort_on_exception_the_watchdog_names_the_dead_rank(
    tmp_path: Path, mpirun: str
) -> None:
    env = {**jobs.job_environment(), "DISTCOMM_ABORT_ON_EXCEPTION": "0", "DISTCOMM_TIMEOUT": "3"}
    command = [mpirun, "-n", "3", sys.executable, str(DYING), str(tmp_path), "mpi", "2"]
    done = subprocess.run(
        command, env=env, capture_output=True, text=True, timeout=90, stdin=subprocess.DEVNULL
    )
    assert done.returncode != 0
    assert "died of an uncaught" not in done.stderr
    said = "all_reduce (operation #2) on mpi 'world' (3 ranks) did not complete within 3 s"
    assert said in done.stderr, done.stderr[-4000:]
    assert "ranks that had not arrived: [2]" in done.stderr


SKIPS_ONE = """
import time, numpy as np, distcomm
comm = distcomm.init(backend="mpi")
distcomm.all_reduce(np.ones(4))
if comm.rank != 3:
    distcomm.all_reduce(np.ones(4))  # rank 3 skips it: the others' watchdog ends the job
time.sleep(60)
"""


def hydra_topology_files() -> set[str]:
    """The topology files of MPICH's launcher (hydra) in /tmp now, but a running job's."""
    found = {str(path) for path in Path("/tmp").glob("hydra_hwloc_xmlfile_*")}
    return {Path(path).name for path in found - jobs.in_use(found)}


@pytest.mark.timeout(120)
@pytest.mark.usefixtures("aborted_mpich_job")
@pytest.mark.parametrize("ending", ["uncaught exception", "watchdog"])
def test_a_job_that_distcomm_aborts_leaves_no_mpich_files(
    tmp_path: Path, mpirun: str, ending: str
) -> None:
    """MPICH unlinks its shared-memory segment (/dev/shm/mpich_shm_*) in MPI_Finalize only, and
    hydra's proxy its topology file at a normal end: distcomm removes both before MPI_Abort."""
    shm, topology = jobs.dev_shm_names(), hydra_topology_files()
    if ending == "uncaught exception":
        done = run_job(mpirun, tmp_path, 4, sys.executable, str(DYING), str(tmp_path), "mpi", "1")
        said = "distcomm: rank 1 died of an uncaught ValueError"
    else:
        script = tmp_path / "skips_one.py"
        script.write_text(textwrap.dedent(SKIPS_ONE))
        command = [mpirun, "-n", "4", sys.executable, str(script)]
        done = jobs.run_job(command, timeout=90, cwd=tmp_path, env={"DISTCOMM_TIMEOUT": "2"})
        said = "all_reduce (operation #2) on mpi 'world' (4 ranks) did not complete within 2 s"
    assert done.returncode != 0
    assert said in done.stderr, done.stderr[-4000:]  # distcomm ended the job, nothing else
    assert not jobs.dev_shm_names() - shm, "the aborted job left files in /dev/shm"
    assert not hydra_topology_files() - topology, "the aborted job left hydra's topology file"


FIRST_IS_ONE = """
import json, sys
import numpy as np
import torch  # imported: init makes torch's group beside mpi, over a broadcast of its own
import distcomm
seen = []
with distcomm.add_hook(before=lambda event: seen.append(event.seq)):
    comm = distcomm.init(backend="mpi")
    made = comm.torch_group is not None
    before = comm.seq
    distcomm.all_reduce(np.ones(2))
    named = None
    try:
        distcomm.all_reduce(np.ones(3 if comm.rank else 2))  # a mismatch: named #2
    except distcomm.CollectiveMismatchError as exc:
        named = exc.seq
with open(sys.argv[1] + f"/rank-{comm.rank}.json", "w") as out:
    json.dump([made, before, seen, named], out)
distcomm.finalize()
"""


@pytest.mark.timeout(120)
def test_the_first_collective_is_number_1_with_the_torch_group(tmp_path: Path, mpirun: str) -> None:
    """init's own exchange (the torch group's rendezvous) is not the program's operation #1."""
    script = tmp_path / "first.py"
    script.write_text(FIRST_IS_ONE)
    done = run_job(mpirun, tmp_path, 2, sys.executable, str(script), str(tmp_path))
    assert done.returncode == 0, done.stderr[-3000:]
    for rank in range(2):
        made, before, seen, mismatch = json.loads((tmp_path / f"rank-{rank}.json").read_text())
        assert made, "torch's group was made beside mpi"
        assert (before, seen, mismatch) == (0, [1, 2], 2), (rank, before, seen, mismatch)
