"""A world of 1 that calls the engine (``world_of_one_shortcut = False``): how
scripts/gpu-check.sh makes one GPU run NCCL itself. Here on gloo, in this process."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch
import torch.distributed as dist

import distcomm


@pytest.fixture
def world() -> Iterator[Any]:
    comm = distcomm.init(backend="gloo")
    yield comm
    distcomm.finalize()
    if dist.is_initialized():
        dist.destroy_process_group()


def engine_calls(comm: Any, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The primitives ``comm`` hands to the engine from now on, by name."""
    calls: list[str] = []
    for name in ("_all_reduce", "_broadcast", "_all_gather_into", "_reduce_scatter", "_reduce"):
        primitive = getattr(comm, name)

        def recorded(*args: Any, _p: Any = primitive, _n: str = name) -> Any:
            calls.append(_n)
            return _p(*args)

        monkeypatch.setattr(comm, name, recorded)
    return calls


def test_by_default_a_world_of_one_leaves_the_engine_alone(
    world: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = engine_calls(world, monkeypatch)
    assert world.world_of_one_shortcut
    distcomm.all_reduce(torch.ones(3))
    assert calls == []


def test_without_the_shortcut_every_collective_reaches_the_engine_and_is_right(
    world: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = engine_calls(world, monkeypatch)
    world.world_of_one_shortcut = False
    assert not world.world_of_one_shortcut
    t = torch.arange(4.0)
    distcomm.all_reduce(t)
    distcomm.broadcast(t, 0)
    out = torch.zeros(4)
    distcomm.all_gather_into_tensor(out, t)
    distcomm.reduce_scatter_tensor(out, t)
    distcomm.reduce(t, 0)
    assert t.tolist() == out.tolist() == [0.0, 1.0, 2.0, 3.0]
    assert calls == ["_all_reduce", "_broadcast", "_all_gather_into", "_reduce_scatter", "_reduce"]
    assert distcomm.all_gather_object({"a": 1}) == [{"a": 1}]
    assert len(calls) == 6, "objects travel through the engine too"
    world.world_of_one_shortcut = True
    distcomm.all_reduce(t)
    assert len(calls) == 6, "the shortcut is back"
