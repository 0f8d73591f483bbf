"""The clock of every time distcomm reports (hooks, ``distcomm.profile``, the flight recorder,
``distcomm bench``): read once the device finished the work queued on it.

An engine that queues work on a CUDA stream (NCCL) returns from a blocking call when the work is
*queued*: torch's ``Work.wait()`` only makes the current stream wait. A host clock read then
measures the launch, not the transfer. :func:`now` synchronises a CUDA device before reading
``time.perf_counter()``, so the reading includes the device's work. For ``"cpu"`` (numpy arrays,
CPU tensors, byte buffers) and None it is ``time.perf_counter()`` alone: no synchronisation and
no import. A ``"cuda:N"`` device only comes from a torch tensor
(:meth:`~distcomm.backend.arrays.Adapter.device`), so torch is imported already when it is used.
"""

from __future__ import annotations

import sys
from time import perf_counter

__all__ = ["now", "synchronize"]


def synchronize(device: str) -> None:
    """Wait until the work queued on ``device`` is done: a CUDA device (``"cuda"``,
    ``"cuda:N"``) only; any other device is left alone."""
    if device.startswith("cuda"):
        sys.modules["torch"].cuda.synchronize(device)


def now(device: str | None = None) -> float:
    """``time.perf_counter()``, read after :func:`synchronize` (``device``) unless ``device`` is
    None (nothing to wait for) or ``"cpu"``."""
    if device is not None and device != "cpu":
        synchronize(device)
    return perf_counter()
