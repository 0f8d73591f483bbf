"""The catalogue's ``init``-level rows in this process (docs/errors.md): a plain process
(``single_node``, fakelink), and ``env`` / ``slurm`` launches made with monkeypatched variables.

The same rows in launched worlds of 2 run in test_gloo_errors.py and test_mpi_errors.py. The root
conftest removes every launcher variable before each test and finalizes distcomm after it.
"""

from __future__ import annotations

import re
import socket
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from kit_engines import Idle, over

import distcomm
from distcomm import (
    AlreadyInitializedError,
    BackendNotFoundError,
    BackendUnavailableError,
    DistcommError,
    InvalidArgumentError,
    LaunchInfo,
    NotInitializedError,
)
from distcomm.backend import free_port
from distcomm.backend.communicator import BaseCommunicator
from distcomm.protocol import _OP_NAMES, ReduceOp


def message_of(exc_type: type[BaseException], fn: Any, *args: Any, **kwargs: Any) -> str:
    """The message of the ``exc_type`` (exactly that class) that ``fn(*args, **kwargs)`` raises."""
    with pytest.raises(exc_type) as info:
        fn(*args, **kwargs)
    assert type(info.value) is exc_type, f"{type(info.value).__name__}: {info.value}"
    return str(info.value)


def env_launch(monkeypatch: pytest.MonkeyPatch, rank: int, world_size: int) -> int:
    """Make this process rank ``rank`` of an ``env`` launch; return its MASTER_PORT."""
    port = free_port()
    for name, value in {
        "RANK": rank,
        "WORLD_SIZE": world_size,
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": port,
    }.items():
        monkeypatch.setenv(name, str(value))
    return port


# -- row 1: unknown backend, method, reduce op ---------------------------------------------------
def test_unknown_backend_argument() -> None:
    message = message_of(BackendNotFoundError, distcomm.init, backend="ncl")
    assert message.startswith("unknown backend 'ncl'; available: ")
    assert "gloo" in message and message.endswith("HINT: did you mean 'nccl'?")
    assert not distcomm.is_initialized()


def test_unknown_backend_from_distcomm_backend(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DISTCOMM_BACKEND", "glo")
    message = message_of(BackendNotFoundError, distcomm.init)
    assert message.startswith("unknown backend 'glo' (from DISTCOMM_BACKEND); available: ")
    assert message.endswith("HINT: did you mean 'gloo'?")


def test_unknown_method_argument() -> None:
    message = message_of(InvalidArgumentError, distcomm.init, method="slrum")
    assert message.startswith("unknown launch method 'slrum'; available: env, ")
    assert "single_node, slurm. HINT: did you mean 'slurm'?" in message


def test_unknown_method_from_distcomm_init_method(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DISTCOMM_INIT_METHOD", "slrum")
    message = message_of(InvalidArgumentError, distcomm.init)
    assert message.startswith("unknown launch method 'slrum' (from DISTCOMM_INIT_METHOD);")
    assert message.endswith("HINT: did you mean 'slurm'?")


def test_unknown_reduce_op_lists_every_accepted_spelling() -> None:
    torch = pytest.importorskip("torch")
    message = message_of(InvalidArgumentError, distcomm.all_reduce, np.ones(2), op="summ")
    assert message.startswith("unknown reduce op 'summ'; valid ops: SUM, PRODUCT, MIN, MAX, AVG, ")
    assert message.endswith("HINT: did you mean 'sum'?")
    for alias, member in _OP_NAMES.items():  # every spelling ReduceOp.coerce accepts ...
        assert ReduceOp.coerce(alias.upper()) is member  # ... in any case
        assert repr(alias) in message or alias.upper() in message, alias
    assert "'prod' (PRODUCT), 'mean' (AVG), 'average' (AVG)" in message
    assert "torch.distributed.ReduceOp member" in message
    for name in ("SUM", "PRODUCT", "MIN", "MAX", "AVG", "BAND", "BOR", "BXOR"):
        assert ReduceOp.coerce(getattr(torch.distributed.ReduceOp, name)) is ReduceOp[name]
    premul = message_of(
        InvalidArgumentError, ReduceOp.coerce, torch.distributed.ReduceOp.PREMUL_SUM
    )
    assert "PREMUL_SUM" in premul and "HINT: e.g. op=distcomm.ReduceOp.SUM" in premul


# -- row 2: nccl without a GPU -------------------------------------------------------------------
@pytest.fixture
def no_cuda(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """torch sees no CUDA device, as on CI (and on this machine): the row holds on GPU hosts too."""
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    yield


@pytest.mark.usefixtures("no_cuda")
def test_nccl_without_a_gpu_points_to_gloo_or_mpi(monkeypatch: pytest.MonkeyPatch) -> None:
    message = message_of(BackendUnavailableError, distcomm.init, backend="nccl")
    assert message.startswith("backend 'nccl' cannot run here: ")
    assert "no NVIDIA driver" in message or "torch sees no CUDA device" in message
    assert "HINT: nccl moves CUDA tensors only; for CPU tensors use " in message
    assert "gloo" in message and "omit backend to choose automatically" in message
    monkeypatch.setenv("DISTCOMM_BACKEND", "nccl")
    message = message_of(BackendUnavailableError, distcomm.init)
    assert message.startswith("backend 'nccl' (from DISTCOMM_BACKEND) cannot run here: ")
    assert "unset DISTCOMM_BACKEND to choose automatically" in message


def test_other_unavailable_backends(monkeypatch: pytest.MonkeyPatch) -> None:
    env_launch(monkeypatch, 0, 2)
    message = message_of(BackendUnavailableError, distcomm.init, backend="fakelink")
    assert message.startswith("backend 'fakelink' cannot run here: in-process only: ")
    # gloo first (the highest priority), then installed plugins' (distcomm-zmq's zmq) by name
    assert re.search(
        r"HINT: backends that can run here: gloo(, [a-z]+)*; pass init\(backend='gloo'\), or "
        r"omit backend to choose automatically\.$",
        message,
    ), message
    pytest.importorskip("distcomm_mpi")
    message = message_of(BackendUnavailableError, distcomm.init, backend="mpi")
    assert message.startswith("backend 'mpi' cannot run here: the job was launched by 'env' ")
    assert message.endswith(
        "so MPI cannot start. HINT: start it with mpirun/mpiexec (or srun --mpi=pmi2)."
    )


# -- row 4: a tensor on the wrong device ---------------------------------------------------------
class CudaOnly(Idle):
    """An engine that moves CUDA memory only, as nccl does. CI has no GPU, so CUDA is mocked:
    no tensor ever reaches an engine method (each would raise NotImplementedError)."""

    devices = frozenset({"cuda"})


def cuda_only_world() -> BaseCommunicator:
    launch = LaunchInfo("env", 0, 2, 0, 2, 0, 1, "127.0.0.1", 29500)
    comm = over(CudaOnly(), backend="cudaonly", launch=launch)
    comm.debug = "off"  # no peer: the mismatch check's all-reduce has no engine to run on
    return comm


def test_cpu_tensor_on_a_cuda_only_backend() -> None:
    torch = pytest.importorskip("torch")
    comm = cuda_only_world()
    for x in (np.ones(2, dtype=np.float32), torch.ones(2)):
        for fn, args in ((comm.all_reduce, (x,)), (comm.broadcast, (x,)), (comm.send, (x, 1))):
            message = message_of(InvalidArgumentError, fn, *args)
            assert message == (
                "tensor is on the CPU, but backend 'cudaonly' moves ['cuda'] tensors only. "
                "HINT: move it first (tensor.cuda()), or init a CPU backend such as gloo."
            )


def test_cpu_tensor_staged_for_nccl() -> None:
    """The validation nccl's communicator runs (its devices and dtypes), called directly."""
    pytest.importorskip("distcomm_torch")
    import torch
    from distcomm_torch.communicator import NcclEngine
    from distcomm_torch.plugin import NCCL

    from distcomm.backend._pipeline.staging import stage
    from distcomm.backend.arrays import adapter_for

    x = torch.ones(3)
    message = message_of(
        InvalidArgumentError,
        stage,
        adapter_for(x),
        x,
        "float32",
        native_dtypes=NCCL.dtypes,
        devices=NcclEngine.devices,
        backend="nccl",
        warn_staging=lambda device: None,
    )
    assert message.startswith("tensor is on the CPU, but backend 'nccl' moves ['cuda'] tensors")
    assert "HINT: move it first (tensor.cuda()), or init a CPU backend such as gloo." in message


def test_gloo_with_a_cuda_device() -> None:
    pytest.importorskip("distcomm_torch")
    message = message_of(InvalidArgumentError, distcomm.init, backend="gloo", device="cuda")
    assert message == (
        "backend 'gloo' moves CPU tensors; device='cuda' is not for it (valid: None or 'cpu'). "
        "HINT: omit device "
        "(CUDA tensors are staged through host memory), or use backend='nccl'."
    )
    message = message_of(InvalidArgumentError, distcomm.init, device="gpu")
    assert message.startswith("device='gpu' is not a device; valid: 'cpu', 'cuda', 'cuda:N'")
    assert not distcomm.is_initialized()


# -- row 5: rank out of range --------------------------------------------------------------------
@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [
        (
            {"rank": 5, "world_size": 2},
            "rank=5 is not a rank of a world of 2 (world_size=2 from the argument): valid ranks "
            "are 0..1. HINT: ranks count from 0; pass 0 <= rank < world_size.",
        ),
        ({"rank": -1, "world_size": 2}, "rank=-1 is not a rank of a world of 2"),
        ({"rank": 0, "world_size": 0}, "world_size=0 must be at least 1. HINT: "),
        ({"rank": "0", "world_size": 2}, "rank='0' must be an int, not str. HINT: "),
        ({"rank": 0, "world_size": 1, "master_port": 70000}, "master_port=70000 is not a TCP"),
    ],
)
def test_init_rank_out_of_range(kwargs: dict[str, Any], expected: str) -> None:
    message = message_of(InvalidArgumentError, distcomm.init, **kwargs)
    assert message.startswith(expected) and "HINT: " in message
    assert not distcomm.is_initialized()


# -- row 6: a world size or rank that disagrees with the launcher ---------------------------------
@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [
        (
            {"world_size": 3},
            "init(world_size=3) disagrees with the env launch, which says world_size=2 (from "
            "WORLD_SIZE); the rendezvous would wait for ranks that never start. HINT: omit "
            "world_size= to use the launcher's value, or start 3 processes with the launcher.",
        ),
        (
            {"rank": 1},
            "init(rank=1) disagrees with the env launch, which says rank=0 (from RANK); the "
            "rendezvous would wait for ranks that never start. HINT: omit rank= to use the "
            "launcher's value.",
        ),
        (
            {"rank": 1, "world_size": 3},
            "init(rank=1, world_size=3) disagrees with the env launch, which says rank=0 (from "
            "RANK), world_size=2 (from WORLD_SIZE); the rendezvous would wait for ranks that "
            "never start. HINT: omit rank= and world_size= to use the launcher's values, or "
            "start 3 processes with the launcher.",
        ),
    ],
)
def test_init_disagrees_with_the_env_launch(
    monkeypatch: pytest.MonkeyPatch, kwargs: dict[str, Any], expected: str
) -> None:
    env_launch(monkeypatch, 0, 2)
    started = time.monotonic()
    for backend in ("gloo", None):  # refused before the rendezvous (else it times out)
        assert message_of(InvalidArgumentError, distcomm.init, backend, timeout=5, **kwargs) == (
            expected
        )
    assert time.monotonic() - started < 5, "a refused init must not wait for a rendezvous"
    assert not distcomm.is_initialized()


def test_init_disagrees_with_an_srun_step(monkeypatch: pytest.MonkeyPatch) -> None:
    step = {
        "SLURM_JOB_ID": "42",
        "SLURM_STEP_ID": "0",
        "SLURM_PROCID": "1",
        "SLURM_NTASKS": "4",
        "SLURM_LOCALID": "1",
        "SLURM_NODEID": "0",
        "SLURM_NNODES": "1",
        "SLURM_NODELIST": "node1",
    }
    for name, value in step.items():
        monkeypatch.setenv(name, value)
    message = message_of(InvalidArgumentError, distcomm.init, world_size=2)
    assert message.startswith(
        "init(world_size=2) disagrees with the slurm launch, which says world_size=4 (from "
        "SLURM_NTASKS)"
    )


def test_values_equal_to_the_launchers_are_accepted(monkeypatch: pytest.MonkeyPatch) -> None:
    env_launch(monkeypatch, 0, 1)
    comm = distcomm.init(backend="fakelink", rank=0, world_size=1)
    assert (comm.rank, comm.world_size, comm.launch.method) == (0, 1, "env")
    assert comm.launch.sources["rank"] == "argument"


# -- row 7: init twice ---------------------------------------------------------------------------
def test_init_twice() -> None:
    comm = distcomm.init()
    message = message_of(AlreadyInitializedError, distcomm.init, backend="gloo")
    assert message == (
        "distcomm is already initialised with other arguments: backend='gloo' (running: "
        "'fakelink'). HINT: call distcomm.finalize() first, or omit the arguments to get the "
        "running communicator."
    )
    message = message_of(AlreadyInitializedError, distcomm.init, timeout=60, rank=0)
    assert "timeout=60.0 (running: 1800.0)" in message and "rank=" not in message
    assert distcomm.init() is comm
    assert distcomm.init(backend="FakeLink", rank=0, world_size=1, timeout=1800) is comm


# -- row 8: calls after finalize -----------------------------------------------------------------
def test_calls_on_a_finalized_communicator() -> None:
    comm = distcomm.init()
    distcomm.finalize()
    for fn, args in (
        (comm.all_reduce, (np.ones(2),)),
        (comm.barrier, ()),
        (comm.broadcast_object, ({"a": 1},)),
    ):
        message = message_of(DistcommError, fn, *args)
        assert message == (
            "communicator fakelink 'world' (1 rank) can no longer be used: finalized. "
            "HINT: create a new one with distcomm.init() after distcomm.finalize()."
        )


def test_module_level_calls_after_finalize(monkeypatch: pytest.MonkeyPatch) -> None:
    distcomm.init()
    distcomm.finalize()
    x = np.arange(3.0)
    assert distcomm.all_reduce(x) is None and x.tolist() == [0.0, 1.0, 2.0]  # a world of 1
    assert distcomm.all_reduce(5) == 5 and distcomm.all_gather_object("me") == ["me"]
    assert not distcomm.is_initialized()
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    message = message_of(NotInitializedError, distcomm.all_reduce, x)
    assert message == (
        "the env launch says this is rank 1 of 2, but distcomm is not initialised, so a "
        "collective here would run alone. HINT: call distcomm.init() first."
    )


# -- row 10: a master port already in use --------------------------------------------------------
@pytest.mark.timeout(60)
def test_master_port_in_use(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("distcomm_torch")
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        env_launch(monkeypatch, 0, 2)
        monkeypatch.setenv("MASTER_PORT", str(port))
        started = time.monotonic()
        message = message_of(BackendUnavailableError, distcomm.init, backend="gloo", timeout=20)
    assert time.monotonic() - started < 10, "the refusal waited for the timeout"
    assert message.startswith(f"gloo: rank 0 could not serve the rendezvous at 127.0.0.1:{port}: ")
    assert "EADDRINUSE" in message
    assert f"HINT: MASTER_PORT={port} is taken on 127.0.0.1 (another job may be using it): " in (
        message
    )
    suggested = int(message.split("e.g. MASTER_PORT=")[1].split(",")[0])
    assert suggested != port and "the same on every rank." in message
    assert not distcomm.is_initialized()
