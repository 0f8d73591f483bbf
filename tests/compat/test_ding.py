"""distcomm.compat.ding: DI-engine's linklink_dist_helper, at world 1 and on several ranks."""

from __future__ import annotations

import json
import sys
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from jobs import run_job

import distcomm
from distcomm.compat import ding
from distcomm.testing import WarmWorld, run_threads

HERE = Path(__file__).resolve().parent


def test_not_initialised_is_rank_0_of_1() -> None:
    assert (ding.get_rank(), ding.get_world_size()) == (0, 1)


def test_world_of_one() -> None:
    data = np.array([3.0, 5.0])
    ding.allreduce(data)  # the mean of one rank: unchanged
    ding.broadcast(data, 0)  # a no-op, where DI-engine raised under FakeLink
    work = ding.allreduce_async(data, "max")
    ding.synchronize()
    assert work.is_completed() and data.tolist() == [3.0, 5.0]
    assert ding.get_group(1).world_size == 1


def test_unknown_op_names_itself() -> None:
    with pytest.raises(ding.UnsupportedOpError, match="'min' is not supported") as info:
        ding.allreduce(np.ones(1), "min")
    assert isinstance(info.value, ValueError) and isinstance(info.value, KeyError)
    assert "valid: 'sum'" in str(info.value)
    with pytest.raises(KeyError):
        ding.allreduce_async(np.ones(1), op="SUM")


def test_dist_init_context_and_mode() -> None:
    assert ding.dist_init("slurm") == (0, 1)  # no CUDA here: no device, no division by zero
    assert distcomm.is_initialized()
    ding.dist_finalize()
    assert not distcomm.is_initialized()
    with ding.DistContext():
        assert distcomm.is_initialized()
    assert not distcomm.is_initialized()

    @ding.dist_mode
    def work(x: int) -> int:
        assert distcomm.is_initialized()
        return x * 2

    assert work(21) == 42 and not distcomm.is_initialized()

    @ding.dist_mode
    def fails() -> None:
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        fails()
    assert not distcomm.is_initialized()  # finalized although it raised


def test_unequal_split_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="6 ranks do not split into 4 equal groups"):
        ding.simple_group_split(6, 0, 4)
    with pytest.raises(ValueError, match="does not split into groups of 3"):
        ding.get_group(3)  # a world of 1


def ranks(world: int) -> dict[str, Any]:
    rank = ding.get_rank()
    seen: dict[str, Any] = {"rank": rank, "world": ding.get_world_size()}
    grad = np.full(3, float(rank))
    ding.allreduce(grad)  # 'sum' leaves the mean
    seen["mean"] = grad.tolist()
    top = np.array([float(rank)])
    ding.allreduce(top, "max")
    seen["max"] = top.item()
    pending = [np.full(2, float(rank) * k) for k in (1, 2)]
    for p in pending:
        ding.allreduce_async(p)
    ding.synchronize()
    seen["async_means"] = [p.tolist() for p in pending]
    value = np.full(2, float(rank))
    ding.broadcast(value, world - 1)
    seen["bcast"] = value.tolist()
    group = ding.get_group(2)
    seen["group"] = (group.world_size, group.rank, list(group.global_ranks))
    ones = np.ones(1)
    distcomm.all_reduce(ones, group=group)
    seen["group_sum"] = ones.item()
    again = np.ones(1)
    from distcomm.compat import linklink

    linklink.allreduce(again, group_idx=group)  # usable as linklink's group_idx too
    seen["as_group_idx"] = again.item()
    return seen


def check(results: list[dict[str, Any]], world: int) -> None:
    mean = sum(range(world)) / world
    for rank, seen in enumerate(results):
        assert (seen["rank"], seen["world"]) == (rank, world)
        assert seen["mean"] == [mean] * 3
        assert seen["max"] == world - 1
        assert seen["async_means"] == [[mean] * 2, [2 * mean] * 2]
        assert seen["bcast"] == [float(world - 1)] * 2
        first = rank - rank % 2
        assert seen["group"] == (2, rank % 2, [first, first + 1])
        assert seen["group_sum"] == 2 and seen["as_group_idx"] == 2


def test_helpers_on_thread_ranks() -> None:
    check(run_threads(ranks, 4, 4), 4)


@pytest.mark.timeout(200)
def test_helpers_on_gloo_processes(warm_world: Callable[..., WarmWorld]) -> None:
    check(warm_world(4).run(ranks, 4), 4)


MPI_RANK = """
import json, sys
sys.path[:0] = [sys.argv[1], sys.argv[1] + "/../support"]  # test_ding, and jobs.py it imports
import distcomm, test_ding

comm = distcomm.init()
seen = test_ding.ranks(comm.world_size)
seen["backend"] = comm.backend
distcomm.finalize()
with open(f"{sys.argv[2]}/rank-{seen['rank']}.json", "w") as out:
    json.dump(seen, out)
"""


@pytest.mark.timeout(200)
def test_helpers_on_mpi(mpirun: str, tmp_path: Path) -> None:
    script = tmp_path / "rank.py"
    script.write_text(MPI_RANK)
    done = run_job([mpirun, "-n", "4", sys.executable, str(script), str(HERE), str(tmp_path)])
    assert done.returncode == 0, done.stdout + done.stderr
    results = [json.loads((tmp_path / f"rank-{r}.json").read_text()) for r in range(4)]
    assert {seen.pop("backend") for seen in results} == {"mpi"}
    for seen in results:
        seen["group"] = tuple(seen["group"])
    check(results, 4)


def test_sum_of_integers_cannot_hold_the_mean() -> None:
    with pytest.raises(distcomm.InvalidArgumentError, match="dtype 'int64'"):
        ding.allreduce(np.ones(2, dtype=np.int64))


class GpuComm:
    """What dist_init reads of a nccl communicator bound to ``cuda:index`` (no GPU in CI)."""

    backend = "nccl"

    def __init__(self, torch: Any, index: int) -> None:
        self.bound_device = f"cuda:{index}"
        self.rank = index


@pytest.mark.parametrize(
    ("method", "device_id", "warned"), [("slurm", 0, False), ("single_node", 0, True)]
)
def test_dist_init_keeps_the_gpu_of_a_gpu_backends_communicator(
    method: str, device_id: int, warned: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rank 1 of a node whose nccl communicator uses cuda:1: DI-engine's dist_init set cuda:0
    after init ("single_node", device_id=0 on every rank), away from the communicator's GPU.
    CUDA and the communicator are stand-ins (no GPU in CI); the world is a real world of 1."""
    torch = pytest.importorskip("torch")
    current: list[int] = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "set_device", current.append)
    monkeypatch.setattr(distcomm, "get_rank", lambda: 1)
    monkeypatch.setattr(distcomm, "get_communicator", lambda: GpuComm(torch, 1))
    try:
        with warnings.catch_warnings(record=True) as said:
            warnings.simplefilter("always")
            ding.dist_init(method, device_id)
    finally:
        ding.dist_finalize()
    assert current == [1], "the rank left its communicator's GPU"
    told = [str(w.message) for w in said if issubclass(w.category, distcomm.DistcommWarning)]
    if warned:
        assert len(told) == 1 and "rank 1 stays on cuda:1" in told[0] and "not cuda:0" in told[0]
    else:
        assert told == [], told
