"""distcomm.workspace: gathering through shared memory or a shared directory.

Multi-rank behaviour runs as scenarios on 4 thread-ranks, 4 gloo processes and ``mpirun -n 4``
(tests/support/multirank.py); every world's run is checked to leave no ``/dev/shm/distcomm-*``
behind, fault scenarios included.
"""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from jobs import job_environment
from multirank import outcome, scenario

import distcomm
from distcomm import workspace
from distcomm.errors import InvalidArgumentError, RankFailedError
from distcomm.testing import run_threads

BACKENDS = ["threads", "gloo", "mpirun"]


# -- world of one and bad input -----------------------------------------------------------------
def test_world_of_one_returns_owned_copies() -> None:
    array = np.arange(6.0).reshape(2, 3)
    tensor = torch.arange(4, dtype=torch.bfloat16)
    (got,) = workspace.gather_tensors(array)
    (got_t,) = workspace.gather_tensors(tensor, [0])
    array[0, 0] = tensor[0] = 99
    assert got.tolist() == [[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]] and got.shape == (2, 3)
    assert got_t.dtype == torch.bfloat16 and got_t.tolist() == [0, 1, 2, 3]
    config = {"layers": [1, 2]}
    (copy,) = workspace.gather_objects(config)
    assert copy == config and copy is not config


@pytest.mark.parametrize("ranks", [[], [1], [0, 0], ["0"], 0, [True]])
def test_bad_ranks_name_the_value_and_the_choices(ranks: Any) -> None:
    with pytest.raises(InvalidArgumentError, match=r"must be a non-empty list of distinct ranks"):
        workspace.gather_tensors(np.ones(1), ranks)


def test_not_a_tensor_is_refused() -> None:
    with pytest.raises(InvalidArgumentError, match=r"'list' is not a torch\.Tensor"):
        workspace.gather_tensors([1, 2])
    with pytest.raises(InvalidArgumentError, match=r"use distcomm\.workspace\.gather_objects"):
        workspace.gather_tensors(np.array([object()]))


def test_files_are_private_atomic_and_named_for_the_job(monkeypatch: pytest.MonkeyPatch) -> None:
    """Watch each write: the file is 0600, under a temporary name, the final name not there."""
    seen: list[tuple[str, int, bool]] = []
    real_write = os.write

    def watching_write(fd: int, data: Any) -> int:
        path = os.readlink(f"/proc/self/fd/{fd}")
        final = path.removesuffix(".part")
        seen.append((path, stat.S_IMODE(os.fstat(fd).st_mode), os.path.exists(final)))
        return real_write(fd, data)

    monkeypatch.setattr(workspace.os, "write", watching_write)

    def body() -> list[Any]:
        return workspace.gather_tensors(np.full(1000, distcomm.get_rank()))

    results = run_threads(body, 3, timeout=30)
    assert [r.tolist() for r in results[0]] == [[0] * 1000, [1] * 1000, [2] * 1000]
    assert len(seen) >= 2
    for path, mode, final_exists in seen:
        name = os.path.basename(path)
        assert name.startswith(f"distcomm-pid{os.getpid()}-c") and name.endswith(".part")
        assert mode == 0o600 and not final_exists
    assert workspace.live_files() == []


@pytest.mark.parametrize("shared", [False, True], ids=["shared-memory", "shared-directory"])
def test_private_on_creation_whatever_the_umask(
    shared: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Files 0600 and a folder made for a shared directory 0700 when created, under the most
    permissive umask (0): never created open and closed after."""
    modes: list[int] = []
    real_write = os.write

    def watching_write(fd: int, data: Any) -> int:
        modes.append(stat.S_IMODE(os.fstat(fd).st_mode))
        return real_write(fd, data)

    monkeypatch.setattr(workspace.os, "write", watching_write)
    folder = tmp_path / "new" / "exchange"
    previous = os.umask(0)
    try:

        def body() -> list[Any]:
            where = str(folder) if shared else None
            return workspace.gather_objects({"rank": distcomm.get_rank()}, directory=where)

        results = run_threads(body, 2, timeout=30)
    finally:
        os.umask(previous)
    assert results[0] == [{"rank": 0}, {"rank": 1}]
    assert modes and set(modes) == {0o600}, modes
    if shared:  # the folder and the one made above it
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700
        assert stat.S_IMODE(folder.parent.stat().st_mode) == 0o700
    assert workspace.live_files() == []


def test_cleanup_at_exit_and_on_sigterm(tmp_path: Path) -> None:
    """A file still live when the process ends is removed; SIGTERM still ends the process."""
    script = textwrap.dedent(
        """
        import os, sys, time
        from distcomm import workspace
        path = sys.argv[1]
        workspace._register(path)  # as _write does before creating a file
        open(path, "w").close()
        print("ready" if os.path.exists(path) else "not created", flush=True)
        if sys.argv[2] == "sleep":
            time.sleep(60)
        """
    )
    for how in ("exit", "sleep"):
        path = tmp_path / f"distcomm-test-{how}"
        proc = subprocess.Popen(
            [sys.executable, "-c", script, str(path), how],
            stdout=subprocess.PIPE,
            text=True,
            env=job_environment(),
        )
        assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
        if how == "sleep":
            assert path.exists()
            proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=30)
        proc.stdout.close()
        assert code == (-signal.SIGTERM if how == "sleep" else 0)
        assert not path.exists()


JOB = """
import sys
import numpy as np
from distcomm import workspace
from distcomm.testing import run_threads
import distcomm

job = int(sys.argv[1])

def body():
    for call in range(40):
        got = workspace.gather_tensors(np.full(64, job * 1000 + call * 10 + distcomm.get_rank()))
        if distcomm.get_rank() == 0:
            assert [g[0] for g in got] == [job * 1000 + call * 10 + r for r in range(3)], got
    return True

assert run_threads(body, 3, timeout=60) == [True] * 3
print("ok")
"""


def test_two_jobs_on_one_host_do_not_collide() -> None:
    jobs = [
        subprocess.Popen(
            [sys.executable, "-c", JOB, str(job)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=job_environment(),
        )
        for job in (1, 2)
    ]
    for proc in jobs:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0 and out == "ok\n", err


def test_a_thread_rank_that_fails_before_the_exchange_ends_the_others() -> None:
    def body() -> tuple[str, Any]:
        value: Any = "not a tensor" if distcomm.get_rank() == 2 else np.ones(3)
        try:
            return "ok", workspace.gather_tensors(value)
        except RankFailedError as exc:
            return "RankFailedError", exc.rank
        except InvalidArgumentError as exc:
            return "InvalidArgumentError", str(exc)[:20]

    results = run_threads(body, 3, timeout=30)
    assert results[0] == ("RankFailedError", 2) and results[1] == ("RankFailedError", 2)
    assert results[2][0] == "InvalidArgumentError"


# -- scenarios, on every backend ----------------------------------------------------------------
def _mine() -> Any:
    rank = distcomm.get_rank()
    if rank % 2:
        return torch.arange(6, dtype=torch.bfloat16).reshape(2, 3).t() + rank  # not contiguous
    return np.full((rank + 1,), rank, dtype=np.int16)


@scenario
def tensors_to_the_first_of_ranks(workdir: str) -> list[Any]:
    got = workspace.gather_tensors(_mine(), [2, 0, 3])  # rank 1 takes part, receives []
    during = workspace.live_files()
    shared = Path(workdir, "shared-dir")
    through_dir = workspace.gather_tensors(_mine(), [3, 2], directory=shared)
    left_in_dir = sorted(os.listdir(shared)) if shared.exists() else []
    return [_describe(got), during, _describe(through_dir), left_in_dir]


def _describe(values: list[Any]) -> list[tuple[str, str, list[Any]]]:
    return [(type(v).__name__, str(v.dtype), v.tolist()) for v in values]


@scenario
def objects_to_the_first_rank(workdir: str) -> list[Any]:
    rank = distcomm.get_rank()
    config = None if rank == 1 else {"rank": rank, "weights": np.arange(rank)}
    got = workspace.gather_objects(config)
    return [None if c is None else (c["rank"], c["weights"].tolist()) for c in got]


@scenario
def a_rank_fails_before_the_exchange(workdir: str) -> tuple[str, Any]:
    value: Any = "not a tensor" if distcomm.get_rank() == 1 else np.ones(3)
    try:
        return "ok", len(workspace.gather_tensors(value))
    except RankFailedError as exc:
        return "RankFailedError", exc.rank
    except InvalidArgumentError:
        return "InvalidArgumentError", distcomm.get_rank()


def _expected_tensor(rank: int) -> tuple[str, str, list[Any]]:
    if rank % 2:
        base = torch.arange(6, dtype=torch.bfloat16).reshape(2, 3).t() + rank
        return ("Tensor", "torch.bfloat16", base.tolist())
    return ("ndarray", "int16", [rank] * (rank + 1))


@pytest.mark.parametrize("backend", BACKENDS)
def test_tensors_reach_the_first_rank_in_order(backend: str, scenario_worlds: Any) -> None:
    results = scenario_worlds(backend)[outcome(tensors_to_the_first_of_ranks)]
    first = results[2]
    assert first[0] == [_expected_tensor(r) for r in (2, 0, 3)]
    assert first[1] == []  # nothing live once the call returned
    assert results[3][2] == [_expected_tensor(r) for r in (3, 2)]
    for rank in (0, 1, 3):
        assert results[rank][0] == []
    for rank in (0, 1):
        assert results[rank][2] == []
    assert all(r[3] == [] for r in results)  # the shared directory is empty again


@pytest.mark.parametrize("backend", BACKENDS)
def test_objects_reach_the_first_rank_with_none_entries(backend: str, scenario_worlds: Any) -> None:
    results = scenario_worlds(backend)[outcome(objects_to_the_first_rank)]
    assert results[0] == [(0, []), None, (2, [0, 1]), (3, [0, 1, 2])]
    assert results[1:] == [[]] * 3


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_failed_writer_makes_every_rank_raise(backend: str, scenario_worlds: Any) -> None:
    results = scenario_worlds(backend)[outcome(a_rank_fails_before_the_exchange)]
    assert results[1] == ("InvalidArgumentError", 1)
    assert [results[r] for r in (0, 2, 3)] == [("RankFailedError", 1)] * 3


@pytest.mark.parametrize("backend", BACKENDS)
def test_no_shared_memory_is_left_behind(backend: str, scenario_worlds: Any) -> None:
    """Every scenario of the world ran, faults included, and /dev/shm has no distcomm file."""
    assert scenario_worlds(backend)["leftover"] == []
