"""Tests of distcomm.backend.devices: the CUDA device a GPU backend uses.

torch.cuda's device count is set by each test, so they run the same on machines with and without
a GPU; ``set_device`` is recorded instead of called.
"""

from __future__ import annotations

from typing import Any

import pytest

from distcomm.backend.devices import select_cuda_device
from distcomm.environment import LaunchInfo
from distcomm.errors import BackendUnavailableError, InvalidArgumentError

HINT = "use backend='gloo' for CPU tensors."
#: Local rank 3 of 4 on one node.
LAUNCH = LaunchInfo("env", 3, 4, 3, 4, 0, 1)


@pytest.fixture
def cuda(monkeypatch: pytest.MonkeyPatch) -> Any:
    """torch.cuda with ``visible`` devices (0 unless a test sets it) and ``current`` recorded."""
    torch = pytest.importorskip("torch")

    class Cuda:
        def __init__(self) -> None:
            self.visible = 0
            self.current: list[int] = []

    fake = Cuda()
    monkeypatch.setattr(torch.cuda, "device_count", lambda: fake.visible)
    monkeypatch.setattr(torch.cuda, "set_device", fake.current.append)
    return fake


def test_no_visible_device_is_unavailable_with_the_hint(cuda: Any) -> None:
    with pytest.raises(BackendUnavailableError) as info:
        select_cuda_device("nccl", LAUNCH, None, HINT)
    assert str(info.value) == (
        "nccl: no CUDA device is visible. HINT: check CUDA_VISIBLE_DEVICES, or use "
        "backend='gloo' for CPU tensors."
    )
    assert (info.value.backend, info.value.reason) == ("nccl", "no CUDA device")
    assert cuda.current == []


def test_the_cpu_is_refused_with_the_hint(cuda: Any) -> None:
    cuda.visible = 2
    with pytest.raises(InvalidArgumentError) as info:
        select_cuda_device("nccl", LAUNCH, "cpu", HINT)
    assert str(info.value) == f"backend 'nccl' was given device='cpu' for CUDA work. HINT: {HINT}"
    assert cuda.current == []


def test_an_index_beyond_the_visible_devices_is_named(cuda: Any) -> None:
    cuda.visible = 2
    with pytest.raises(InvalidArgumentError) as info:
        select_cuda_device("nccl", LAUNCH, "cuda:2", HINT)
    assert str(info.value) == (
        "device='cuda:2': only 2 CUDA device(s) are visible (cuda:0 to cuda:1). HINT: check "
        "CUDA_VISIBLE_DEVICES, or omit device to use the local rank's."
    )
    assert cuda.current == []


@pytest.mark.parametrize(
    ("device", "visible", "index"),
    [(None, 2, 1), ("cuda", 4, 3), ("cuda", 1, 0), ("cuda:1", 2, 1), ("cuda:0", 8, 0)],
)
def test_the_chosen_device_is_made_current(
    cuda: Any, device: str | None, visible: int, index: int
) -> None:
    """None and "cuda" take the local rank modulo the visible devices; "cuda:N" takes N."""
    torch = pytest.importorskip("torch")
    cuda.visible = visible
    assert select_cuda_device("nccl", LAUNCH, device, HINT) == torch.device("cuda", index)
    assert cuda.current == [index]
