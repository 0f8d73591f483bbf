"""Tests of distcomm._runtime.init_forms: dist_init, DistContext and dist_mode over init and
finalize."""

from __future__ import annotations

import os
import warnings
from typing import Any

import pytest

import distcomm
from distcomm.errors import InvalidArgumentError


def test_dist_init_returns_rank_and_world_size() -> None:
    assert distcomm.dist_init() == (0, 1)
    assert distcomm.is_initialized()
    distcomm.dist_finalize()
    assert not distcomm.is_initialized()


def test_dist_init_rejects_a_negative_device_id() -> None:
    with pytest.raises(InvalidArgumentError, match=r"device_id=-1"):
        distcomm.dist_init(device_id=-1)
    assert not distcomm.is_initialized()


def test_dist_context_initialises_and_finalizes() -> None:
    with distcomm.DistContext() as ctx:
        assert distcomm.is_initialized()
        assert (ctx.rank, ctx.world_size) == (0, 1)
    assert not distcomm.is_initialized()


def test_dist_context_finalizes_when_the_block_raises() -> None:
    with pytest.raises(RuntimeError, match="boom"), distcomm.DistContext():
        assert distcomm.is_initialized()
        raise RuntimeError("boom")
    assert not distcomm.is_initialized()
    assert "RANK" not in os.environ


def test_dist_context_leaves_a_world_it_did_not_initialise() -> None:
    comm = distcomm.init()
    with distcomm.DistContext():
        assert distcomm.get_communicator() is comm
    assert distcomm.is_initialized()
    assert distcomm.get_communicator() is comm


def test_dist_mode_returns_the_value_and_finalizes() -> None:
    @distcomm.dist_mode
    def work(x: int) -> tuple[int, bool]:
        return x * 2, distcomm.is_initialized()

    assert work(21) == (42, True)
    assert not distcomm.is_initialized()
    assert work.__name__ == "work"


def test_dist_mode_finalizes_when_the_function_raises() -> None:
    @distcomm.dist_mode
    def fail() -> None:
        assert distcomm.is_initialized()
        raise KeyError("oops")

    with pytest.raises(KeyError, match="oops"):
        fail()
    assert not distcomm.is_initialized()


class BoundToGpu1:
    """What dist_init reads of rank 1's nccl communicator, bound to cuda:1 at init."""

    backend, rank, world_size = "nccl", 1, 2
    bound_device = "cuda:1"

    def __init__(self, torch: Any) -> None:
        pass


@pytest.mark.parametrize(("device_id", "warned"), [(None, False), (1, False), (0, True)])
def test_dist_init_leaves_a_gpu_backend_on_the_gpu_it_chose_at_init(
    device_id: int | None, warned: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """dist_init(device_id=0) on every rank of a nccl job: the current device must stay the
    communicator's (cuda:1 for rank 1), or tensors made on cuda:0 meet a communicator on cuda:1.
    CUDA and init are stand-ins (no GPU in CI)."""
    torch = pytest.importorskip("torch")
    from distcomm._runtime import init_forms

    current: list[int] = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "set_device", current.append)
    monkeypatch.setattr(init_forms, "init", lambda **_: BoundToGpu1(torch))
    monkeypatch.setattr(init_forms, "get_local_rank", lambda: 1)
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        assert distcomm.dist_init(device_id=device_id) == (1, 2)
    assert current == [1]
    told = [str(w.message) for w in said if issubclass(w.category, distcomm.DistcommWarning)]
    assert told == (
        [
            "dist_init(device_id=0): rank 1 stays on cuda:1, the GPU its 'nccl' communicator "
            "uses (one GPU per rank), not cuda:0. HINT: to choose it, pass "
            "init(device='cuda:N'), or set CUDA_VISIBLE_DEVICES."
        ]
        if warned
        else []
    )
    assert not warned or said[0].filename == __file__, "the warning points at the caller"
