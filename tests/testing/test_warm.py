"""Tests of distcomm.testing.WarmWorld: rank processes started once, under spawn, ``distcomm run``
and ``mpirun``, that run call after call as ``spawn`` would.

A call that fails, hangs or loses a rank fails alone, naming the rank and the test; the next call
runs in new processes. The functions the ranks run are defined at the top level of this module,
because each rank imports them by name.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from jobs import dev_shm_names, job_environment

import distcomm
from distcomm.errors import DistTimeoutError, InvalidArgumentError, RankFailedError
from distcomm.testing import WarmWorld

#: (launcher, backend) of the worlds every behaviour is checked in.
LAUNCHED = [
    pytest.param("spawn", "gloo", id="spawn-gloo"),
    pytest.param("distcomm run", "gloo", id="distcomm-run-gloo"),
    pytest.param("mpirun", "mpi", id="mpirun-mpi"),
]


# -- what the ranks run -------------------------------------------------------------------------
def describe() -> dict[str, Any]:
    return {
        "rank": distcomm.get_rank(),
        "size": distcomm.get_world_size(),
        "backend": distcomm.get_backend(),
        "sum": distcomm.all_reduce(distcomm.get_rank() + 1),
        "seq": distcomm.get_communicator().seq,
        "pid": os.getpid(),
        "cwd": os.getcwd(),
        "variable": os.environ.get("WARM_WORLD_TEST_VARIABLE"),
    }


def rank_1_fails() -> None:
    if distcomm.get_rank() == 1:
        raise AssertionError("rank 1 disagrees")
    distcomm.barrier()  # the other ranks wait for rank 1 here


def rank_0_hangs() -> None:
    if distcomm.get_rank() == 0:
        time.sleep(600)  # busy outside distcomm
    distcomm.barrier()


def last_rank_dies() -> None:
    if distcomm.get_rank() == distcomm.get_world_size() - 1:
        os._exit(3)
    distcomm.barrier()


def says_hello() -> int:
    print(f"hello from rank {distcomm.get_rank()}")
    print("to stderr", file=sys.stderr)
    return distcomm.get_rank()


# -- tests --------------------------------------------------------------------------------------
@pytest.mark.timeout(240)
@pytest.mark.parametrize(("launcher", "backend"), LAUNCHED)
def test_calls_run_in_the_same_processes_each_with_a_fresh_communicator(
    launcher: str,
    backend: str,
    warm_world: Callable[..., WarmWorld],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    world = warm_world(2, backend, launcher)
    first = world.run(describe)
    monkeypatch.setenv("WARM_WORLD_TEST_VARIABLE", "set by the test")
    monkeypatch.chdir(tmp_path)
    second = world.run(describe)
    for rank, (one, two) in enumerate(zip(first, second, strict=True)):
        assert (one["rank"], one["size"], one["backend"], one["sum"]) == (rank, 2, backend, 3)
        assert one["pid"] == two["pid"], "the second call ran in another process"
        assert one["seq"] == two["seq"], "the second call's communicator was not a fresh one"
        assert (two["variable"], two["cwd"]) == ("set by the test", str(tmp_path))
        assert one["variable"] is None
    assert world.starts == 1 and world.pids == [r["pid"] for r in second]


@pytest.mark.timeout(300)
@pytest.mark.parametrize(("launcher", "backend"), LAUNCHED)
def test_a_failing_a_hanging_and_a_dying_call_each_fail_alone_and_the_next_call_runs(
    launcher: str, backend: str
) -> None:
    """Each fails naming the rank and this test; its processes are gone, the next call runs in
    new ones, and a stopped world leaves nothing in /dev/shm, even when a rank died before
    MPICH could remove its segment."""
    test = (
        "tests/testing/test_warm.py::test_a_failing_a_hanging_and_a_dying_call_each_fail_alone_"
        "and_the_next_call_runs["
    )
    shm = dev_shm_names()
    with WarmWorld(2, backend=backend, launcher=launcher) as world:
        before = world.run(describe)
        with pytest.raises(RankFailedError) as failed:
            world.run(rank_1_fails, timeout=60)
        said = str(failed.value)
        assert failed.value.rank == 1, said
        assert said.startswith(f"rank 1 of 2 failed in {test}"), said
        assert "AssertionError: rank 1 disagrees" in said, said
        assert f"(warm world: 2 ranks of {backend} under {launcher})" in said, said
        assert not any(_exists(r["pid"]) for r in before), "the broken world's processes remain"
        assert [r["sum"] for r in world.run(describe)] == [3, 3] and world.starts == 2

        with pytest.raises(DistTimeoutError) as hung:
            world.run(rank_0_hangs, timeout=3)
        said = str(hung.value)
        assert hung.value.missing_ranks == (0, 1), said
        assert said.startswith(
            f"warm world (2 ranks of {backend} under {launcher}): ranks [0, 1] of 2 did not "
            f"finish in {test}"
        ), said
        rank_0 = said.split("  rank 0:")[1].split("  rank 1:")[0]
        assert "in rank_0_hangs" in rank_0 and "warm_rank.py" not in rank_0, said
        assert "in barrier" in said.split("  rank 1:")[1], said
        assert [r["sum"] for r in world.run(describe)] == [3, 3] and world.starts == 3

        with pytest.raises(RankFailedError) as died:
            world.run(last_rank_dies, timeout=60)
        said = str(died.value)
        assert died.value.rank == 1 and said.startswith(f"rank 1 of 2 failed in {test}"), said
        how = "exited with code 3" if launcher == "spawn" else "ended (its connection closed)"
        assert f"rank 1 {how} without reporting a result or a traceback" in said, said
        assert [r["sum"] for r in world.run(describe)] == [3, 3] and world.starts == 4
    assert not dev_shm_names() - shm, "a killed world left files in /dev/shm"


@pytest.mark.timeout(120)
def test_what_a_call_prints_is_shown_after_it_with_the_rank(
    warm_world: Callable[..., WarmWorld], capfd: pytest.CaptureFixture[str]
) -> None:
    assert warm_world(2).run(says_hello) == [0, 1]
    out = capfd.readouterr().out.splitlines()
    assert out == [
        "[rank 0] hello from rank 0",
        "[rank 0] to stderr",
        "[rank 1] hello from rank 1",
        "[rank 1] to stderr",
    ], out


@pytest.mark.timeout(120)
def test_close_ends_every_process_and_a_closed_world_refuses_calls() -> None:
    world = WarmWorld(2)
    pids = [r["pid"] for r in world.run(describe)]
    world.close()
    assert not any(_exists(pid) for pid in pids), "close() left a rank running"
    with pytest.raises(InvalidArgumentError, match=r"is closed\. HINT: make a new WarmWorld"):
        world.run(describe)
    world.close()  # twice is fine


@pytest.mark.timeout(120)
def test_ranks_end_by_themselves_and_leave_nothing_when_the_controller_is_killed(
    tmp_path: Path,
) -> None:
    controller = tmp_path / "controller.py"
    controller.write_text(
        textwrap.dedent(
            """
            import os, sys, time
            from distcomm.testing import WarmWorld

            def pid():
                return os.getpid()

            if __name__ == "__main__":
                world = WarmWorld(2, backend=None, launcher=sys.argv[1])
                print(*world.run(pid), flush=True)
                time.sleep(600)
            """
        )
    )
    for launcher in ("spawn", "distcomm run"):
        private = tmp_path / launcher.replace(" ", "-")  # the world's folder goes there
        private.mkdir()
        proc = subprocess.Popen(
            [sys.executable, str(controller), launcher],
            stdout=subprocess.PIPE,
            text=True,
            env={**job_environment(), "TMPDIR": str(private)},
            stdin=subprocess.DEVNULL,
        )
        try:
            assert proc.stdout is not None
            pids = [int(pid) for pid in proc.stdout.readline().split()]
            assert len(pids) == 2, pids
            proc.send_signal(signal.SIGKILL)
            proc.wait(10)
            deadline = time.monotonic() + 15
            while any(_exists(pid) for pid in pids) and time.monotonic() < deadline:
                time.sleep(0.1)
            assert not any(_exists(pid) for pid in pids), f"{launcher}: ranks outlived it"
            deadline = time.monotonic() + 5
            while list(private.iterdir()) and time.monotonic() < deadline:
                time.sleep(0.1)
            assert not list(private.iterdir()), f"{launcher}: the world's folder was left"
        finally:
            proc.kill()
            proc.wait()


@pytest.mark.parametrize(
    ("make", "expected"),
    [
        (lambda: WarmWorld(0), "nprocs=0 must be a positive int. HINT: "),
        (lambda: WarmWorld(2, launcher="mpirn"), "launcher='mpirn' is not a launcher a warm"),
        (lambda: WarmWorld(2, launcher="mpirn"), "HINT: did you mean 'mpirun'?"),
        (lambda: WarmWorld(2, start_timeout=0), "start_timeout=0 must be a positive number"),
        (lambda: WarmWorld(2, launcher_args="-x A"), "must be a list of arguments, not a string"),
        (lambda: WarmWorld(2).run(describe, timeout=-1), "timeout=-1 must be a positive number"),
        (lambda: WarmWorld(2).run(lambda: 1), "cannot be pickled"),
    ],
)
def test_bad_arguments_are_refused_before_anything_starts(
    make: Callable[[], Any], expected: str
) -> None:
    with pytest.raises(InvalidArgumentError) as info:
        make()
    assert expected in str(info.value), str(info.value)


def test_an_unknown_backend_is_refused_with_a_did_you_mean() -> None:
    with pytest.raises(distcomm.BackendNotFoundError, match=r"did you mean 'gloo'\?"):
        WarmWorld(2, backend="glo")


def _exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as file:
            return file.read().rpartition(")")[2].split()[0] != "Z"
    except OSError:
        return False


SESSION = """
import time

import distcomm
import pytest

from distcomm.testing import WarmWorld


@pytest.fixture(scope="session")
def world():
    with WarmWorld(2, backend="gloo") as world:
        yield world


def total():
    return distcomm.all_reduce(distcomm.get_rank() + 1)


def rank_1_disagrees():
    assert distcomm.get_rank() == 0, f"rank {distcomm.get_rank()} disagrees"
    return 0


def rank_0_sleeps():
    if distcomm.get_rank() == 0:
        time.sleep(600)
    distcomm.barrier()


def test_a_passes(world):
    assert world.run(total) == [3, 3]


def test_b_fails_on_rank_1(world):
    world.run(rank_1_disagrees)


def test_c_hangs(world):
    world.run(rank_0_sleeps, timeout=3)


def test_d_passes_in_the_same_world(world):
    assert world.run(total) == [3, 3] and world.starts == 3
"""


@pytest.mark.timeout(240)
def test_in_a_pytest_session_a_failing_and_a_hanging_test_fail_alone(
    pytester: pytest.Pytester,
) -> None:
    """One world for a session of four tests: the second fails on rank 1 and the third hangs;
    each fails by its own error naming the test and the rank, and the fourth passes."""
    pytester.makepyfile(test_session=SESSION)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-q", timeout=200)
    result.assert_outcomes(passed=2, failed=2)
    result.stdout.fnmatch_lines(
        [
            "*RankFailedError: rank 1 of 2 failed in test_session.py::test_b_fails_on_rank_1 "
            "(warm world: 2 ranks of gloo under spawn):",
            "*AssertionError: rank 1 disagrees*",
        ]
    )
    result.stdout.fnmatch_lines(
        [
            "*DistTimeoutError: warm world (2 ranks of gloo under spawn): ranks [[]0, 1[]] of 2 "
            "did not finish in test_session.py::test_c_hangs within 3 s.",
        ]
    )
