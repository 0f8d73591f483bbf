"""The hooks' times on CUDA tensors include the device's work (``device_clock``).

CI has no GPU: tensors are CPU tensors that the arrays layer reports on ``cuda:0``, and
``torch.cuda.synchronize`` is a fake GPU with a fake clock (tests/support/fake_gpu.py), so the
tests see the order of synchronisations and clock readings.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator

import numpy as np
import pytest
import torch
from fake_gpu import FakeGpu

import distcomm
from distcomm.backend import BaseCommunicator
from distcomm.environment.info import LaunchInfo
from distcomm.fakelink import Fabric, world


@pytest.fixture
def comm() -> Iterator[BaseCommunicator]:
    """A world of 1 on fakelink: the hooks see its calls (answered locally)."""
    launch = LaunchInfo("single_node", 0, 1, 0, 1, 0, 1)
    yield world(Fabric(1), launch)


def test_a_blocking_call_on_a_cuda_tensor_is_timed_to_the_end_of_the_device_work(
    monkeypatch: pytest.MonkeyPatch, comm: BaseCommunicator
) -> None:
    """started is read once the work queued before the call is done, finished once the call's
    own is: each clock reading follows a synchronisation of the tensor's device."""
    gpu = FakeGpu(monkeypatch, work=1.0)
    events: list[distcomm.CollectiveEvent] = []
    with distcomm.add_hook(after=events.append):
        comm.all_reduce(gpu.tensor())
        comm.all_gather_into_tensor(gpu.tensor(4), gpu.tensor(4))
    waited = [("synchronize", "cuda:0"), ("clock", 1.0), ("synchronize", "cuda:0"), ("clock", 2.0)]
    assert gpu.log[:4] == waited
    assert [(e.op, e.device, e.started, e.finished) for e in events] == [
        ("all_reduce", "cuda:0", 1.0, 2.0),
        ("all_gather_into_tensor", "cuda:0", 3.0, 4.0),
    ]


def test_only_blocking_calls_on_cuda_tensors_synchronise(
    monkeypatch: pytest.MonkeyPatch, comm: BaseCommunicator
) -> None:
    """CPU arrays, objects and async calls (which a synchronisation would make blocking) read
    the host clock alone; numpy calls do so without torch (hidden from sys.modules here)."""
    gpu = FakeGpu(monkeypatch)
    events: list[distcomm.CollectiveEvent] = []
    with distcomm.add_hook(after=events.append):
        with monkeypatch.context() as hidden:
            hidden.delitem(sys.modules, "torch")
            comm.all_reduce(np.ones(4, dtype=np.float32))
        comm.all_reduce(torch.ones(4))
        comm.broadcast_object({"a": 1})
        comm.all_reduce(gpu.tensor(), async_op=True).wait()
        comm.all_reduce(gpu.tensor(), "sum", True).wait()  # async_op given by position
        comm.broadcast(gpu.tensor(), 0, True).wait()
        assert gpu.synchronised() == []
        comm.broadcast(gpu.tensor(), 0)
    assert gpu.synchronised() == ["cuda:0", "cuda:0"], "the blocking CUDA call waits, at both ends"
    assert [e.device for e in events] == ["cpu", "cpu", None, *["cuda:0"] * 4]


def test_a_call_that_raised_is_not_synchronised_at_the_end(
    monkeypatch: pytest.MonkeyPatch, comm: BaseCommunicator
) -> None:
    """A failed call may leave the device unusable: waiting for it could hang, so the time is
    taken to the error (after the synchronisation at the start)."""
    gpu = FakeGpu(monkeypatch)

    def refuse(event: distcomm.CollectiveEvent) -> None:
        raise RuntimeError("not now")

    events: list[distcomm.CollectiveEvent] = []
    with distcomm.add_hook(before=refuse, after=events.append), pytest.raises(RuntimeError):
        comm.all_reduce(gpu.tensor())
    assert gpu.log == [("synchronize", "cuda:0"), ("clock", 1.0), ("clock", 1.0)]
    assert isinstance(events[0].error, RuntimeError)
