"""The CUDA device a GPU-capable backend uses, chosen once at ``init``.

Imports torch only when called (never at ``import distcomm``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from distcomm.errors import BackendUnavailableError, InvalidArgumentError

if TYPE_CHECKING:
    from distcomm.environment import LaunchInfo

__all__ = ["select_cuda_device"]


def select_cuda_device(backend: str, launch: LaunchInfo, device: str | None, hint: str) -> Any:
    """Make the backend's CUDA device current and return it as a torch.device.

    ``device`` is None or ``"cuda"`` (the local rank modulo the visible devices, so one visible
    device under ``--gpus-per-task`` is device 0) or ``"cuda:N"`` (as :func:`init` normalised it).

    Raises:
        BackendUnavailableError: no CUDA device is visible (``hint`` says what to do instead).
        InvalidArgumentError: ``"cpu"``, or an index beyond the visible devices.
    """
    import torch

    if device == "cpu":
        raise InvalidArgumentError(
            f"backend {backend!r} was given device='cpu' for CUDA work. HINT: {hint}"
        )
    count = torch.cuda.device_count()
    if count == 0:
        raise BackendUnavailableError(
            f"{backend}: no CUDA device is visible. HINT: check CUDA_VISIBLE_DEVICES, or {hint}",
            backend=backend,
            reason="no CUDA device",
        )
    index = launch.local_rank % count if device in (None, "cuda") else int(str(device)[5:])
    if not 0 <= index < count:
        raise InvalidArgumentError(
            f"device={device!r}: only {count} CUDA device(s) are visible (cuda:0 to "
            f"cuda:{count - 1}). HINT: check CUDA_VISIBLE_DEVICES, or omit device to use the "
            "local rank's."
        )
    torch.cuda.set_device(index)
    return torch.device("cuda", index)
