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


def test_the_communicators_state_stays_in_slots_after_every_kind_of_call() -> None:
    """CPython 3.11 stops its fast attribute and method look-ups for an object whose instance
    ``__dict__`` holds more than 30 names, which costs a planned call about a third of its time
    (docs/architecture.md): after collectives, messages, object collectives, a coalesced
    all-reduce, hooks, the flight recorder and a group, a communicator's ``__dict__`` holds no
    more than the engine's bound methods and a few late names, and its state is in slots."""
    from distcomm._runtime.flight_recorder import FlightRecorder

    def body() -> tuple[list[str], bool]:
        comm: Any = distcomm.get_communicator()
        rank, n = comm.rank, comm.world_size
        comm._record_into(FlightRecorder(100, "/nonexistent/never-dumped", rank, n))
        handle = distcomm.add_hook(after=lambda event: None)
        try:
            x = np.ones(4, np.float32)
            for _ in range(3):
                comm.all_reduce(x)
                comm.broadcast(x, 0)
                comm.all_gather_object(rank)
                comm.send(x, (rank + 1) % n)
                comm.recv(x, (rank - 1) % n)
            distcomm.all_reduce_coalesced([x, np.ones(3, np.int64)])
            comm.new_group(list(range(n))).all_reduce(x)
            comm.barrier()
        finally:
            handle.remove()
        slot = getattr(type(comm), "seq", None)  # a slot's descriptor on the class
        return sorted(vars(comm)), type(slot).__name__ == "member_descriptor"

    for names, slotted in run_threads(body, 2):
        assert slotted, "seq is not a slot: the communicator's state moved to its __dict__"
        assert len(names) <= 26, f"{len(names)} names in a communicator's __dict__: {names}"
