"""nccl on first contact with a GPU, tested where CI runs (no GPU, a CPU build of torch).

What cannot run here is mocked, each test says what and why: torch's Work objects (their texts
are torch's own, copied from its sources: c10d's Work.cpp and ProcessGroupNCCL.cpp, Gloo's
unbound_buffer.cc), ``torch.cuda``'s device count, and ``init_process_group`` / ``barrier``,
recorded and then run on Gloo. Everything else (distcomm's Works, the kit's communicators around
the torch engines, torch's default group and its sub-groups) is real, in a world of 1.
"""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Iterator
from typing import Any

import pytest
import torch
import torch.distributed as dist
from distcomm_torch.communicator import TorchEngine, TorchRequest, watchdog_timeout
from distcomm_torch.factory import create
from distcomm_torch.plugin import GLOO, NCCL

import distcomm
from distcomm.backend import BaseCommunicator, EngineWork
from distcomm.backend.work import retained
from distcomm.errors import DistcommWarning, DistTimeoutError, EngineError, InvalidArgumentError

MS = datetime.timedelta(milliseconds=1)
WORLD_OF_ONE = distcomm.LaunchInfo("env", 0, 1, 0, 1, 0, 1)

#: Timeout texts of torch 2.13's engines, as its Work.wait() raises them (origin: text).
TIMEOUTS = {
    # c10d/Work.cpp, Work::wait(timeout) (Gloo's collectives): "Operation timed out!"
    "work-wait": "Operation timed out!",
    # gloo/transport/tcp/unbound_buffer.cc, waitRecv / waitSend (seen here with torch 2.13)
    "gloo-recv": "[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:78]"
    " Timed out waiting 1500ms for recv operation to complete",
    "gloo-send": "[/pytorch/third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:129] Timed out "
    "waiting 1800000ms for send operation to complete",
    # gloo: context_->signalException(...) on every pair once an operation timed out (seen here)
    "gloo-pair": "Application timeout caused pair closure",
    # ProcessGroupNCCL.cpp, WorkNCCL::checkTimeout (the watchdog, and wait(timeout)); the
    # Work's logPrefix() is "[Rank N] " and operator<< prints WorkNCCL(...)
    "nccl-watchdog": "[Rank 0] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=5, "
    "OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for 600001 milliseconds "
    "before timing out.",
}
#: Texts of failures that are not timeouts.
FAILURES = {
    "gloo-peer-gone": "[../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by "
    "peer [127.0.0.1]:62955",
    "nccl-error": "NCCL error in: ../torch/csrc/distributed/c10d/NCCLUtils.cpp:77, unhandled "
    "system error (run with NCCL_DEBUG=INFO for details), NCCL version 2.21.5",
}


class NeverReturns(BaseException):
    """What a real torch wait would do here: block forever (a test cannot)."""


class FakeTorchWork:
    """A torch Work as c10d's binding shows it: still running, or ``failed`` already (the
    engine's verdict is in); ``wait`` raises ``error`` once the engine gives up.

    A mock: a real pending NCCL Work needs a GPU, and a real pending Gloo one a second process.
    torch truncates a timedelta to whole milliseconds, and 0 ms is its kNoTimeout: a running
    Gloo Work is then waited for until it completes, and NCCL only makes the current stream
    wait and returns. NCCL calls a failed Work completed.
    """

    def __init__(self, error: BaseException, *, nccl: bool = False, failed: bool = False) -> None:
        self.error, self.nccl, self.failed = error, nccl, failed
        self.waits: list[datetime.timedelta] = []

    def is_completed(self) -> bool:
        return self.nccl and self.failed

    def wait(self, timeout: datetime.timedelta = datetime.timedelta(0)) -> bool:
        self.waits.append(timeout)
        if timeout // MS == 0 and not self.failed:  # torch's kNoTimeout, on a running Work
            if self.nccl:
                return True
            raise NeverReturns
        raise self.error


def engine_error(text: str) -> RuntimeError:
    """The exception torch raises with ``text``: DistBackendError from NCCL, else RuntimeError."""
    return dist.DistBackendError(text) if "NCCL" in text else RuntimeError(text)


@pytest.fixture(autouse=True)
def no_torch_group() -> Iterator[None]:
    """Leave no torch default process group behind."""
    yield
    distcomm.finalize()
    if dist.is_initialized():
        dist.destroy_process_group()


def world(name: str, timeout: float, **options: Any) -> BaseCommunicator:
    """The world communicator of backend ``name``, a world of 1, as ``init`` makes it: the
    kit's communicator around the factory's engine."""
    capabilities = {"gloo": GLOO, "nccl": NCCL}[name]
    engine = create(name, WORLD_OF_ONE, timeout=timeout, **options)
    return BaseCommunicator(
        engine,
        backend=name,
        capabilities=capabilities,
        rank=0,
        world_size=1,
        launch=WORLD_OF_ONE,
        timeout=timeout,
    )


def torch_work(fake: FakeTorchWork, comm: BaseCommunicator, op: str, seq: int) -> EngineWork:
    """The Work the torch engine of ``comm`` hands out for torch's Work ``fake``."""
    return EngineWork(comm, TorchRequest(fake, comm.engine), op=op, seq=seq)


@pytest.fixture
def gloo() -> BaseCommunicator:
    """A real gloo communicator, a world of 1 (it owns torch's default group)."""
    return world("gloo", timeout=30.0)


# -- 5: torch's timeout texts ----------------------------------------------------------------------
@pytest.mark.parametrize(
    ("text", "expected"),
    [(text, DistTimeoutError) for text in TIMEOUTS.values()]
    + [(text, EngineError) for text in FAILURES.values()],
    ids=[*TIMEOUTS, *FAILURES],
)
@pytest.mark.parametrize("timeout", [None, 5.0], ids=["wait()", "wait(5)"])
def test_torch_timeouts_raise_dist_timeout_error_and_retire_the_communicator(
    gloo: BaseCommunicator, text: str, expected: type[Exception], timeout: float | None
) -> None:
    """Every timeout text of torch's Gloo and NCCL ends a wait with DistTimeoutError, and the
    communicator is retired (NCCL's watchdog has aborted it, Gloo has closed its pairs); other
    failures stay EngineError. The torch Work is mocked (FakeTorchWork: no GPU, one process)."""
    fake = FakeTorchWork(engine_error(text), nccl="NCCL" in text, failed=True)
    work = torch_work(fake, gloo, op="all_reduce", seq=3)
    with pytest.raises(expected) as caught:
        work.wait(timeout)
    assert gloo.unusable is not None
    if expected is DistTimeoutError:
        assert "all_reduce (operation #3)" in str(caught.value)
        assert "timed out after" in gloo.unusable
        with pytest.raises(distcomm.DistcommError, match="can no longer be used"):
            gloo.all_reduce(torch.ones(1))


def test_a_timed_out_nccl_work_is_not_taken_for_completed(gloo: BaseCommunicator) -> None:
    """NCCL says "completed" of a Work its watchdog timed out: is_completed() must raise that
    timeout, not report success (the result was never written). torch's Work is mocked."""
    fake = FakeTorchWork(engine_error(TIMEOUTS["nccl-watchdog"]), nccl=True, failed=True)
    work = torch_work(fake, gloo, op="all_reduce", seq=4)
    with pytest.raises(DistTimeoutError, match=r"all_reduce \(operation #4\)"):
        work.is_completed()
    assert gloo.unusable is not None and work in retained()


# -- 6: no timeout reaches torch as zero -----------------------------------------------------------
@pytest.mark.parametrize("timeout", [0.0, 0.0004, 1e-9])
def test_a_tiny_wait_timeout_reaches_torch_as_one_millisecond(
    gloo: BaseCommunicator, timeout: float
) -> None:
    """Work.wait(0) or a fraction of a millisecond gives torch 1 ms, never its 0 ms "no
    timeout" (on which Gloo waits forever). torch's pending Work is mocked: one process has no
    peer to leave a real one pending."""
    fake = FakeTorchWork(engine_error(TIMEOUTS["work-wait"]))
    work = torch_work(fake, gloo, op="barrier", seq=1)
    with pytest.raises(DistTimeoutError):
        work.wait(timeout)
    assert fake.waits == [MS]


def test_finalize_keeps_a_group_whose_nccl_work_has_not_completed(
    gloo: BaseCommunicator,
) -> None:
    """finalize() of a retired communicator gives its pending Works no time (0 s): on NCCL that
    must not become torch's "no timeout", whose wait returns at once, taken for completion, and
    the group destroyed under running kernels. Kept instead, with a warning. torch's Work is
    mocked (an NCCL one, pending: FakeTorchWork(nccl=True)); the communicator is gloo's."""
    fake = FakeTorchWork(engine_error(TIMEOUTS["nccl-watchdog"]), nccl=True)
    work = torch_work(fake, gloo, op="all_reduce", seq=1)
    gloo._pending.add(work)
    gloo.unusable = "all_reduce (operation #1) failed: a peer went away"
    with pytest.warns(DistcommWarning, match="1 operation"):
        gloo.finalize()
    assert fake.waits == [MS]
    assert dist.is_initialized(), "a group with work in flight is not destroyed"
    assert gloo in retained() and work in retained()


# -- 2 and 10: nccl's device, with CUDA mocked and NCCL replaced by Gloo ---------------------------
@dataclasses.dataclass
class Calls:
    """What torch.distributed was asked (and torch's default group's binding at the time)."""

    init: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    new_group: list[tuple[dict[str, Any], Any]] = dataclasses.field(default_factory=list)
    barrier: list[tuple[tuple[Any, ...], dict[str, Any]]] = dataclasses.field(default_factory=list)


class DoneWork:
    """A completed torch Work (what a mocked barrier returns)."""

    def is_completed(self) -> bool:
        return True

    def wait(self, timeout: datetime.timedelta = datetime.timedelta(0)) -> bool:
        return True


@pytest.fixture
def nccl(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[BaseCommunicator, Calls]]:
    """distcomm's nccl communicator on cuda:1, a world of 1, and what torch was asked.

    Mocked, as CI has no GPU and this torch no NCCL: 2 CUDA devices (``torch.cuda``), and
    ``init_process_group``, which records its arguments, creates a Gloo group instead and binds
    it to ``device_id`` as torch does; ``new_group`` is recorded and then runs for real.
    """
    calls = Calls()
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "set_device", lambda index: None)
    real_init, real_new_group = dist.init_process_group, dist.new_group

    def init_process_group(backend: str, **kwargs: Any) -> None:
        calls.init.append({"backend": backend, **kwargs})
        device = kwargs.pop("device_id", None)
        real_init("gloo", **kwargs)
        dist.group.WORLD.bound_device_id = device  # type: ignore[union-attr]

    def new_group(*args: Any, **kwargs: Any) -> Any:
        calls.new_group.append((kwargs, dist.group.WORLD.bound_device_id))  # type: ignore[union-attr]
        return real_new_group(*args, **kwargs)

    monkeypatch.setattr(dist, "init_process_group", init_process_group)
    monkeypatch.setattr(dist, "new_group", new_group)
    comm = world("nccl", timeout=0.0004, device="cuda:1")
    yield comm, calls
    if dist.is_initialized():
        dist.group.WORLD.bound_device_id = None  # type: ignore[union-attr]


def test_nccl_binds_torch_default_group_to_its_device(
    nccl: tuple[BaseCommunicator, Calls],
) -> None:
    """init_process_group gets device_id=cuda:N, distcomm's device (torch's own checks and eager
    NCCL start then apply). Mocked: CUDA, and init_process_group (recorded, then Gloo)."""
    comm, calls = nccl
    [init] = calls.init
    assert init["backend"] == "nccl" and init["device_id"] == torch.device("cuda", 1)
    assert comm.engine.device == torch.device("cuda", 1)


def test_every_nccl_sub_communicator_has_its_parents_device(
    nccl: tuple[BaseCommunicator, Calls],
) -> None:
    """new_group, split (of a group too) and adopt: all on the parent's device. Mocked: CUDA,
    and init_process_group (recorded, then Gloo); the groups are real."""
    comm, _ = nccl
    group = comm.new_group([0])
    assert isinstance(group, BaseCommunicator) and isinstance(group.engine, TorchEngine)
    split = group.split(0)
    assert isinstance(split, BaseCommunicator) and isinstance(split.engine, TorchEngine)
    adopted = comm.adopt(dist.new_group([0]))
    assert isinstance(adopted, BaseCommunicator) and isinstance(adopted.engine, TorchEngine)
    cuda1 = torch.device("cuda", 1)
    devices = (group.engine.device, split.engine.device, adopted.engine.device)
    assert devices == (cuda1, cuda1, cuda1)
    bound = {c.bound_device for c in (comm, group, split, adopted)}
    assert bound == {"cuda:1"}, "tensors on another GPU are refused on every one"


def test_only_nccl_groups_every_rank_makes_are_split_from_the_bound_group(
    nccl: tuple[BaseCommunicator, Calls],
) -> None:
    """With the default group bound to a GPU, torch splits every new group from it
    (ncclCommSplit, which every rank must call). Groups that only some ranks make (a group of a
    group, with use_local_synchronization) and Gloo groups (non-members split, members do not)
    are made without the binding, restored after. Mocked: CUDA, and init_process_group
    (recorded, then Gloo bound as torch binds); new_group runs for real, recorded."""
    comm, calls = nccl
    cuda1 = torch.device("cuda", 1)
    assert calls.new_group == [({"backend": "gloo", "timeout": MS}, None)], "the world's side"
    calls.new_group.clear()
    comm.new_group([0])  # every rank of the world makes it
    comm.engine._new_groups((0,), local=True)  # only its members make it
    seen = [
        (kwargs.get("backend"), kwargs["use_local_synchronization"], bound)
        for kwargs, bound in calls.new_group
    ]
    assert seen == [
        (None, False, cuda1),
        ("gloo", False, None),
        (None, True, None),
        ("gloo", True, None),
    ]
    assert dist.group.WORLD.bound_device_id == cuda1  # type: ignore[union-attr]


def test_every_timeout_torch_gets_from_nccl_is_at_least_a_millisecond(
    nccl: tuple[BaseCommunicator, Calls],
) -> None:
    """A communicator timeout of 0.4 ms reaches the Gloo side groups as 1 ms, not 0 ms ("no
    timeout"), and the NCCL groups 30 s later (finding 8: torch's watchdog, which ends the
    process at the group's timeout, comes after distcomm's deadline, its diagnosis and its
    dump). Mocked: CUDA, and init_process_group (recorded, then Gloo)."""
    comm, calls = nccl
    comm.new_group([0])
    timeouts = [calls.init[0]["timeout"], *(kwargs["timeout"] for kwargs, _ in calls.new_group)]
    later = datetime.timedelta(milliseconds=30001)
    assert timeouts == [later, MS, later, MS], "init, the world's side, a group, its side"


def test_torch_nccl_watchdog_waits_longer_than_distcomm() -> None:
    """distcomm's timeout plus max(30 s, 10 %), in whole milliseconds."""
    assert watchdog_timeout(10.0) == datetime.timedelta(seconds=40)
    assert watchdog_timeout(1800.0) == datetime.timedelta(seconds=1980)


def test_nccl_barrier_runs_on_the_communicators_device(
    nccl: tuple[BaseCommunicator, Calls], monkeypatch: pytest.MonkeyPatch
) -> None:
    """barrier passes device_ids=[N] (else torch picks the current device, or rank modulo the
    device count), on the world and on a group. Mocked: CUDA, init_process_group, and
    dist.barrier (recorded; a Gloo barrier has no device to choose)."""
    comm, calls = nccl

    def barrier(*args: Any, **kwargs: Any) -> DoneWork:
        calls.barrier.append((args, kwargs))
        return DoneWork()

    group = comm.new_group([0])
    assert isinstance(group, BaseCommunicator) and isinstance(group.engine, TorchEngine)
    monkeypatch.setattr(dist, "barrier", barrier)
    for each in (comm, group):
        work = each.engine.barrier(async_op=False)
        assert work is not None and work.wait() is True
    assert calls.barrier == [
        ((None, True), {"device_ids": [1]}),
        ((group.native, True), {"device_ids": [1]}),
    ]


# -- 9: tags ---------------------------------------------------------------------------------------
def test_nccl_refuses_a_tag_gloo_matches_it(nccl: tuple[BaseCommunicator, Calls]) -> None:
    """ProcessGroupNCCL ignores tags: nccl's capabilities say so and a non-zero tag is refused
    before anything is sent. Mocked: CUDA, and init_process_group (then Gloo)."""
    comm, _ = nccl
    assert (NCCL.p2p_tags, GLOO.p2p_tags) == (False, True)
    with pytest.raises(InvalidArgumentError, match=r"tag=3, but backend 'nccl' does not match"):
        comm.isend(torch.ones(1), 0, tag=3)
    assert comm.unusable is None
