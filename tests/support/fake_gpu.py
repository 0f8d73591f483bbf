"""A stand-in GPU for the tests of the times distcomm reports (CI has no GPU).

No CUDA tensor can be made without a GPU, so :meth:`FakeGpu.tensor` makes a CPU torch tensor
and *marks* it: the arrays layer (``TorchAdapter.device``) reports marked tensors on ``"cuda:0"``,
which is all that distcomm's timing and fakelink look at. ``torch.cuda.synchronize`` is replaced
by a GPU that needs ``work`` seconds to finish what is queued, on a fake clock
(``device_clock.perf_counter``) that only it advances; every synchronisation and clock reading
is logged in order, so a test sees whether the clock was read before or after the device was
waited for, without timing anything.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from distcomm import _device_clock as device_clock
from distcomm.backend.arrays import TorchAdapter

__all__ = ["FakeGpu"]


class FakeGpu:
    """Install with a pytest ``monkeypatch``; undone with it."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, work: float = 1.0) -> None:
        self.work = work
        self.clock = 0.0
        self.log: list[tuple[str, Any]] = []
        self.marked: list[torch.Tensor] = []  # kept alive: marks go by id()
        plain = TorchAdapter.device

        def device(adapter: TorchAdapter, x: Any) -> str:
            return "cuda:0" if any(x is t for t in self.marked) else plain(adapter, x)

        monkeypatch.setattr(TorchAdapter, "device", device)
        monkeypatch.setattr(torch.cuda, "synchronize", self.synchronize)
        monkeypatch.setattr(device_clock, "perf_counter", self.read)

    def tensor(self, numel: int = 4) -> torch.Tensor:
        """A tensor distcomm sees on ``cuda:0``."""
        t = torch.ones(numel)
        self.marked.append(t)
        return t

    def synchronize(self, device: Any = None) -> None:
        self.log.append(("synchronize", device))
        self.clock += self.work

    def read(self) -> float:
        self.log.append(("clock", self.clock))
        return self.clock

    def synchronised(self) -> list[Any]:
        """The devices synchronised, in order."""
        return [value for what, value in self.log if what == "synchronize"]
