"""torch's backend ``"distcomm"`` (distcomm_torch.process_group) in this process: torch's
default group over a world of 1 (every engine kind: fakelink, and gloo, whose own group is then
made beside torch's), and the errors of the ways it cannot be made. Multi-rank: DDP, FSDP2,
DeviceMesh and torch's calls over mpi in mpi_tests/test_mpi_torch_under.py; gloo, zmq and mpi
under launchers in tests/test_torch_under.py."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
import torch.distributed as dist
from distcomm_torch import factory, process_group

import distcomm
from distcomm import LaunchInfo
from distcomm.errors import DistcommError, InvalidArgumentError
from distcomm.testing import run_threads


@pytest.fixture(autouse=True)
def nothing_left() -> Iterator[None]:
    distcomm.finalize()
    yield
    distcomm.finalize()
    if dist.is_initialized():
        dist.destroy_process_group()
        pytest.fail("a torch default group was left behind")


@pytest.mark.parametrize("backend", ["fakelink", "gloo"])
def test_a_world_of_one_runs_torch_s_calls_and_ddp_on_the_communicator(backend: str) -> None:
    comm = distcomm.init(backend=backend, torch_group="distcomm")
    assert dist.get_backend() == "distcomm" and comm.torch_group is dist.group.WORLD
    assert dist.group.WORLD.comm is comm  # type: ignore[union-attr]
    seen: list[str] = []
    with distcomm.add_hook(before=lambda e: seen.append(e.op)):
        x = torch.ones(3)
        dist.all_reduce(x)
        model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(2, 1))
        model(torch.ones(4, 2)).sum().backward()
    assert x.tolist() == [1.0, 1.0, 1.0]
    assert "all_reduce" in seen and "broadcast" in seen, f"the hooks saw {seen}"
    distcomm.finalize()
    assert not dist.is_initialized(), "finalize() ends torch's group over distcomm"


def test_the_program_s_own_torch_group_is_not_replaced() -> None:
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        for backend in ("fakelink", "gloo"):
            with pytest.raises(InvalidArgumentError) as info:
                distcomm.init(backend=backend, torch_group="distcomm")
            text = str(info.value)
            assert "exists already" in text and "destroy_process_group()" in text, text
            assert not distcomm.is_initialized()
        assert dist.get_backend() == "gloo", "the program's group was touched"
    finally:
        dist.destroy_process_group()


def test_init_process_group_before_distcomm_init_says_to_call_it() -> None:
    process_group.install()
    with pytest.raises(DistcommError, match=r"HINT: call distcomm.init\(\) first"):
        dist.init_process_group("distcomm", store=dist.HashStore(), rank=0, world_size=1)
    assert not dist.is_initialized()


def test_a_rank_or_size_that_disagrees_with_distcomm_s_world_is_refused() -> None:
    distcomm.init(backend="fakelink", torch_group=False)
    with pytest.raises(InvalidArgumentError, match=r"rank=1, world_size=2\) disagrees"):
        dist.init_process_group("distcomm", store=dist.HashStore(), rank=1, world_size=2)
    assert not dist.is_initialized()


def test_thread_ranks_are_refused_they_share_one_process() -> None:
    process_group.install()

    def body() -> str:
        try:
            dist.init_process_group(
                "distcomm", store=dist.HashStore(), rank=distcomm.get_rank(), world_size=2
            )
        except InvalidArgumentError as exc:
            return str(exc)
        return "made"

    said = run_threads(body, 2)
    assert all("threads of one process" in s for s in said), said
    assert not dist.is_initialized()


def test_nccl_is_refused_before_anything_is_made() -> None:
    launch = LaunchInfo("single_node", 0, 1, 0, 1, 0, 1)
    with pytest.raises(InvalidArgumentError, match="torch_group='auto' on nccl"):
        factory.create("nccl", launch, torch_group="distcomm")
    assert not dist.is_initialized()
