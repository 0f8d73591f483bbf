"""Tests of distcomm.fakelink.plugin: the ``fakelink`` backend's factory and availability."""

from __future__ import annotations

import numpy as np
import pytest

import distcomm
from distcomm.backend import Registry
from distcomm.backend.communicator import world_over
from distcomm.environment import LaunchInfo
from distcomm.errors import BackendUnavailableError, InvalidArgumentError
from distcomm.fakelink import FakeLinkEngine
from distcomm.fakelink.plugin import create, distcomm_register_backends, is_available

ALONE = LaunchInfo("single_node", 0, 1, 0, 1, 0, 1)
PAIR = LaunchInfo("env", 1, 2, 1, 2, 0, 1)


def test_fakelink_rejects_unknown_options() -> None:
    with pytest.raises(InvalidArgumentError, match=r"takes no options, got \['bogus'\]"):
        distcomm.init(bogus=1)
    assert not distcomm.is_initialized()


def test_create_makes_a_world_of_one_with_the_timeout() -> None:
    """The factory makes the engine; the kit makes the world over it (as ``init`` does)."""
    registry = Registry()
    distcomm_register_backends(registry)
    engine = create(ALONE, timeout=7.5, device="cuda")
    assert isinstance(engine, FakeLinkEngine)
    comm = world_over(registry.backends["fakelink"], engine, ALONE, 7.5)
    assert comm.engine is engine and comm.backend == "fakelink"
    assert (comm.rank, comm.world_size, comm.timeout) == (0, 1, 7.5)
    assert comm.launch is ALONE
    data = np.arange(3.0)
    comm.all_reduce(data)
    assert data.tolist() == [0.0, 1.0, 2.0], "a world of 1 reduces to itself"
    comm.finalize()


def test_a_launched_larger_world_is_unavailable_with_the_reason() -> None:
    assert is_available(ALONE) == (True, "in-process world of 1")
    available, reason = is_available(PAIR)
    assert not available
    assert "in-process only" in reason and "env launch says world_size=2" in reason
    with pytest.raises(BackendUnavailableError, match="fakelink: in-process only") as info:
        create(PAIR)
    assert (info.value.backend, info.value.reason) == ("fakelink", reason)
