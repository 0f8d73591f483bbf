"""The mpi backend's buffer path inside a real MPI job (``mpirun -n N pytest --with-mpi``).

- ``all_reduce`` on every layout: results, untouched neighbours, one operation each; and past
  the first checked collectives, the engine's plan taken (counted) with the right sums.
- float16 and bfloat16 (no MPI type: bridged through float32) against torch's own reduction of
  the same random values.
- CUDA tensors: staged through host memory with one warning when MPI is not CUDA-aware, handed
  to MPI as they are when it is. CI has no GPU, so the "CUDA" array here is a mock: host memory
  whose adapter reports device cuda:0. What MPI says about itself is asked of the real library.
"""

from __future__ import annotations

import ctypes.util
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from distcomm_mpi.communicator import create
from distcomm_mpi.cuda import query_cuda_support
from distcomm_mpi.plugin import MPI_CAPABILITIES

import distcomm
from distcomm.backend import BaseCommunicator, CallKind, arrays
from distcomm.protocol import Communicator

pytestmark = pytest.mark.mpi

#: Views of a (3, 4) array: what all_reduce receives.
LAYOUTS: dict[str, Callable[[Any], Any]] = {
    "contiguous": lambda a: a,
    "transposed": lambda a: a.T,  # numpy: Fortran-contiguous; torch: a non-contiguous view
    "strided": lambda a: a[:, ::2],
    "empty": lambda a: a[:0],
    "0-dim": lambda a: a[1, 2, ...],
}


def grid(lib: str, dtype: str, scale: int) -> Any:
    values = np.arange(12, dtype=dtype).reshape(3, 4) * scale
    if lib == "torch":
        import torch

        return torch.from_numpy(values.copy())
    return values


@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("dtype", ["float32", "int64"])
@pytest.mark.parametrize("lib", ["numpy", "torch"])
def test_all_reduce_sum_on_every_layout(
    world: Communicator, lib: str, dtype: str, layout: str
) -> None:
    size, rank = world.world_size, world.rank
    full = grid(lib, dtype, rank + 1)
    view = LAYOUTS[layout](full)
    seq = world.seq
    distcomm.all_reduce(view)
    assert world.seq == seq + 1  # one operation, whichever path it took
    expected = grid(lib, dtype, size * (size + 1) // 2)
    assert np.array_equal(np.asarray(view), np.asarray(LAYOUTS[layout](expected)))
    outside = np.ones(12, dtype=bool)  # the elements of `full` that are not in the view
    outside[np.asarray(LAYOUTS[layout](np.arange(12).reshape(3, 4))).reshape(-1)] = False
    own = np.asarray(grid(lib, dtype, rank + 1)).reshape(-1)
    assert np.array_equal(np.asarray(full).reshape(-1)[outside], own[outside])


@pytest.mark.parametrize("policy", ["sample", "off"])
@pytest.mark.parametrize("dtype", ["float32", "float64", "int32", "int64"])
@pytest.mark.parametrize("lib", ["numpy", "torch"])
def test_all_reduce_past_the_first_checks_takes_the_plan(
    world: Communicator, lib: str, dtype: str, policy: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The calls above run inside the first 64 checked collectives of the world, where no plan
    is tried: here a group goes past them first, then 10 sums of rank-dependent values (a MAX
    in place of the SUM would show) must take the plan ``MpiEngine.plan`` gave for
    their kind (asked once), one operation each."""
    outcomes: list[bool] = []
    asked: list[str] = []
    cls: Any = type(world.engine)  # type: ignore[attr-defined]
    engine = cls.plan

    def counting(self: Any, kind: CallKind) -> Any:
        run = engine(self, kind)
        if kind.op != "all_reduce" or run is None:
            return run
        asked.append(kind.op)

        def counted(x: Any, y: Any) -> Any:
            outcomes.append(False)  # not taken until the plan returns (NotPlanned: never)
            run(x, y)
            outcomes[-1] = True

        return counted

    monkeypatch.setattr(cls, "plan", counting)  # bound when the group below is made
    group: Any = distcomm.new_group(range(world.world_size))
    group.debug = "off"
    for _ in range(64):
        group.all_reduce(np.zeros(1))
    group.debug = policy  # the kinds forgotten: the first sum teaches its kind again
    outcomes.clear()
    asked.clear()
    size, rank, wrong = group.world_size, group.rank, []
    for step in range(10):
        x = grid(lib, dtype, rank + 1 + step)
        seq = group.seq
        group.all_reduce(x)
        want = grid(lib, dtype, sum(r + 1 + step for r in range(size)))
        if not np.array_equal(np.asarray(x), np.asarray(want)) or group.seq != seq + 1:
            wrong.append(step)
    group.finalize()
    assert not wrong, f"rank {rank}: wrong sums (or seq) at steps {wrong}"
    # the first call of the kind goes through the pipeline (the engine asked for its plan
    # then), whatever the policy, and under "sample" so does the second, a repeat the ranks
    # confirm once; the others take the plan. A world of 1 answers every call without its
    # engine: no plan is asked for
    taken = 8 if policy == "sample" else 9
    assert asked == (["all_reduce"] if size > 1 else []), asked
    assert outcomes == ([True] * taken if size > 1 else []), outcomes


@pytest.mark.parametrize("op", ["SUM", "AVG", "PRODUCT", "MIN", "MAX"])
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_reduced_precision_matches_torch(world: Communicator, dtype: str, op: str) -> None:
    """MPI has no bfloat16 (nor a float16 reduction we rely on): distcomm reduces in float32 and
    rounds once. Every rank regenerates every rank's random values from its seed, so the
    reference needs no communication."""
    import torch

    kind = getattr(torch, dtype)

    def values(rank: int) -> Any:
        noise = torch.randn(4096, generator=torch.Generator().manual_seed(1000 + rank))
        return (1 + noise / 8 if op == "PRODUCT" else noise * 3).to(kind)

    mine = values(world.rank)
    distcomm.all_reduce(mine, op=op)
    stack = torch.stack([values(r) for r in range(world.world_size)])
    reference = {
        "SUM": lambda: stack.sum(0),
        "AVG": lambda: stack.mean(0),
        "PRODUCT": lambda: stack.prod(0),
        "MIN": lambda: stack.amin(0),
        "MAX": lambda: stack.amax(0),
    }[op]()
    assert mine.dtype == kind
    if op != "PRODUCT":
        # MIN/MAX pick a value; a sum of a few such values is exact in float32, so the sum (and
        # the mean) is rounded once, exactly as torch rounds its own.
        assert torch.equal(mine, reference)
        return
    # torch's CPU product of reduced-precision floats rounds after every multiplication;
    # distcomm's (float32, then one rounding) is the correctly rounded one: within half a unit
    # in the last place of the exact product, and within one unit per multiplication of torch's.
    exact = stack.double().prod(0)
    ulp = torch.exp2(torch.floor(torch.log2(exact.abs()))) * torch.finfo(kind).eps
    assert bool(((mine.double() - exact).abs() <= ulp / 2).all())
    assert bool(((mine.double() - reference.double()).abs() <= ulp * world.world_size).all())


class DeviceArray(np.ndarray):
    """Host memory that claims to live on cuda:0 (a mock: CI has no GPU)."""


class DeviceAdapter(arrays.NumpyAdapter):
    def __init__(self) -> None:
        super().__init__()
        self.moves: list[str] = []

    def device(self, x: Any) -> str:
        return "cuda:0"

    def is_plain(self, x: Any, devices: frozenset[str], bound: str | None = None) -> bool:
        return "cuda" in devices and self.is_contiguous(x)

    def to_device(self, x: Any, device: str) -> Any:
        self.moves.append(device)
        return np.array(x, order="C").view(np.ndarray if device == "cpu" else DeviceArray)


@pytest.fixture
def device_arrays(monkeypatch: pytest.MonkeyPatch) -> DeviceAdapter:
    adapter = DeviceAdapter()
    monkeypatch.setitem(arrays._adapters, DeviceArray, adapter)
    return adapter


def test_this_mpich_says_it_is_not_cuda_aware(world: Communicator) -> None:
    assert query_cuda_support() == (False, "MPIX_Query_cuda_support() returned 0")
    assert world.engine.cuda_aware == query_cuda_support()  # type: ignore[attr-defined]
    assert world.devices == frozenset({"cpu"})


def test_cuda_query_of_a_library_without_one() -> None:
    libc = ctypes.util.find_library("c")
    assert libc is not None
    aware, why = query_cuda_support(libc)
    assert not aware and "exports no CUDA support query" in why
    aware, why = query_cuda_support("/nonexistent/libmpi.so")
    assert not aware and "could not be opened" in why


@pytest.mark.mpi(min_size=2)
def test_cuda_tensors_are_staged_with_one_warning(
    world: Communicator, device_arrays: DeviceAdapter
) -> None:
    size, rank = world.world_size, world.rank
    group = distcomm.new_group(list(range(size)))  # a fresh communicator: its first warning
    x = (np.arange(6.0) * (rank + 1)).view(DeviceArray)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        distcomm.all_reduce(x, group=group)
        distcomm.broadcast(x, src=size - 1, group=group)
    messages = [str(w.message) for w in caught if issubclass(w.category, distcomm.DistcommWarning)]
    assert len(messages) == 1, messages
    assert "not CUDA-aware: MPIX_Query_cuda_support() returned 0" in messages[0]
    assert "cuda:0 tensors are copied through host memory" in messages[0]
    assert np.array_equal(x, np.arange(6.0) * size * (size + 1) // 2)
    assert device_arrays.moves == ["cpu", "cpu"]


@pytest.mark.mpi(min_size=2)
def test_cuda_aware_mpi_takes_device_memory_as_it_is(
    world: Communicator, device_arrays: DeviceAdapter
) -> None:
    comm = BaseCommunicator(
        create(world.launch, cuda_aware=True),
        backend="mpi",
        capabilities=MPI_CAPABILITIES,
        rank=world.rank,
        world_size=world.world_size,
        launch=world.launch,
    )
    try:
        assert comm.engine.cuda_aware == (True, "init(cuda_aware=...)")
        assert comm.devices == frozenset({"cpu", "cuda"})
        x = (np.arange(6.0) * (world.rank + 1)).view(DeviceArray)
        with warnings.catch_warnings():
            warnings.simplefilter("error", distcomm.DistcommWarning)
            comm.all_reduce(x)
        size = world.world_size
        assert np.array_equal(x, np.arange(6.0) * size * (size + 1) // 2)
        assert device_arrays.moves == []  # no staging copy
    finally:
        comm.finalize()


def test_mpi_options_are_checked(world: Communicator) -> None:
    with pytest.raises(distcomm.InvalidArgumentError, match="not CUDA-aware") as info:
        create(world.launch, device="cuda")
    assert "MPIX_Query_cuda_support() returned 0" in str(info.value)
    assert "HINT" in str(info.value)
    with pytest.raises(distcomm.InvalidArgumentError, match="cuda_aware='yes'"):
        create(world.launch, cuda_aware="yes")  # type: ignore[arg-type]
    with pytest.raises(distcomm.InvalidArgumentError, match=r"other options \['fast'\]"):
        create(world.launch, fast=True)
