"""distcomm.profile() and the flight recorder time a call on CUDA tensors to the end of the
device's work, not to the host's return.

CI has no GPU: tensors are CPU tensors that the arrays layer reports on ``cuda:0``, and
``torch.cuda.synchronize`` is a fake GPU that needs 1 s (on a fake clock) to finish what is
queued (tests/support/fake_gpu.py).
"""

from __future__ import annotations

import types
from collections.abc import Iterator
from pathlib import Path

import pytest
from fake_gpu import FakeGpu

import distcomm
from distcomm._runtime import flight_recorder
from distcomm.backend import BaseCommunicator
from distcomm.backend._pipeline import recording
from distcomm.environment.info import LaunchInfo
from distcomm.fakelink import Fabric, world


@pytest.fixture
def comm() -> Iterator[BaseCommunicator]:
    """A world of 1 on fakelink: the hooks see its calls (answered locally)."""
    launch = LaunchInfo("single_node", 0, 1, 0, 1, 0, 1)
    yield world(Fabric(1), launch)


def test_profile_counts_the_device_work_of_cuda_tensors(
    monkeypatch: pytest.MonkeyPatch, comm: BaseCommunicator
) -> None:
    """Three all-reduces on a GPU that needs 1 s for each: 3 s in total (the host returns at
    once; before the fix the profile said 0 s)."""
    gpu = FakeGpu(monkeypatch, work=1.0)
    x = gpu.tensor(256)
    with distcomm.profile(comm) as p:
        for _ in range(3):
            comm.all_reduce(x)
    (row,) = p["ops"]
    assert (row["op"], row["size"], row["count"], row["total_s"]) == ("all_reduce", 1024, 3, 3.0)
    assert row["algbw_GBps"] == pytest.approx(3 * 1024 / 3.0 / 1e9)


def test_flight_recorder_stamps_a_cuda_call_after_the_device_finished(
    monkeypatch: pytest.MonkeyPatch, comm: BaseCommunicator, tmp_path: Path
) -> None:
    """The entry's issued stamp is read once the work queued before the call is done, its
    completed stamp once the call's own is (the wall clock is faked to log when it is read)."""
    gpu = FakeGpu(monkeypatch)

    def wall() -> float:
        gpu.log.append(("wall", None))
        return 1e9 + gpu.clock

    monkeypatch.setattr(recording, "time", types.SimpleNamespace(time=wall))
    recorder = flight_recorder.FlightRecorder(10, str(tmp_path / "rank-0.json"), 0, 1)
    comm._record_into(recorder)
    try:
        comm.all_reduce(gpu.tensor())
    finally:
        recorder.stop()
    assert [what for what, _ in gpu.log] == [
        *("synchronize", "clock", "wall"),
        *("synchronize", "clock", "wall"),
    ]
    (entry,) = recorder.records()
    assert (entry["issued"], entry["completed"]) == (1e9 + 1.0, 1e9 + 2.0)
