"""Tests of distcomm._runtime.doors: dist_init, DistContext and dist_mode over init and finalize."""

from __future__ import annotations

import os

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
