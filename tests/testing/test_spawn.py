"""Tests of distcomm.testing.spawn: process-ranks, each initialised on a real backend.

The functions the ranks run are defined at the top level of this module, because each process
imports them by name. fakelink runs a world of 1; gloo (from distcomm-torch) runs 2 and 4.
"""

from __future__ import annotations

import importlib.util
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from jobs import RUN_VARIABLES as VARIABLES
from jobs import children_left

import distcomm
from distcomm.errors import (
    BackendNotFoundError,
    DistTimeoutError,
    InvalidArgumentError,
    RankFailedError,
)
from distcomm.testing import spawn

needs_distcomm_torch = pytest.mark.skipif(
    importlib.util.find_spec("distcomm_torch") is None,
    reason="distcomm-torch is not installed (pip install ./backends/distcomm-torch)",
)
WORLDS = [
    pytest.param("fakelink", 1, id="fakelink-1"),
    pytest.param("gloo", 2, id="gloo-2", marks=needs_distcomm_torch),
    pytest.param("gloo", 4, id="gloo-4", marks=needs_distcomm_torch),
]


@pytest.fixture(autouse=True)
def no_children_left() -> Iterator[None]:
    yield
    assert children_left() == []


# -- what the ranks run -------------------------------------------------------------------------
def describe(tag: str) -> dict[str, Any]:
    return {
        "rank": distcomm.get_rank(),
        "world_size": distcomm.get_world_size(),
        "backend": distcomm.get_backend(),
        "sum": distcomm.all_reduce(distcomm.get_rank() + 1),
        "gathered": distcomm.all_gather_object(tag * (distcomm.get_rank() + 1)),
        "env": {name: os.environ.get(name) for name in VARIABLES},
        "stdin_is_devnull": os.path.samestat(os.fstat(0), os.stat(os.devnull)),
    }


def record_pid(directory: str) -> None:
    """Write this rank's pid file whole (a rank killed mid-write must not leave an empty one)."""
    part = Path(directory, f"{distcomm.get_rank()}.part")
    part.write_text(str(os.getpid()))
    part.replace(part.with_suffix(".pid"))


def wait_for_pids(directory: str, count: int) -> None:
    deadline = time.monotonic() + 30
    while len(list(Path(directory).glob("*.pid"))) < count and time.monotonic() < deadline:
        time.sleep(0.05)


def last_rank_fails(directory: str, how: str) -> None:
    """The last rank fails once every rank has recorded its pid; the others sleep 60 s."""
    record_pid(directory)
    if distcomm.get_rank() == distcomm.get_world_size() - 1:
        wait_for_pids(directory, distcomm.get_world_size())
        if how == "raise":
            raise ValueError(f"rank {distcomm.get_rank()} gives up")
        if how == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        os._exit(3)
    time.sleep(60)


def sleep_on_last_rank(seconds: float) -> None:
    if distcomm.get_rank() == distcomm.get_world_size() - 1:
        time.sleep(seconds)
    distcomm.barrier()


def unpicklable_result() -> threading.Lock:
    return threading.Lock()


def nothing() -> None:
    return None


# -- tests ----------------------------------------------------------------------------------------
@pytest.mark.timeout(120)
@pytest.mark.parametrize(("backend", "nprocs"), WORLDS)
def test_results_come_back_in_rank_order(backend: str, nprocs: int) -> None:
    results = spawn(describe, nprocs, "x", backend=backend)
    assert [r["rank"] for r in results] == list(range(nprocs))
    ports = {r["env"]["MASTER_PORT"] for r in results}
    assert len(ports) == 1 and int(ports.pop()) > 0
    for rank, result in enumerate(results):
        assert result["world_size"] == nprocs and result["backend"] == backend
        assert result["sum"] == nprocs * (nprocs + 1) // 2
        assert result["gathered"] == ["x" * (r + 1) for r in range(nprocs)]
        env = result["env"]
        assert (env["RANK"], env["WORLD_SIZE"]) == (str(rank), str(nprocs))
        assert (env["LOCAL_RANK"], env["LOCAL_WORLD_SIZE"]) == (str(rank), str(nprocs))
        assert (env["GROUP_RANK"], env["GROUP_WORLD_SIZE"]) == ("0", "1")
        assert env["MASTER_ADDR"] == "127.0.0.1" and env["PYTHONUNBUFFERED"] == "1"
        assert env["DISTCOMM_BACKEND"] == backend
        assert result["stdin_is_devnull"]
    assert not distcomm.is_initialized()
    assert "RANK" not in os.environ


@pytest.mark.timeout(60)
@pytest.mark.parametrize(("backend", "nprocs"), WORLDS)
def test_a_rank_that_raises_is_reported_and_the_others_killed(
    tmp_path: Path, backend: str, nprocs: int
) -> None:
    with pytest.raises(RankFailedError) as info:
        spawn(last_rank_fails, nprocs, str(tmp_path), "raise", backend=backend)
    assert info.value.rank == nprocs - 1
    assert info.value.traceback.startswith("Traceback (most recent call last):")
    assert f"ValueError: rank {nprocs - 1} gives up" in info.value.traceback
    assert f"rank {nprocs - 1} of {nprocs} failed" in str(info.value)
    assert_killed(tmp_path, nprocs)


@pytest.mark.timeout(60)
@pytest.mark.parametrize(("backend", "nprocs"), WORLDS)
def test_a_rank_that_exits_without_reporting_is_reported(
    tmp_path: Path, backend: str, nprocs: int
) -> None:
    with pytest.raises(RankFailedError) as info:
        spawn(last_rank_fails, nprocs, str(tmp_path), "exit", backend=backend)
    assert info.value.rank == nprocs - 1
    assert "exited with code 3 without reporting" in str(info.value)
    assert_killed(tmp_path, nprocs)


@pytest.mark.timeout(60)
def test_a_rank_killed_by_a_signal_is_reported_with_its_name(tmp_path: Path) -> None:
    with pytest.raises(RankFailedError) as info:
        spawn(last_rank_fails, 1, str(tmp_path), "kill", backend="fakelink")
    assert info.value.rank == 0
    assert "rank 0 was killed by SIGKILL (signal 9) without reporting" in str(info.value)
    assert_killed(tmp_path, 1)


def assert_killed(directory: Path, nprocs: int) -> None:
    pids = [int(path.read_text()) for path in directory.glob("*.pid")]
    assert len(pids) == nprocs
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


@pytest.mark.timeout(60)
def test_a_failing_init_is_reported() -> None:
    with pytest.raises(RankFailedError) as info:
        spawn(nothing, 2, backend="fakelink")
    assert "BackendUnavailableError" in info.value.traceback


@pytest.mark.timeout(60)
def test_a_result_that_cannot_be_pickled_is_reported() -> None:
    with pytest.raises(RankFailedError, match="could not be sent back") as info:
        spawn(unpicklable_result, 1, backend="fakelink")
    assert info.value.rank == 0


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("backend", "nprocs", "timeout"),
    [
        pytest.param("fakelink", 1, 2, id="fakelink-1"),
        pytest.param("gloo", 2, 12, id="gloo-2", marks=needs_distcomm_torch),
    ],
)
def test_a_run_past_its_timeout_raises_with_the_stacks(
    backend: str, nprocs: int, timeout: int
) -> None:
    with pytest.raises(DistTimeoutError) as info:
        spawn(sleep_on_last_rank, nprocs, 60, backend=backend, timeout=timeout)
    assert info.value.op == "spawn"
    assert info.value.missing_ranks == tuple(range(nprocs))
    message = str(info.value)
    assert f"did not finish within {timeout} s" in message and "HINT" in message
    assert "in sleep_on_last_rank" in message


def test_a_lambda_is_refused_before_anything_starts() -> None:
    with pytest.raises(InvalidArgumentError, match=r"cannot be pickled.*HINT: define fn at"):
        spawn(lambda: 1, 2)


def test_a_nested_function_is_refused() -> None:
    def nested() -> None:
        return None

    with pytest.raises(InvalidArgumentError, match="nested"):
        spawn(nested, 1, backend="fakelink")


@pytest.mark.parametrize(
    ("fn", "nprocs", "args", "kwargs", "message"),
    [
        (nothing, 0, (), {}, "nprocs=0"),
        (nothing, True, (), {}, "nprocs=True"),
        (nothing, "2", (), {}, "nprocs='2'"),
        (42, 1, (), {}, "fn=42 must be callable"),
        (nothing, 1, (), {"timeout": 0}, "timeout=0"),
        (describe, 1, (threading.Lock(),), {}, "args=(<unlocked _thread.lock"),
    ],
)
def test_invalid_arguments(
    fn: Any, nprocs: Any, args: tuple[Any, ...], kwargs: dict[str, Any], message: str
) -> None:
    with pytest.raises(InvalidArgumentError) as info:
        spawn(fn, nprocs, *args, **kwargs)
    assert message in str(info.value) and "HINT" in str(info.value)


def test_an_unknown_backend_is_refused() -> None:
    with pytest.raises(BackendNotFoundError, match="did you mean 'fakelink'"):
        spawn(nothing, 1, backend="fakelnk")


# -- restarts ------------------------------------------------------------------------------------
def fails_first(always: bool) -> tuple[int, int, str]:
    """Rank 1 raises on the first attempt (on every one if ``always``)."""
    restart = distcomm.restart_count()
    if distcomm.get_rank() == 1 and (always or restart == 0):
        raise RuntimeError(f"rank 1 fails on attempt {restart}")
    return restart, distcomm.all_reduce(1), os.environ["DISTCOMM_RUN_ID"]


@needs_distcomm_torch
def test_max_restarts_runs_a_fresh_world_after_a_failure(
    capfd: pytest.CaptureFixture[str],
) -> None:
    results = spawn(fails_first, 2, False, backend="gloo", max_restarts=1)
    assert [r[:2] for r in results] == [(1, 2), (1, 2)], "both ranks ran restart 1 together"
    said = capfd.readouterr().err
    assert "spawn: attempt 1 of 2 failed (RankFailedError: " in said, said
    assert "starting every rank again (restart 1 of 1)" in said


@needs_distcomm_torch
def test_the_last_attempts_failure_is_raised(capfd: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(RankFailedError, match="rank 1 fails on attempt 2"):
        spawn(fails_first, 2, True, backend="gloo", max_restarts=2)
    assert capfd.readouterr().err.count("starting every rank again") == 2


def test_a_negative_max_restarts_is_refused_before_anything_starts() -> None:
    with pytest.raises(InvalidArgumentError, match=r"max_restarts=-1 must be an int >= 0"):
        spawn(fails_first, 2, False, backend="gloo", max_restarts=-1)
