"""A real one-node Slurm (scripts/slurm.sh): srun tasks on gloo and on mpi, mpirun inside an
sbatch script, python in a batch script without srun, the example batch script, and torch-native
libraries (DDP, FSDP, Accelerate, Ignite) after ``distcomm.init()`` on mpi.

Every job is a real Slurm job: 4 tasks on this 2-core node with ``--overcommit``. The cluster is
private (its own configuration, munged and ports under /run/distcomm-slurm; a system Slurm is
never touched): the session fixture starts it (installed with apt first, if needed), stops it
afterwards if this session started it, and gives its ``SLURM_CONF``, which every srun, sbatch
and sinfo here gets in its environment. That needs root; without it the tests skip and say so.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from bench_records import check_bench_json
from interop_records import check_interop
from jobs import dev_shm_names, job_environment
from orphan_ranks import WITHIN, pids_of, wait_for_the_end

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "slurm.sh"
RANK = Path(__file__).resolve().parent / "rank_report.py"
CLIENTS = Path(__file__).resolve().parents[1] / "support" / "interop_clients.py"
ORPHANS = Path(__file__).resolve().parents[1] / "support" / "orphan_ranks.py"
TASKS = 4


@pytest.fixture(scope="session")
def slurm() -> Iterator[str]:
    """The ``SLURM_CONF`` of a running private one-node cluster (started here, and stopped at the
    end, if it was not up)."""
    if os.geteuid() != 0:
        pytest.skip("needs root: scripts/slurm.sh installs and starts Slurm and munge")
    conf = slurm_conf()
    was_up = shutil.which("sinfo") is not None and _node_up(conf)
    done = subprocess.run(
        ["bash", str(SCRIPT), "start"],
        capture_output=True,
        text=True,
        timeout=600,
        stdin=subprocess.DEVNULL,
    )
    try:
        assert done.returncode == 0, f"scripts/slurm.sh start failed:\n{done.stdout}{done.stderr}"
        yield conf
    finally:
        if not was_up:  # also after a failed start: no daemon of ours is left behind
            subprocess.run(["bash", str(SCRIPT), "stop"], timeout=120, stdin=subprocess.DEVNULL)


def slurm_conf() -> str:
    """The private cluster's configuration, as ``scripts/slurm.sh env`` prints it."""
    out = subprocess.run(
        ["bash", str(SCRIPT), "env"], capture_output=True, text=True, timeout=30, check=True
    ).stdout
    words = shlex.split(out)
    assert len(words) == 2 and words[0] == "export", out
    name, _, value = words[1].partition("=")
    assert name == "SLURM_CONF" and value, out
    return value


def _node_up(conf: str) -> bool:
    """Whether the private cluster (not a system Slurm) has its node up."""
    if not Path(conf).is_file():
        return False
    try:
        out = subprocess.run(
            ["sinfo", "-h", "-o", "%T"],
            capture_output=True,
            text=True,
            timeout=10,
            env={**job_environment(), "SLURM_CONF": conf},
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return out.returncode == 0 and out.stdout.strip() in ("idle", "mixed", "allocated")


def slurm_job(
    conf: str,
    command: list[str],
    *,
    timeout: float = 180,
    cwd: str | os.PathLike[str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """tests/support/jobs.py's ``run_job`` (a user's clean environment, no stdin, output captured, a
    timeout) on the private cluster: with its ``SLURM_CONF``, which sbatch's jobs inherit."""
    return subprocess.run(
        command,
        cwd=cwd,
        env={**job_environment(), "SLURM_CONF": conf},
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )


def reports(directory: Path, count: int) -> list[dict[str, Any]]:
    found = sorted(directory.glob("rank-*.json"))
    assert len(found) == count, f"{len(found)} of {count} ranks reported: {found}"
    return [json.loads((directory / f"rank-{r}.json").read_text()) for r in range(count)]


def check_world(results: list[dict[str, Any]], backend: str, method: str) -> None:
    """Every rank: its place in a one-node job of TASKS, the backend, and a real all-reduce."""
    for rank, seen in enumerate(results):
        assert (seen["rank"], seen["world_size"]) == (rank, TASKS)
        assert (seen["local_rank"], seen["local_world_size"]) == (rank, TASKS)
        assert (seen["node_rank"], seen["num_nodes"]) == (0, 1)
        assert (seen["backend"], seen["method"]) == (backend, method)
        assert seen["sum"] == TASKS * (TASKS + 1) // 2


SRUN_CASES = [
    # (srun's --mpi, rank_report MODE, BACKEND, the backend that must run)
    ("none", "dist_init", "gloo", "gloo"),
    ("none", "init", "gloo", "gloo"),
    ("none", "init", "auto", "gloo"),  # no MPI variables: mpi is unavailable, gloo chosen
    ("pmi2", "dist_init", "mpi", "mpi"),
    ("pmi2", "init", "auto", "mpi"),  # MPI variables beside Slurm's: mpi chosen (faster)
]


@pytest.mark.timeout(300)
@pytest.mark.parametrize(("mpi", "mode", "backend", "runs"), SRUN_CASES)
def test_srun_tasks(
    slurm: str, tmp_path: Path, mpi: str, mode: str, backend: str, runs: str
) -> None:
    command = ["srun", "-n", str(TASKS), "--overcommit", f"--mpi={mpi}", "--time=3"]
    done = slurm_job(slurm, [*command, sys.executable, str(RANK), str(tmp_path), mode, backend])
    assert done.returncode == 0, done.stdout + done.stderr
    check_world(reports(tmp_path, TASKS), runs, "slurm")


def sbatch(conf: str, script: Path) -> subprocess.CompletedProcess[str]:
    """Submit ``script`` to the cluster of ``conf`` and wait for the job to end."""
    return slurm_job(
        conf, ["sbatch", "--wait", "--quiet", str(script)], timeout=240, cwd=script.parent
    )


@pytest.mark.timeout(300)
def test_mpirun_inside_an_sbatch_script(slurm: str, mpirun: str, tmp_path: Path) -> None:
    """Hydra starts its proxies through srun: every rank sees SLURM_PROCID=0, and MPI's
    variables take the launch (DESIGN section 3)."""
    script = tmp_path / "job.sbatch"
    script.write_text(
        f"#!/bin/bash\n#SBATCH -n {TASKS}\n#SBATCH --overcommit\n#SBATCH -o {tmp_path}/job.out\n"
        f"{mpirun} -n {TASKS} {sys.executable} {RANK} {tmp_path} init auto\n"
    )
    done = sbatch(slurm, script)
    assert done.returncode == 0, done.stdout + done.stderr + (tmp_path / "job.out").read_text()
    check_world(reports(tmp_path, TASKS), "mpi", "mpi")


@pytest.mark.timeout(300)
def test_python_in_a_batch_script_without_srun_warns(slurm: str, tmp_path: Path) -> None:
    script = tmp_path / "job.sbatch"
    probe = "import distcomm; l = distcomm.detect_environment(); print(l.method, l.world_size)"
    script.write_text(
        f"#!/bin/bash\n#SBATCH -n 2\n#SBATCH -o {tmp_path}/job.out\n{sys.executable} -c '{probe}'\n"
    )
    done = sbatch(slurm, script)
    assert done.returncode == 0, done.stdout + done.stderr
    out = (tmp_path / "job.out").read_text()
    assert "single_node 1" in out
    assert "DistcommWarning: Slurm job" in out and "not started by srun" in out
    assert "HINT: srun python" in out


@pytest.mark.timeout(300)
@pytest.mark.parametrize(("srun_mpi", "backend"), [("none", "gloo"), ("pmi2", "mpi")])
def test_example_batch_script(slurm: str, tmp_path: Path, srun_mpi: str, backend: str) -> None:
    export = f"--export=ALL,PYTHON={sys.executable},SRUN_MPI={srun_mpi}"
    done = slurm_job(
        slurm,
        [
            "sbatch",
            "--wait",
            "--parsable",
            export,
            f"--output={tmp_path}/%j.out",
            str(ROOT / "examples" / "slurm_job.sbatch"),
        ],
        timeout=240,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    out = (tmp_path / f"{done.stdout.strip()}.out").read_text()
    assert out.splitlines() == [
        f"4 ranks on {backend} (slurm launch): sum of ranks 6 (expected 6)",
        "hello from rank-0, rank-1, rank-2, rank-3",
    ]


DYING = Path(__file__).resolve().parents[1] / "support" / "dying_rank.py"


@pytest.mark.timeout(300)
def test_the_conformance_kit_on_the_zmq_plugin_under_srun(slurm: str, tmp_path: Path) -> None:
    """The kit a plugin author runs, on the third-party zmq backend, under srun: every task
    passes every check (the rendezvous comes from Slurm's variables)."""
    from distcomm.testing.conformance import CHECKS

    command = ["srun", "-n", str(TASKS), "--overcommit", "--mpi=none", "--time=4"]
    command += ["--kill-on-bad-exit=1", sys.executable, "-m", "pytest", "-q"]
    command += ["-p", "no:cacheprovider", "--pyargs", "distcomm.testing.conformance"]
    done = slurm_job(slurm, [*command, "--distcomm-backend=zmq"], cwd=tmp_path, timeout=280)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    assert done.stdout.count(f"{len(CHECKS)} passed in ") == TASKS, done.stdout[-4000:]


@pytest.mark.timeout(300)
def test_torch_native_libraries_under_srun_mpi(slurm: str, tmp_path: Path) -> None:
    """``srun --mpi=pmi2``: mpi is chosen, and distcomm makes torch's default group beside it,
    so DDP, FSDP, Accelerate and Ignite work right after ``distcomm.init()``."""
    command = ["srun", "-n", "2", "--overcommit", "--mpi=pmi2", "--time=3"]
    done = slurm_job(slurm, [*command, sys.executable, str(CLIENTS), str(tmp_path)], cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    check_interop(tmp_path, 2, "mpi")


@pytest.mark.timeout(300)
def test_distcomm_bench_under_srun_mpi(slurm: str, tmp_path: Path) -> None:
    """``srun --mpi=pmi2 distcomm bench``: every task one rank of the benchmark (mpi chosen), the
    JSON written by rank 0 alone, with the engine's own calls compared."""
    command = ["srun", "-n", str(TASKS), "--overcommit", "--mpi=pmi2", "--time=3"]
    command += [sys.executable, "-m", "distcomm", "bench", "--ops", "all_reduce,broadcast_object"]
    command += ["--sizes", "8,64K", "--iters", "3", "--warmup", "1", "--rounds", "2"]
    command += ["--compare", "raw", "--json", str(tmp_path / "bench.json")]
    done = slurm_job(slurm, command, cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    ops = {"all_reduce", "broadcast_object"}
    doc = check_bench_json(tmp_path / "bench.json", sorted(ops), [8, 65536], TASKS, ops)
    assert (doc["backend"], doc["launcher"]) == ("mpi", "slurm")


@pytest.mark.timeout(300)
@pytest.mark.usefixtures("aborted_mpich_job")
def test_a_rank_that_raises_under_srun_mpi_ends_the_job(slurm: str, tmp_path: Path) -> None:
    """srun --mpi=pmi2 on mpi: rank 2's uncaught exception ends every task within seconds
    (MPI_Abort), under the default 30-minute timeout."""
    command = ["srun", "-n", str(TASKS), "--overcommit", "--mpi=pmi2", "--time=3"]
    start = time.monotonic()
    done = slurm_job(slurm, [*command, sys.executable, str(DYING), str(tmp_path), "mpi", "2"])
    assert time.monotonic() - start < 120
    assert done.returncode != 0
    assert "ValueError: rank 2 breaks on purpose" in done.stderr
    assert "distcomm: rank 2 died of an uncaught ValueError" in done.stderr
    assert not list(tmp_path.glob("rank-*.json")), "a survivor's all_reduce returned"


@pytest.mark.timeout(300)
def test_a_rank_that_raises_under_plain_srun_fails_the_others(slurm: str, tmp_path: Path) -> None:
    """Plain srun does not stop the other tasks when one fails: on gloo they fail on their own,
    at once, with a distcomm error that names the rank that went away."""
    command = ["srun", "-n", str(TASKS), "--overcommit", "--mpi=none", "--time=3"]
    export = "--export=ALL,DISTCOMM_TIMEOUT=15"
    argv = [*command, export, sys.executable, str(DYING), str(tmp_path), "gloo", "2"]
    done = slurm_job(slurm, argv)
    assert done.returncode != 0 and "ValueError: rank 2 breaks on purpose" in done.stderr
    for rank in (0, 1, 3):
        report = json.loads((tmp_path / f"rank-{rank}.json").read_text())
        assert report["error"] in ("EngineError", "DistTimeoutError"), report
        assert report["missing"] == [2], report["message"]
        assert report["seconds"] < 2 * 15, report["message"]


@pytest.mark.timeout(300)
def test_scancel_kill_of_the_step_leaves_no_rank_and_nothing_behind(
    slurm: str, tmp_path: Path
) -> None:
    """Issue 41 under srun: 2 tasks that called init() (rank 0 waiting in a collective, each
    with a forked child); ``scancel -s KILL`` on the step; 3 s later no task nor child is alive,
    and neither /dev/shm nor the job's temporary directory holds anything of it."""
    temp = tmp_path / "tmp"
    temp.mkdir()
    command = ["srun", "-n", "2", "--overcommit", "--mpi=none", "--time=3"]
    env = {**job_environment(), "SLURM_CONF": slurm, "TMPDIR": str(temp)}
    env["DISTCOMM_BACKEND"] = "gloo"
    launcher = subprocess.Popen(
        [*command, sys.executable, str(ORPHANS), str(tmp_path), "collective"],
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        pids = pids_of(tmp_path, launcher)
        shm_before = dev_shm_names()
        step = (tmp_path / "step").read_text()
        subprocess.run(["scancel", "-s", "KILL", step], env=env, check=True, timeout=30)
        left = wait_for_the_end(pids)
        assert not left, f"alive {WITHIN} s after scancel -s KILL {step}: {left} (of {pids})"
        assert dev_shm_names() <= shm_before, f"left in /dev/shm: {dev_shm_names() - shm_before}"
        assert list(temp.iterdir()) == [], f"left in the job's TMPDIR: {list(temp.iterdir())}"
        launcher.wait(timeout=60)  # srun ends with its step
    finally:
        if launcher.poll() is None:
            os.killpg(launcher.pid, signal.SIGKILL)
            launcher.wait()
