"""Tests of distcomm.backend.arrays: the adapters for numpy arrays, torch tensors and byte buffers.

Each operation runs on numpy and on torch (``kind``); byte buffers, the transport of object
collectives, have their own tests.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from distcomm.backend.arrays import (
    adapter_for,
    as_torch,
    cached_adapter,
    check_op_dtype,
    normalise_bool_op,
)
from distcomm.backend.specs import DTYPE_NAMES
from distcomm.errors import InvalidArgumentError
from distcomm.protocol import ReduceOp

KINDS = ["numpy", "torch"]


def maker(kind: str) -> Callable[..., Any]:
    """``make(values, dtype)``: an array of ``kind`` (torch is skipped where it is missing)."""
    if kind == "numpy":
        return lambda values, dtype: np.array(values, dtype=dtype)
    torch = pytest.importorskip("torch")
    return lambda values, dtype: torch.tensor(values, dtype=getattr(torch, dtype))


@pytest.fixture(params=KINDS)
def make(request: pytest.FixtureRequest) -> Callable[..., Any]:
    return maker(request.param)


# -- dtypes ------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", KINDS)
def test_every_distcomm_dtype_has_its_canonical_name(kind: str) -> None:
    make = maker(kind)
    names = [n for n in DTYPE_NAMES if not (kind == "numpy" and n == "bfloat16")]  # numpy has none
    for name in names:
        x = make([1, 0], name)
        adapter = adapter_for(x)
        assert adapter.kind == kind
        assert adapter.dtype(x) == name


@pytest.mark.parametrize(
    ("make_bad", "shown"),
    [
        pytest.param(lambda: np.ones(2, dtype=np.complex64), "dtype('complex64')", id="numpy"),
        pytest.param(lambda: np.ones(2, dtype=np.uint16), "dtype('uint16')", id="numpy-uint16"),
        pytest.param(
            lambda: pytest.importorskip("torch").ones(2, dtype=pytest.importorskip("torch").cfloat),
            "torch.complex64",
            id="torch",
        ),
    ],
)
def test_an_unsupported_dtype_is_named_with_the_valid_ones(
    make_bad: Callable[[], Any], shown: str
) -> None:
    x = make_bad()
    with pytest.raises(InvalidArgumentError) as info:
        adapter_for(x).dtype(x)
    message = str(info.value)
    assert f"unsupported dtype {shown}" in message
    assert "distcomm moves bfloat16, bool, float16, float32, float64, int16" in message
    assert "HINT: convert the tensor" in message


def test_a_non_native_byte_order_is_named_with_the_fix() -> None:
    swapped = np.arange(3, dtype=">i4" if np.little_endian else "<i4")
    with pytest.raises(InvalidArgumentError, match="is int32 in non-native byte order") as info:
        adapter_for(swapped).dtype(swapped)
    assert "HINT: convert it first" in str(info.value)


# -- shape and memory --------------------------------------------------------------------------
def test_numel_flat_copy_clone_and_empty(make: Callable[..., Any]) -> None:
    x = make([[1, 2, 3], [4, 5, 6]], "int32")
    adapter = adapter_for(x)
    assert adapter.numel(x) == 6
    flat = adapter.flat(x)
    assert tuple(flat.shape) == (6,)
    flat[0] = 10
    assert x[0, 0] == 10, "flat is a view of the same memory"
    copy = adapter.clone(x)
    assert tuple(copy.shape) == (2, 3) and copy.tolist() == x.tolist()
    copy[0, 0] = 99
    assert x[0, 0] == 10, "clone is a copy"
    adapter.copy_(x, make([6, 5, 4, 3, 2, 1], "int32"))  # any shapes with as many elements
    assert x.tolist() == [[6, 5, 4], [3, 2, 1]]
    empty = adapter.empty(x, 4)
    assert tuple(empty.shape) == (4,) and adapter.dtype(empty) == "int32"
    assert adapter.dtype(adapter.empty(x, 2, dtype="float64")) == "float64"


def test_clone_of_a_non_contiguous_view_is_contiguous(make: Callable[..., Any]) -> None:
    base = make(list(range(8)), "int64")
    view = base[::2]
    adapter = adapter_for(view)
    assert not adapter.is_contiguous(view)
    copy = adapter.clone(view)
    assert adapter.is_contiguous(copy) and copy.tolist() == [0, 2, 4, 6]


def test_astype_converts_into_a_contiguous_copy(make: Callable[..., Any]) -> None:
    x = make([1, 2, 3, 4], "int16")[::2]
    adapter = adapter_for(x)
    converted = adapter.astype(x, "float32")
    assert adapter.dtype(converted) == "float32" and adapter.is_contiguous(converted)
    assert converted.tolist() == [1.0, 3.0]


# -- reductions --------------------------------------------------------------------------------
INT_RESULTS = {
    ReduceOp.SUM: [4, 7, 12],
    ReduceOp.AVG: [4, 7, 12],  # combine_ adds; divide_ finishes an average
    ReduceOp.PRODUCT: [3, 10, 36],
    ReduceOp.MIN: [1, 2, 6],
    ReduceOp.MAX: [3, 5, 6],
    ReduceOp.BAND: [1, 0, 6],
    ReduceOp.BOR: [3, 7, 6],
    ReduceOp.BXOR: [2, 7, 0],
}


@pytest.mark.parametrize("op", list(ReduceOp))
def test_combine_each_op_on_integers(make: Callable[..., Any], op: ReduceOp) -> None:
    acc = make([1, 5, 6], "int32")
    adapter = adapter_for(acc)
    adapter.combine_(acc, make([3, 2, 6], "int32"), op)
    assert acc.tolist() == INT_RESULTS[op]
    assert adapter.dtype(acc) == "int32"


T, F = True, False
#: acc = [T, T, F, F] combined with [T, F, T, F]: SUM, MAX and BOR are or; PRODUCT, MIN and BAND
#: are and; BXOR is exclusive or.
BOOL_RESULTS = {
    ReduceOp.SUM: [T, T, T, F],
    ReduceOp.MAX: [T, T, T, F],
    ReduceOp.BOR: [T, T, T, F],
    ReduceOp.PRODUCT: [T, F, F, F],
    ReduceOp.MIN: [T, F, F, F],
    ReduceOp.BAND: [T, F, F, F],
    ReduceOp.BXOR: [F, T, T, F],
}


@pytest.mark.parametrize("op", list(BOOL_RESULTS))
def test_combine_bools_is_logical(make: Callable[..., Any], op: ReduceOp) -> None:
    acc = make([T, T, F, F], "bool")
    adapter = adapter_for(acc)
    adapter.combine_(acc, make([T, F, T, F], "bool"), op)
    assert acc.tolist() == BOOL_RESULTS[op]
    assert adapter.dtype(acc) == "bool", "a bool reduction stays bool, never a count"


def test_normalise_bool_op() -> None:
    assert [normalise_bool_op(op) for op in ReduceOp] == [
        {
            ReduceOp.SUM: ReduceOp.MAX,
            ReduceOp.BOR: ReduceOp.MAX,
            ReduceOp.PRODUCT: ReduceOp.MIN,
            ReduceOp.BAND: ReduceOp.MIN,
        }.get(op, op)
        for op in ReduceOp
    ]


def test_divide_finishes_an_average(make: Callable[..., Any]) -> None:
    acc = make([2.0, 6.0], "float32")
    adapter_for(acc).divide_(acc, 4)
    assert acc.tolist() == [0.5, 1.5]


def test_combine_takes_the_other_kinds_and_bytes() -> None:
    torch = pytest.importorskip("torch")
    acc = np.array([1, 2], dtype=np.int64)
    adapter_for(acc).combine_(acc, torch.tensor([10, 20]), ReduceOp.SUM)
    assert acc.tolist() == [11, 22]
    tensor = torch.tensor([1, 2], dtype=torch.int64)
    adapter_for(tensor).combine_(tensor, np.array([[3], [4]], dtype=np.int64), ReduceOp.MAX)
    assert tensor.tolist() == [3, 4]
    raw = np.array([1, 2], dtype=np.uint8)
    adapter_for(raw).combine_(raw, bytearray(b"\x04\x08"), ReduceOp.BOR)
    assert raw.tolist() == [5, 10]


def test_a_bfloat16_tensor_cannot_meet_a_numpy_array() -> None:
    torch = pytest.importorskip("torch")
    acc = np.zeros(2, dtype=np.float32)
    with pytest.raises(InvalidArgumentError, match="bfloat16 torch tensor cannot meet a numpy"):
        adapter_for(acc).copy_(acc, torch.ones(2, dtype=torch.bfloat16))


@pytest.mark.parametrize(
    ("op", "dtype", "refused"),
    [
        (ReduceOp.AVG, "int32", "ReduceOp.AVG needs a floating-point tensor, got dtype 'int32'"),
        (ReduceOp.AVG, "bool", "ReduceOp.AVG needs a floating-point tensor, got dtype 'bool'"),
        (ReduceOp.BAND, "float32", "ReduceOp.BAND needs an integer or bool tensor, got dtype"),
        (ReduceOp.BXOR, "bfloat16", "ReduceOp.BXOR needs an integer or bool tensor, got dtype"),
        (ReduceOp.AVG, "float16", None),
        (ReduceOp.BXOR, "bool", None),
        (ReduceOp.SUM, "int8", None),
    ],
)
def test_check_op_dtype(op: ReduceOp, dtype: str, refused: str | None) -> None:
    if refused is None:
        check_op_dtype(op, dtype)
        return
    with pytest.raises(InvalidArgumentError) as info:
        check_op_dtype(op, dtype)
    assert refused in str(info.value) and "HINT:" in str(info.value)


# -- devices -----------------------------------------------------------------------------------
def test_is_plain_needs_contiguous_memory_on_an_engine_device(make: Callable[..., Any]) -> None:
    x = make([1.0, 2.0, 3.0, 4.0], "float32")
    adapter = adapter_for(x)
    assert adapter.device(x) == "cpu"
    assert adapter.is_plain(x, frozenset({"cpu"}))
    assert adapter.is_plain(x, frozenset({"cpu", "cuda"}))
    assert not adapter.is_plain(x, frozenset({"cuda"})), "a CPU array for a GPU-only engine"
    assert not adapter.is_plain(x[::2], frozenset({"cpu"})), "not contiguous"


def test_a_fortran_ordered_array_is_not_plain() -> None:
    x = np.asfortranarray(np.ones((2, 3), dtype=np.float32))
    assert not adapter_for(x).is_plain(x, frozenset({"cpu"}))


def test_a_tensor_on_another_device_is_plain_only_for_an_engine_moving_it() -> None:
    torch = pytest.importorskip("torch")
    x = torch.empty(4, device="meta")  # a device that is not the CPU, on any machine
    adapter = adapter_for(x)
    assert adapter.device(x) == "meta"
    assert not adapter.is_plain(x, frozenset({"cpu"}))
    assert adapter.is_plain(x, frozenset({"cpu", "meta"}))


def test_numpy_arrays_live_on_the_cpu_only() -> None:
    x = np.ones(2)
    with pytest.raises(InvalidArgumentError, match="numpy arrays live on the CPU only"):
        adapter_for(x).to_device(x, "cuda:0")


# -- byte buffers ------------------------------------------------------------------------------
def test_bytes_adapter() -> None:
    buffer = bytearray(b"abcdef")
    adapter = adapter_for(buffer)
    assert adapter.kind == "bytes"
    assert (adapter.dtype(buffer), adapter.numel(buffer), adapter.device(buffer)) == (
        "uint8",
        6,
        "cpu",
    )
    assert adapter.is_plain(buffer, frozenset({"cpu"}))
    assert not adapter.is_plain(buffer, frozenset({"cuda"}))
    view = memoryview(bytearray(8))[::2]
    assert adapter_for(view).kind == "bytes" and not adapter.is_contiguous(view)
    copy = adapter.clone(buffer)
    assert copy == buffer and copy is not buffer
    flat = adapter.flat(buffer)
    flat[0] = ord("A")
    assert buffer == bytearray(b"Abcdef"), "flat is a view of the same memory"
    adapter.copy_(buffer, b"uvwxyz")
    assert buffer == bytearray(b"uvwxyz")
    adapter.copy_(buffer, np.arange(6, dtype=np.uint8))
    assert list(buffer) == [0, 1, 2, 3, 4, 5]
    assert adapter.empty(buffer, 3) == bytearray(3)


def test_bytes_take_a_torch_tensor() -> None:
    torch = pytest.importorskip("torch")
    buffer = bytearray(4)
    adapter_for(buffer).copy_(buffer, torch.tensor([1, 2, 3, 4], dtype=torch.uint8))
    assert list(buffer) == [1, 2, 3, 4]


def test_bytes_cannot_be_reduced() -> None:
    buffer = bytearray(2)
    with pytest.raises(InvalidArgumentError, match="reductions need a torch tensor or numpy array"):
        adapter_for(buffer).combine_(buffer, bytearray(2), ReduceOp.SUM)


# -- as_torch and adapter_for ------------------------------------------------------------------
def test_as_torch_shares_memory() -> None:
    torch = pytest.importorskip("torch")
    array = np.zeros(3, dtype=np.float32)
    tensor = as_torch(array)
    assert isinstance(tensor, torch.Tensor) and tensor.dtype == torch.float32
    tensor[1] = 5
    assert array.tolist() == [0.0, 5.0, 0.0]
    buffer = bytearray(2)
    as_torch(buffer)[0] = 7
    assert buffer == bytearray(b"\x07\x00")
    empty = as_torch(bytearray())
    assert empty.dtype == torch.uint8 and empty.numel() == 0
    assert as_torch(tensor) is tensor


@pytest.mark.parametrize(
    ("value", "shown"),
    [([1, 2], "got list ([1, 2])"), (None, "got NoneType (None)"), (b"ab", "got bytes")],
)
def test_adapter_for_refuses_what_is_not_an_array(value: Any, shown: str) -> None:
    with pytest.raises(InvalidArgumentError) as info:
        adapter_for(value, "output")
    message = str(info.value)
    assert message.startswith("output must be a torch.Tensor or numpy.ndarray")
    assert shown in message and "HINT: wrap Python numbers" in message


def test_one_adapter_per_type_is_made_and_cached() -> None:
    first, second = np.ones(2), np.zeros(3, dtype=np.int8)
    assert adapter_for(first) is adapter_for(second)
    assert cached_adapter(first) is adapter_for(first)
    assert cached_adapter(object()) is None


class OnGpu1:
    """What the torch adapter reads of a contiguous tensor on cuda:1 (none can be made here:
    no GPU in CI)."""

    is_cpu = False

    def __init__(self, torch: Any) -> None:
        self.device = torch.device("cuda", 1)

    def is_contiguous(self) -> bool:
        return True


def test_a_tensor_on_another_gpu_than_the_bound_one_is_not_plain() -> None:
    """The fast path hands plain tensors straight to the engine: one on cuda:1 must not reach
    an engine bound to cuda:0 (staging refuses it with the reason)."""
    torch = pytest.importorskip("torch")
    adapter, x = adapter_for(torch.ones(1)), OnGpu1(torch)
    cuda = frozenset({"cpu", "cuda"})
    assert adapter.is_plain(x, cuda) and adapter.is_plain(x, cuda, "cuda:1")
    assert not adapter.is_plain(x, cuda, "cuda:0")
    assert adapter.is_plain(torch.ones(1), cuda, "cuda:0"), "CPU tensors are not bound"


@pytest.mark.parametrize("look", ["compiled", "python"])
def test_numpy_plain_pair_answers_as_the_four_looks_it_stands_for(
    look: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """NumpyAdapter.plain_pair (one look: through the buffer protocol where the extension was
    built, else each array's flags read once) says what the base's composition of is_plain,
    is_writable and shares_memory says, for every pair a careless caller passes: contiguous or
    strided, read-only, the same array, views that overlap or not (in one dimension and in
    two), empty ones, a broadcast view, a row of one column, arrays of their own, and an engine
    that moves no CPU memory."""
    from distcomm.backend import arrays as module
    from distcomm.backend.arrays import Adapter, NumpyAdapter

    if look == "python":
        monkeypatch.setattr(module, "_apart", None)
    elif module._apart is None:
        pytest.skip("distcomm was installed without its compiled planned path (no C compiler)")
    adapter = NumpyAdapter()
    big = np.arange(24, dtype=np.float32)
    grid = np.zeros((6, 4), np.float32)
    read_only = np.arange(8, dtype=np.float32)
    read_only.flags.writeable = False
    arrays = {
        "own": np.zeros(8, np.float32),
        "other own": np.ones(8, np.float32),
        "first half": big[:12],
        "second half": big[12:],
        "overlapping": big[6:18],
        "strided": big[::2],
        "read-only": read_only,
        "2-D": np.zeros((4, 2), np.float32),
        "transposed": np.zeros((2, 4), np.float32).T,
        "rows 0-2": grid[:3],
        "rows 2-5": grid[2:],
        "rows 3-5": grid[3:],
        "a column": grid[:, :1],
        "one row of one column": grid[1:2, 1:2],
        "empty": big[:0],
        "empty view inside": big[5:5],
        "broadcast": np.broadcast_to(np.float32(1), (8,)),
    }
    wrong = []
    for devices in (frozenset({"cpu"}), frozenset({"cuda"})):
        for out_name, output in arrays.items():
            for in_name, input in arrays.items():
                want = Adapter.plain_pair(adapter, output, input, devices, None)
                got = adapter.plain_pair(output, input, devices, None)
                if got != want:
                    wrong.append((sorted(devices), out_name, in_name, got, want))
    assert not wrong, f"(devices, output, input, got, wanted): {wrong}"
    assert adapter.plain_pair(arrays["own"], arrays["other own"], frozenset({"cpu"}), None)
    assert not adapter.plain_pair(big[:12], big[6:18], frozenset({"cpu"}), None)
