"""distcomm-torch beyond the conformance suite: torch's default group, DDP, rendezvous, errors."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest
import torch
import torch.distributed as dist
from distcomm_torch.plugin import gloo_available, nccl_available

import distcomm
from distcomm.testing import WarmWorld


@pytest.fixture(autouse=True)
def no_torch_group() -> Iterator[None]:
    """Leave no torch default process group behind, whoever made it."""
    yield
    distcomm.finalize()
    if dist.is_initialized():
        dist.destroy_process_group()


# -- in this process (a world of 1: no network) -------------------------------------------------
def test_world_of_one_creates_torch_default_group_and_finalize_removes_it() -> None:
    comm = distcomm.init(backend="gloo")
    assert dist.is_initialized() and dist.get_backend() == "gloo"
    assert comm.native is dist.group.WORLD
    t = torch.arange(3.0)
    distcomm.all_reduce(t)
    assert t.tolist() == [0.0, 1.0, 2.0]
    distcomm.finalize()
    assert not dist.is_initialized()


def test_existing_torch_group_is_adopted_not_destroyed() -> None:
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    comm = distcomm.init()  # automatic: adopt the existing group
    assert comm.backend == "gloo"
    assert distcomm.get_backend() == "gloo"
    distcomm.finalize()
    assert dist.is_initialized(), "distcomm destroys only the groups it created"


def test_existing_group_of_another_backend_is_refused() -> None:
    from distcomm_torch.factory import create

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    launch = distcomm.detect_environment(environ={})
    with pytest.raises(distcomm.BackendUnavailableError, match="backend 'gloo' already exists"):
        create("nccl", launch)
    assert dist.get_backend() == "gloo", "the existing group is left alone"


def test_an_adopted_group_gives_the_world_its_rank_and_size() -> None:
    """distcomm's world over torch's existing default group is that group: its rank and size,
    whatever the launch said."""
    from distcomm_torch.factory import create

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    launch = distcomm.LaunchInfo("env", 1, 2, 1, 2, 0, 1)
    settled = create("gloo", launch).launch
    assert (settled.rank, settled.world_size) == (0, 1), settled
    assert (settled.local_rank, settled.local_world_size, settled.num_nodes) == (0, 1, 1), settled
    assert settled.sources["rank"] == "the existing torch default process group"


def test_reinit_after_finalize() -> None:
    for _ in range(2):
        comm = distcomm.init(backend="gloo")
        assert comm.world_size == 1 and dist.is_initialized()
        distcomm.finalize()


def test_timeout_reaches_the_communicator() -> None:
    comm = distcomm.init(backend="gloo", timeout=42)
    assert comm.timeout == 42


def test_numpy_arrays_are_reduced_in_place_without_copies() -> None:
    from distcomm.backend.arrays import as_torch

    a = np.arange(4, dtype=np.float32)
    assert as_torch(a).data_ptr() == a.ctypes.data, "torch.from_numpy shares the memory"
    distcomm.init(backend="gloo")
    distcomm.all_reduce(a)
    assert a.tolist() == [0.0, 1.0, 2.0, 3.0]


def test_bad_arguments_are_refused_before_any_rendezvous(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(distcomm.InvalidArgumentError, match=r"takes no options, got \['bogus'\]"):
        distcomm.init(backend="gloo", bogus=1)
    with pytest.raises(distcomm.InvalidArgumentError, match="device='cuda'"):
        distcomm.init(backend="gloo", device="cuda")
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    with pytest.raises(distcomm.BackendUnavailableError, match=r"MASTER_PORT is unknown.*HINT"):
        distcomm.init(backend="gloo")
    assert not dist.is_initialized()


def test_availability_reasons_on_this_machine() -> None:
    launch = distcomm.detect_environment(environ={})
    assert gloo_available(launch) == (True, "torch.distributed with Gloo: CPU tensors, any launch")
    available, reason = nccl_available(launch)
    assert available == torch.cuda.is_available()
    assert reason


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_nccl_without_cuda_says_why() -> None:
    with pytest.raises(distcomm.BackendUnavailableError, match="backend 'nccl' cannot run here"):
        distcomm.init(backend="nccl")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA: nccl runs on GPUs only")
def test_nccl_world_of_one_passes_every_check() -> None:
    from distcomm.testing.conformance import CHECKS, run_all

    comm = distcomm.init(backend="nccl")
    assert comm.backend == "nccl" and str(comm.engine.device).startswith("cuda")
    assert run_all() == list(CHECKS)


# -- several processes ---------------------------------------------------------------------------
def torch_view() -> dict[str, Any]:
    """What torch-native code sees inside a distcomm gloo rank."""
    t = torch.tensor([float(dist.get_rank() + 1)])
    dist.all_reduce(t)  # torch's own API, on the group distcomm created
    values = np.full(2, distcomm.get_rank(), dtype=np.int64)
    distcomm.all_reduce(values, op="max")
    return {
        "initialized": dist.is_initialized(),
        "backend": dist.get_backend(),
        "rank": (dist.get_rank(), distcomm.get_rank()),
        "sum": t.item(),
        "max": values.tolist(),
        "env": (os.environ["RANK"], os.environ["WORLD_SIZE"]),
    }


@pytest.mark.timeout(120)
def test_torch_native_code_shares_distcomm_group(warm_world: Callable[..., WarmWorld]) -> None:
    views = warm_world(3).run(torch_view, timeout=100)
    for rank, view in enumerate(views):
        assert view["initialized"] and view["backend"] == "gloo"
        assert view["rank"] == (rank, rank)
        assert view["sum"] == 6.0
        assert view["max"] == [2, 2]
        assert view["env"] == (str(rank), "3")


def ddp_steps(steps: int) -> list[float]:
    """A few DDP steps on a tiny model; gradients are averaged by DDP over distcomm's group."""
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 1))
    optimiser = torch.optim.SGD(model.parameters(), lr=0.1)
    generator = torch.Generator().manual_seed(100 + distcomm.get_rank())
    losses = []
    for _ in range(steps):
        x = torch.randn(16, 4, generator=generator)
        loss = ((model(x) - x.sum(dim=1, keepdim=True)) ** 2).mean()
        optimiser.zero_grad()
        loss.backward()
        optimiser.step()
        losses.append(distcomm.all_reduce(loss.item(), op="mean"))
    weights = model.module.weight.detach().clone()
    gathered = [torch.empty_like(weights) for _ in range(distcomm.get_world_size())]
    distcomm.all_gather(gathered, weights)
    assert all(torch.equal(weights, other) for other in gathered), "replicas diverged"
    return losses


@pytest.mark.timeout(120)
def test_ddp_trains_over_the_distcomm_group(warm_world: Callable[..., WarmWorld]) -> None:
    runs = warm_world(2).run(ddp_steps, 60, timeout=100)
    assert runs[0] == runs[1], "the averaged loss is the same on every rank"
    assert runs[0][-1] < runs[0][0] / 10


# -- nccl's device choice, with CUDA mocked (CI has no GPU; the logic still runs) ------------------
@pytest.fixture
def gpus(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Pretend 2 CUDA devices are visible; record set_device calls. A mock: CI has no GPU."""
    chosen: list[int] = []
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "set_device", chosen.append)
    return chosen


@pytest.mark.parametrize(
    ("local_rank", "device", "expected"),
    [
        (0, None, 0),
        (1, None, 1),
        (3, None, 1),
        (2, "cuda", 0),
        (0, "cuda:1", 1),
    ],
)
def test_nccl_device_follows_local_rank(
    gpus: list[int], local_rank: int, device: str | None, expected: int
) -> None:
    from distcomm_torch.factory import _cuda_device

    launch = distcomm.LaunchInfo("env", local_rank, 4, local_rank, 4, 0, 1)
    assert _cuda_device("nccl", launch, device) == torch.device("cuda", expected)
    assert gpus == [expected]


def test_nccl_device_errors(gpus: list[int], monkeypatch: pytest.MonkeyPatch) -> None:
    from distcomm_torch.factory import _cuda_device

    launch = distcomm.LaunchInfo("env", 0, 1, 0, 1, 0, 1)
    with pytest.raises(distcomm.InvalidArgumentError, match="only 2 CUDA device"):
        _cuda_device("nccl", launch, "cuda:5")
    with pytest.raises(distcomm.InvalidArgumentError, match="device='cpu' for CUDA work"):
        _cuda_device("nccl", launch, "cpu")
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    with pytest.raises(distcomm.BackendUnavailableError, match="no CUDA device is visible"):
        _cuda_device("nccl", launch, None)
    assert gpus == []
