"""Tests of distcomm.backend._pipeline.staging: fitting a caller's tensor to what an engine takes.

``stage`` is called here directly, with the engine's native dtypes and devices as arguments. A
device other than the CPU is faked by an adapter that says its numpy arrays live on "cuda:1".
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from distcomm.backend._pipeline.staging import BRIDGES, Staged, stage
from distcomm.backend.arrays import NumpyAdapter, adapter_for
from distcomm.errors import InvalidArgumentError

CPU = frozenset({"cpu"})
ALL_NATIVE = frozenset({"uint8", "int32", "float32", "float64"})


def staged(x: Any, *, native: frozenset[str] = ALL_NATIVE, devices: frozenset[str] = CPU) -> Staged:
    """``stage(x)`` for an engine named "engine"; a staging warning fails the test."""

    def no_warning(device: str) -> None:
        raise AssertionError(f"warned about {device}")

    adapter = adapter_for(x)
    return stage(
        adapter,
        x,
        adapter.dtype(x),
        native_dtypes=native,
        devices=devices,
        backend="engine",
        warn_staging=no_warning,
    )


def test_a_plain_native_array_is_handed_over_as_it_is() -> None:
    x = np.arange(4, dtype=np.float32)
    result = staged(x)
    assert result.engine is x and result.user is x
    assert not result.copied and result.dtype == "float32"
    result.write_back()  # nothing to do
    assert x.tolist() == [0.0, 1.0, 2.0, 3.0]


def test_a_non_contiguous_array_is_copied_and_written_back() -> None:
    base = np.zeros(8, dtype=np.float32)
    view = base[::2]
    result = staged(view)
    assert result.copied and result.engine is not view
    assert result.engine.flags.c_contiguous and result.engine.shape == (4,)
    result.engine[:] = [1, 2, 3, 4]  # what the engine writes
    assert base.tolist() == [0.0] * 8, "the caller's memory is untouched until write_back"
    result.write_back()
    assert base.tolist() == [1, 0, 2, 0, 3, 0, 4, 0]


@pytest.mark.parametrize(
    ("dtype", "native", "bridge"),
    [
        ("int16", frozenset({"uint8", "int32", "int64"}), "int32"),
        ("int16", frozenset({"uint8", "int64"}), "int64"),  # the next choice
        ("int8", frozenset({"uint8", "int16", "int32"}), "int16"),
        ("bool", frozenset({"uint8", "int32"}), "uint8"),
        ("float16", frozenset({"uint8", "float32"}), "float32"),
    ],
)
def test_a_dtype_the_engine_lacks_is_bridged_through_a_wider_one(
    dtype: str, native: frozenset[str], bridge: str
) -> None:
    x = np.array([1, 0, 1], dtype=dtype)
    result = staged(x, native=native)
    assert result.dtype == bridge and adapter_for(result.engine).dtype(result.engine) == bridge
    assert result.copied and result.engine.tolist() == [1, 0, 1]
    result.engine[:] = [0, 1, 0]
    result.write_back()
    assert x.dtype == np.dtype(dtype) and x.tolist() == [0, 1, 0]


def test_a_bfloat16_tensor_is_bridged_through_float32() -> None:
    torch = pytest.importorskip("torch")
    x = torch.tensor([1.5, -2.0], dtype=torch.bfloat16)
    result = staged(x, native=frozenset({"uint8", "float32"}))
    assert result.dtype == "float32" and result.engine.dtype == torch.float32
    result.engine.mul_(2)
    result.write_back()
    assert x.dtype == torch.bfloat16 and x.tolist() == [3.0, -4.0]


def test_the_bridges_widen() -> None:
    order = ["bool", "uint8", "int8", "int16", "int32", "int64", "float16", "bfloat16", "float32"]
    for narrow, wider in BRIDGES.items():
        assert wider and all(order.index(w) > order.index(narrow) for w in wider), narrow


@pytest.mark.parametrize("what", ["tensor", "output"])
def test_a_dtype_without_a_bridge_is_refused(what: str) -> None:
    x = np.ones(2, dtype=np.int64)  # int64 has no wider type
    with pytest.raises(InvalidArgumentError) as info:
        stage(
            adapter_for(x),
            x,
            "int64",
            native_dtypes=frozenset({"uint8", "float32"}),
            devices=CPU,
            backend="engine",
            warn_staging=print,
            what=what,
        )
    assert str(info.value) == (
        f"backend 'engine' cannot move dtype 'int64'; it moves float32, uint8. "
        f"HINT: convert the {what} first."
    )


def test_a_cpu_array_for_a_gpu_only_engine_is_refused() -> None:
    x = np.ones(2, dtype=np.float32)
    with pytest.raises(InvalidArgumentError) as info:
        staged(x, devices=frozenset({"cuda"}))
    assert str(info.value) == (
        "tensor is on the CPU, but backend 'engine' moves ['cuda'] tensors only. HINT: move it "
        "first (tensor.cuda()), or init a CPU backend such as gloo."
    )


class OnAGpu(NumpyAdapter):
    """numpy arrays that say they live on cuda:1; moving one makes a copy and records it."""

    def __init__(self) -> None:
        super().__init__()
        self.moves: list[str] = []

    def device(self, x: Any) -> str:
        return "cuda:1"

    def to_device(self, x: Any, device: str) -> Any:
        self.moves.append(device)
        return self.clone(x)


def test_a_device_the_engine_lacks_is_staged_through_host_memory_with_a_warning() -> None:
    adapter, warned = OnAGpu(), []
    x = np.arange(3, dtype=np.float32)
    result = stage(
        adapter,
        x,
        "float32",
        native_dtypes=ALL_NATIVE,
        devices=CPU,
        backend="engine",
        warn_staging=warned.append,
    )
    assert warned == ["cuda:1"] and adapter.moves == ["cpu"]
    assert result.copied and result.engine is not x
    result.engine += 10
    result.write_back()
    assert x.tolist() == [10.0, 11.0, 12.0]


def test_a_device_the_engine_moves_is_handed_over_without_a_warning() -> None:
    adapter, warned = OnAGpu(), []
    x = np.arange(3, dtype=np.float32)
    result = stage(
        adapter,
        x,
        "float32",
        native_dtypes=ALL_NATIVE,
        devices=frozenset({"cuda"}),
        backend="engine",
        warn_staging=warned.append,
    )
    assert result.engine is x and not result.copied
    assert warned == [] and adapter.moves == []


@pytest.mark.parametrize(("bound", "taken"), [("cuda:1", True), ("cuda:0", False), (None, True)])
def test_a_tensor_on_another_gpu_than_the_engines_is_refused_naming_both(
    bound: str | None, taken: bool
) -> None:
    """NCCL binds each rank to one GPU: a tensor on another (cuda:1 for a rank on cuda:0) is
    refused before the engine sees it (it would build a second communicator, or hang); an
    engine bound to no device takes any device of its type."""
    adapter, warned = OnAGpu(), []
    x = np.arange(3, dtype=np.float32)

    def run() -> Any:
        return stage(
            adapter,
            x,
            "float32",
            native_dtypes=ALL_NATIVE,
            devices=frozenset({"cuda"}),
            backend="nccl",
            warn_staging=warned.append,
            bound=bound,
        )

    if taken:
        assert run().engine is x
    else:
        with pytest.raises(InvalidArgumentError) as info:
            run()
        assert str(info.value) == (
            "tensor is on cuda:1, but this rank's 'nccl' communicator uses cuda:0 (one device "
            "per rank). HINT: move it first (tensor.to('cuda:0')), or init(device='cuda:1') if "
            "this rank should use cuda:1."
        )
    assert warned == [] and adapter.moves == []
