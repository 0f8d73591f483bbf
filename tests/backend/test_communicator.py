"""BaseCommunicator's contract with engine authors, beyond what the conformance suite runs."""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import pytest
from kit_engines import Idle, over

import distcomm
from distcomm.backend.specs import Capabilities
from distcomm.environment import LaunchInfo
from distcomm.fakelink import Fabric, world
from distcomm.testing import run_threads

LAUNCH = LaunchInfo("env", 0, 2, 0, 2, 0, 1)


def test_a_backend_must_move_bytes() -> None:
    with pytest.raises(TypeError, match="must include 'uint8'"):
        over(Idle(), backend="nobytes", capabilities=Capabilities(dtypes=frozenset({"float32"})))


def test_missing_primitive_names_backend_and_primitive() -> None:
    """An engine without a required method is refused when its communicator is made (kit API
    2; it was refused at the first call of the method)."""

    class Half(Idle):
        all_reduce = None

    with pytest.raises(
        TypeError,
        match=r"backend 'half': its engine \(.*Half\) lacks the required method\(s\) all_reduce ",
    ):
        over(Half(), backend="half", launch=LAUNCH)


def test_plain_tensor_reaches_the_primitive_without_a_copy() -> None:
    seen: list[Any] = []

    class Recorder(Idle):
        def all_reduce(self, tensor: Any, op: distcomm.ReduceOp, async_op: bool) -> None:
            seen.append(tensor)

    comm = over(Recorder(), backend="recorder", launch=LAUNCH)
    comm.debug = "off"  # the mismatch check's all-reduce would be seen first
    plain = np.ones(4, dtype=np.float32)
    comm.all_reduce(plain)
    strided = np.ones(8, dtype=np.float32)[::2]
    comm.all_reduce(strided)
    assert seen[0] is plain
    assert seen[1] is not strided and seen[1].flags.c_contiguous


def test_async_non_contiguous_result_is_there_when_is_completed_says_so() -> None:
    def body() -> list[float]:
        data = np.zeros(8, dtype=np.float32)
        view = data[::2]
        view[:] = distcomm.get_rank() + 1
        work = distcomm.all_reduce(view, async_op=True)
        while not work.is_completed():
            pass
        return data[::2].tolist()

    assert run_threads(body, 2) == [[3.0] * 4, [3.0] * 4]


def test_timed_out_wait_names_the_time_and_retires_the_communicator() -> None:
    def body() -> str:
        comm = distcomm.get_communicator()
        if comm.rank == 1:
            time.sleep(0.5)  # busy, not waiting in distcomm (a rank that left: a stall, below)
            return ""
        work = comm.irecv(np.zeros(1), src=1, tag=9)
        with pytest.raises(distcomm.DistTimeoutError) as info:
            work.wait(timeout=0.05)
        with pytest.raises(distcomm.DistcommError, match="can no longer be used: recv"):
            comm.barrier()
        return str(info.value)

    message = run_threads(body, 2)[0]
    assert "within 0.05 s" in message


def test_finalized_communicator_refuses_work() -> None:
    comm = world(Fabric(1), LaunchInfo("single_node", 0, 1, 0, 1, 0, 1))
    comm.finalize()
    with pytest.raises(distcomm.DistcommError, match="can no longer be used: finalized"):
        comm.all_reduce(np.ones(1))


def test_non_native_byte_order_is_refused_with_the_fix() -> None:
    def rank() -> None:
        swapped = np.arange(3, dtype=">f4" if np.little_endian else "<f4")
        with pytest.raises(distcomm.InvalidArgumentError, match="non-native byte order") as info:
            distcomm.all_reduce(swapped)
        assert "astype(x.dtype.newbyteorder('='))" in str(info.value)

    run_threads(rank, 2)
