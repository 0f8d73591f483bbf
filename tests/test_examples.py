"""The examples and benchmark scripts run as the README and docs say, with the output they show."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from jobs import job_environment, run_job

from distcomm._plugins.loader import get_registry

ROOT = Path(__file__).resolve().parent.parent


def run(*args: str) -> str:
    done = subprocess.run(
        [sys.executable, *args],
        cwd=ROOT,
        env=job_environment(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_hello_threads_moves_real_data() -> None:
    lines = run("examples/hello_threads.py", "3").splitlines()
    assert len(lines) == 3
    for rank, line in enumerate(lines):
        assert line.startswith(f"rank {rank} of 3: mean grad 2.00, lr 0.1, ")
        assert "losses [1.0, 0.5, 0.333]" in line
    assert lines[0].endswith("even group rank 0 of 2")
    assert lines[2].endswith("even group rank 1 of 2")
    assert "even group" not in lines[1]


def test_launch_detection_example() -> None:
    out = run("examples/launch_detection.py")
    assert "-> env: rank 1 of 4, local 1 of 2, node 0 of 2, master node01:29500" in out
    assert "-> slurm: rank 3 of 5, local 0 of 2, node 1 of 2, master gpu-07:19242" in out
    assert "-> mpi: rank 1 of 2, local 1 of 2" in out
    assert "-> single_node: rank 0 of 1" in out


def test_overhead_benchmark_runs() -> None:
    rows = run("benchmarks/overhead.py", "--rounds", "1", "--calls", "200").splitlines()
    assert rows[0].split()[:2] == ["array", "side"]
    assert {row.split()[0] for row in rows[1:]} == {"numpy", "torch"}
    assert len(rows) == 7


def distcomm_run(*args: str) -> str:
    return run("-m", "distcomm", "run", *args)


def test_hello_under_distcomm_run() -> None:
    out = distcomm_run("-n", "4", "examples/hello.py").splitlines()
    assert out == [
        "[rank 0] 4 ranks on gloo (env launch): sum of ranks 6 (expected 6)",
        "[rank 0] hello from rank-0, rank-1, rank-2, rank-3",
    ]


def test_debugging_example_catches_each_bug() -> None:
    out = sorted(distcomm_run("-n", "2", "examples/debugging.py").splitlines())
    assert out == [
        "[rank 0] rank 0: MainOnlyCollectiveError: barrier inside main_process_only "
        "'save_checkpoint'",
        """[rank 0] rank 0: NotSameError: ranks [1] differ in ["['layer.bias']"]""",
        "[rank 0] rank 0: late mismatch at #155, stopped before it ran",
        "[rank 0] rank 0: mismatch at #3: element counts by rank [6, 4]",
        "[rank 0] rank 0: the hook saw 2 collectives, 4000 tensor bytes",
        "[rank 1] rank 1: NotSameError: ranks [1] differ in [\"['layer.bias']\"]",
        "[rank 1] rank 1: RankFailedError: rank 0 failed in main_process_only",
        "[rank 1] rank 1: late mismatch at #155, stopped before it ran",
        "[rank 1] rank 1: mismatch at #3: element counts by rank [6, 4]",
        "[rank 1] rank 1: the hook saw 2 collectives, 4000 tensor bytes",
    ]


def test_ddp_example_trains() -> None:
    out = distcomm_run("-n", "2", "examples/ddp_train.py", "--steps", "200").splitlines()
    summary = out[-1]
    assert summary.startswith("[rank 0] done: loss ") and summary.endswith("on 2 ranks")
    first, last = (float(v) for v in summary.split("loss ")[1].split(" over")[0].split(" -> "))
    assert last < first / 20, summary


def test_elastic_example_resumes_after_a_restart_with_the_uninterrupted_weights(
    tmp_path: Path,
) -> None:
    """Rank 1 fails at the start of epoch 3 on the first attempt; distcomm run --max-restarts 1
    starts every rank again, they resume from epoch 3's checkpoint and end with the weights of
    a run that never failed (bit for bit: the checkpoint keeps every float exactly)."""
    example = ("examples/elastic_train.py", "--epochs", "5", "--steps", "10")
    plain = distcomm_run("-n", "2", *example, "--checkpoint", str(tmp_path / "a")).splitlines()
    restarted = distcomm_run(
        "-n",
        "2",
        "--max-restarts",
        "1",
        *example,
        "--checkpoint",
        str(tmp_path / "b"),
        "--crash-at",
        "3",
    ).splitlines()
    assert plain[0] == restarted[0] == "[rank 0] start: from epoch 0 of 5"
    assert restarted[1] == "[rank 0] restart 1: from epoch 3 of 5", restarted
    assert plain[-1].startswith("[rank 0] final weights: [2.98"), plain
    assert restarted[-1] == plain[-1]


def test_torch_allreduce_benchmark_runs() -> None:
    out = distcomm_run("-n", "2", "benchmarks/torch_allreduce.py", "--rounds", "1").splitlines()
    assert [line.split()[2] for line in out[2:]] == ["8", "64"]


def test_object_policy_benchmark_times_both_policies_of_every_object_operation() -> None:
    out = distcomm_run(
        "-n", "2", "--backend", "gloo", "benchmarks/object_policy.py", "--rounds", "1"
    )
    rows = [line.split() for line in out.splitlines()[1:]]
    ops = ["all_gather_object", "broadcast_object", "gather_object", "scatter_object"]
    cases = [(op, size) for op in ops for size in ("1 KiB", "16 MiB") for _ in range(2)]
    assert [(row[3], f"{row[4]} {row[5]}") for row in rows] == cases, out
    assert [row[6] for row in rows] == ["distcomm", "plain"] * 8, out


def test_workspace_benchmark_runs() -> None:
    args = ("-n", "2", "benchmarks/workspace_gather.py", "--rounds", "1", "--mib", "1")
    out = distcomm_run(*args).splitlines()
    assert out[0] == "[rank 0] 2 ranks x 1 MiB to rank 0, torch " + out[0].split()[-1]
    assert [line.split()[2] for line in out[1:]] == [
        "get_tensors_parallel",
        "torch.distributed.gather",
        "ratio",
    ]


def test_rank_zero_example_alone_and_under_mpirun(request: pytest.FixtureRequest) -> None:
    assert run("examples/rank_zero.py").splitlines() == [
        "rank 0 merged 1 shards: sum 0",
        "[rank: 0] 1 ranks, vocabulary of 3",
    ]
    mpirun = request.getfixturevalue("mpirun")
    done = run_job([mpirun, "-n", "4", sys.executable, "examples/rank_zero.py"], cwd=ROOT)
    assert done.returncode == 0, done.stderr
    # MPICH's launcher may join the ranks' lines in any order, even a line and its newline
    expected = ["rank 0 merged 4 shards: sum 24"]
    expected += [f"[rank: {r}] 4 ranks, vocabulary of 3" for r in range(4)]
    assert all(done.stdout.count(line) == 1 for line in expected), done.stdout
    assert len(done.stdout) == sum(len(line) + 1 for line in expected)


def test_pipeline_exchange_under_distcomm_run_and_mpirun(request: pytest.FixtureRequest) -> None:
    """Neighbours exchange in batches (docs/reference/distcomm.md shows the gloo line)."""
    assert distcomm_run("-n", "4", "examples/pipeline_exchange.py").splitlines() == [
        "[rank 0] 4 stages on gloo, 8 steps: 0 exchanges with a wrong value"
    ]
    mpirun = request.getfixturevalue("mpirun")
    command = [mpirun, "-n", "3", sys.executable, "examples/pipeline_exchange.py"]
    done = run_job(command, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "3 stages on mpi, 8 steps: 0 exchanges with a wrong value\n"


#: (launcher, backend): the timeouts example under each; gloo under mpirun has its rendezvous
#: over MPI.
TIMEOUT_LAUNCHES = [("distcomm run", "gloo"), ("mpirun", "mpi"), ("mpirun", "gloo")]


@pytest.mark.timeout(180)
@pytest.mark.usefixtures("aborted_mpich_job")
@pytest.mark.parametrize(("launcher", "backend"), TIMEOUT_LAUNCHES)
def test_timeouts_example_names_the_skipped_barrier_under_every_launcher(
    launcher: str, backend: str, request: pytest.FixtureRequest
) -> None:
    """Where the engine can give up a blocked call, ranks 0 and 2 raise DistTimeoutError and
    carry on; where it cannot (capabilities.cancellable is False), the job ends with the same
    diagnostic. Either way the barrier, its sequence number and rank 1 are named."""
    if launcher == "mpirun":
        mpirun = request.getfixturevalue("mpirun")
        command = [mpirun, "-n", "3", sys.executable, "examples/timeouts.py"]
    else:
        command = [sys.executable, "-m", "distcomm", "run", "-n", "3", "examples/timeouts.py"]
    done = subprocess.run(
        command,
        cwd=ROOT,
        env={**job_environment(), "DISTCOMM_TIMEOUT": "3", "DISTCOMM_BACKEND": backend},
        capture_output=True,
        text=True,
        timeout=150,
        stdin=subprocess.DEVNULL,
    )
    if get_registry().backends[backend].capabilities.cancellable:
        assert done.returncode == 0, done.stderr
        for rank in (0, 2):
            assert f"rank {rank}: op='barrier' seq=2 missing_ranks=(1,)" in done.stdout
            assert (
                f"rank {rank}: DistTimeoutError: barrier (operation #2) on {backend} 'world'"
                in (done.stdout)
            )
        assert "ranks that had not arrived: [1] (rank 1 is at operation #1)" in done.stdout
        assert "in load_next_shard\n" in done.stdout, "where rank 1 is"
        assert "rank 1: woke up after the others gave up" in done.stdout
        assert "rank 1: finalize: collective mismatch at operation #2" in done.stdout
        assert "ranks 0, 2: barrier" in done.stdout, "what rank 1 skipped"
    else:
        assert done.returncode != 0
        assert f"barrier (operation #2) on {backend} 'world' (3 ranks) did not complete" in (
            done.stderr
        )
        assert "ranks that had not arrived: [1] (rank 1 is at operation #1)" in done.stderr
        assert "in load_next_shard\n" in done.stderr, "where rank 1 is"
        assert "aborts the job (MPI_Abort, although DISTCOMM_ON_TIMEOUT=raise)" in done.stderr
