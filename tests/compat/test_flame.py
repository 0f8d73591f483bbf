"""distcomm.compat.flame: flame's distributed_training, in this process and in real processes.

The workers are defined at the top level of this module, because each process imports them by
name. Every process imports torch (seconds each), so few tests start processes.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from jobs import children_left

import distcomm
from distcomm.compat import flame
from distcomm.errors import BackendNotFoundError, InvalidArgumentError, RankFailedError


@pytest.fixture(autouse=True)
def no_children_left() -> Iterator[None]:
    yield
    assert children_left() == []


# -- what the workers run -----------------------------------------------------------------------
def record(directory: str, tag: str) -> None:
    """Write what this worker sees to ``<directory>/<rank>.json``."""
    rank = distcomm.get_rank()
    report = {
        "tag": tag,
        "rank": rank,
        "world_size": distcomm.get_world_size(),
        "backend": distcomm.get_backend(),
        "pid": os.getpid(),
        "sum": distcomm.all_reduce(1),
        "local_rank": os.environ.get("LOCAL_RANK"),
    }
    Path(directory, f"{rank}.json").write_text(json.dumps(report))


def fail_on_rank_1(directory: str) -> None:
    """Once every rank has recorded its pid, rank 1 raises; the others wait in a barrier that
    rank 1 never joins."""
    Path(directory, f"{distcomm.get_rank()}.pid").write_text(str(os.getpid()))
    if distcomm.get_rank() == 1:
        deadline = time.monotonic() + 30
        while len(list(Path(directory).glob("*.pid"))) < distcomm.get_world_size():
            if time.monotonic() > deadline:
                break
            time.sleep(0.05)
        raise ValueError("rank 1 gives up")
    distcomm.barrier()


def reports(directory: Path) -> list[dict[str, Any]]:
    return [json.loads(path.read_text()) for path in sorted(directory.glob("*.json"))]


# -- options ------------------------------------------------------------------------------------
def test_dist_options_defaults_url_and_rank() -> None:
    options = flame.DistOptions()
    assert dataclasses.asdict(options) == {
        "dist": False,
        "rank_start": 0,
        "world_size": None,
        "dist_backend": "nccl",
        "dist_host": "127.0.0.1",
        "dist_port": None,
        "nprocs": None,
    }
    with pytest.raises(InvalidArgumentError, match="dist_port"):
        _ = options.dist_url
    options = flame.DistOptions(rank_start=4, dist_host="10.0.0.1", dist_port=29500)
    assert options.dist_url == "tcp://10.0.0.1:29500"
    assert (options.get_rank(0), options.get_rank(3)) == (4, 7)


def test_get_dist_options_parses_argv_ignores_the_rest_and_fills_a_port(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    argv = ["train.py", "--dist", "--rank_start", "2", "--world-size", "8", "--lr", "0.1"]
    argv += ["--dist-backend", "gloo", "--nprocs", "2", "--rank", "x", "data/"]
    monkeypatch.setattr(sys, "argv", argv)
    options = flame.get_dist_options()
    assert (options.dist, options.rank_start, options.world_size) == (True, 2, 8)
    assert (options.dist_backend, options.nprocs, options.dist_host) == ("gloo", 2, "127.0.0.1")
    assert isinstance(options.dist_port, int) and options.dist_port > 0
    monkeypatch.setattr(sys, "argv", ["train.py", "--rank-start", "1", "--dist-port", "1234"])
    options = flame.get_dist_options()
    assert (options.dist, options.rank_start, options.dist_port) == (False, 1, 1234)


def test_from_known_args_returns_the_unknown_args() -> None:
    options, unknown = flame.DistOptions.from_known_args(["--nprocs", "3", "--epochs", "5"])
    assert options == flame.DistOptions(nprocs=3)
    assert unknown == ["--epochs", "5"]


# -- errors before anything starts --------------------------------------------------------------
def test_an_unknown_backend_lists_the_valid_ones() -> None:
    options = flame.DistOptions(dist_backend="glo", nprocs=2)
    with pytest.raises(BackendNotFoundError, match=r"unknown backend 'glo'; valid: .*gloo"):
        flame.start_distributed_training(record, options)


def test_nccl_without_a_gpu_is_an_error_not_a_silent_return(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)  # what a CPU machine says
    with pytest.raises(InvalidArgumentError, match=r"--nprocs N.*--dist-backend gloo"):
        flame.start_distributed_training(record, flame.DistOptions(dist_backend="nccl"))


def test_rank_start_without_world_size_is_an_error() -> None:
    options = flame.DistOptions(dist_backend="gloo", rank_start=2, nprocs=2)
    with pytest.raises(InvalidArgumentError, match="--world-size"):
        flame.start_distributed_training(record, options)


def test_ranks_beyond_the_world_are_an_error() -> None:
    options = flame.DistOptions(dist_backend="gloo", rank_start=2, nprocs=2, world_size=3)
    with pytest.raises(InvalidArgumentError, match=r"ranks 2\.\.3 .* world_size=3"):
        flame.start_distributed_training(record, options)


def test_a_lambda_worker_is_refused_before_anything_starts() -> None:
    options = flame.DistOptions(dist_backend="gloo", nprocs=2)
    with pytest.raises(InvalidArgumentError, match=r"worker_fn=.* cannot be pickled.*HINT"):
        flame.start_distributed_training(lambda: None, options)


# -- in this process ----------------------------------------------------------------------------
@pytest.mark.timeout(120)
def test_one_process_runs_here_keeps_world_size_and_finalizes(tmp_path: Path) -> None:
    pytest.importorskip("distcomm_torch", reason="gloo comes with distcomm-torch")
    options = flame.DistOptions(dist_backend="gloo", nprocs=1)
    flame.start_distributed_training(record, options, args=(str(tmp_path), "here"))
    (report,) = reports(tmp_path)
    assert report["pid"] == os.getpid()
    assert (report["rank"], report["world_size"], report["backend"]) == (0, 1, "gloo")
    assert report["sum"] == 1
    assert not distcomm.is_initialized()
    assert options == flame.DistOptions(dist_backend="gloo", nprocs=1)  # not modified


def test_any_backend_one_process_by_default(tmp_path: Path) -> None:
    options = flame.DistOptions(dist_backend="FakeLink")
    flame.start_distributed_training(record, options, args=(str(tmp_path), "fake"))
    (report,) = reports(tmp_path)
    assert (report["backend"], report["world_size"], report["sum"]) == ("fakelink", 1, 1)
    assert report["pid"] == os.getpid()
    assert not distcomm.is_initialized()


def test_an_explicit_world_size_is_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[flame.DistOptions] = []

    def fake_init(proc_id: int, worker_fn: Any, options: flame.DistOptions, *args: Any) -> None:
        seen.append(options)

    monkeypatch.setattr(flame, "_init_process_group_fn", fake_init)
    options = flame.DistOptions(dist_backend="gloo", rank_start=3, nprocs=1, world_size=4)
    flame.start_distributed_training(record, options)
    (used,) = seen
    assert (used.world_size, used.rank_start, used.nprocs) == (4, 3, 1)
    assert used.get_rank(0) == 3 and used.dist_port is not None
    assert options.dist_port is None  # the caller's options are not modified


def test_start_training_without_dist_calls_the_worker_here(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(sys, "argv", ["train.py", "--epochs", "3"])
    calls: list[tuple[Any, ...]] = []
    flame.start_training(lambda *args: calls.append(args), args=(1, "a"))
    assert calls == [(1, "a")]
    assert not distcomm.is_initialized()


def test_init_cpu_process_group_initialises_gloo() -> None:
    pytest.importorskip("distcomm_torch", reason="gloo comes with distcomm-torch")
    flame.init_cpu_process_group(0, 1, flame.get_available_local_dist_url())
    assert distcomm.get_backend() == "gloo"
    assert (distcomm.get_rank(), distcomm.get_world_size()) == (0, 1)
    distcomm.finalize()


@pytest.mark.parametrize(
    "url", ["127.0.0.1:1234", "tcp://127.0.0.1", "tcp://:1234", "tcp://host:port", "env://"]
)
def test_init_cpu_process_group_refuses_a_malformed_url(url: str) -> None:
    with pytest.raises(InvalidArgumentError, match=r"is not a tcp://host:port url.*HINT"):
        flame.init_cpu_process_group(0, 1, url)
    assert not distcomm.is_initialized()


def test_get_available_local_dist_url() -> None:
    url = flame.get_available_local_dist_url()
    assert url.startswith("tcp://127.0.0.1:") and int(url.rsplit(":", 1)[1]) > 0


# -- in real processes --------------------------------------------------------------------------
@pytest.mark.timeout(120)
def test_three_processes_each_a_rank_of_gloo(tmp_path: Path) -> None:
    pytest.importorskip("distcomm_torch", reason="gloo comes with distcomm-torch")
    options = flame.DistOptions(dist=True, dist_backend="gloo", nprocs=3)
    flame.start_distributed_training(record, options, args=(str(tmp_path), "x"))
    found = reports(tmp_path)
    assert [r["rank"] for r in found] == [0, 1, 2]
    for report in found:
        assert (report["world_size"], report["backend"], report["sum"]) == (3, "gloo", 3)
        assert report["local_rank"] == str(report["rank"])
    pids = {report["pid"] for report in found}
    assert len(pids) == 3 and os.getpid() not in pids
    assert not distcomm.is_initialized()


@pytest.mark.timeout(120)
def test_a_worker_that_raises_ends_the_run_with_its_rank(tmp_path: Path) -> None:
    pytest.importorskip("distcomm_torch", reason="gloo comes with distcomm-torch")
    options = flame.DistOptions(dist_backend="gloo", nprocs=2)
    with pytest.raises(RankFailedError) as info:
        flame.start_distributed_training(fail_on_rank_1, options, args=(str(tmp_path),))
    assert info.value.rank == 1
    assert "ValueError: rank 1 gives up" in info.value.traceback
    assert "rank 1 of 2 failed" in str(info.value)
    pids = [int(path.read_text()) for path in tmp_path.glob("*.pid")]
    assert len(pids) == 2
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
