"""The method-first doors of the seed projects: ``dist_init``, ``dist_finalize``,
``DistContext`` and ``@dist_mode``, over ``init`` and ``finalize``."""

from __future__ import annotations

import functools
import sys
import warnings
from collections.abc import Callable
from types import TracebackType
from typing import Any, TypeVar

from distcomm._runtime.getters import get_local_rank, is_initialized
from distcomm._runtime.lifecycle import finalize, init
from distcomm.errors import DistcommWarning, InvalidArgumentError

__all__ = ["DistContext", "dist_finalize", "dist_init", "dist_mode"]

F = TypeVar("F", bound=Callable[..., Any])


def dist_init(
    method: str | None = None, device_id: int | None = None, *, backend: str | None = None
) -> tuple[int, int]:
    """Initialise (method first) and return ``(rank, world_size)``.

    Calls ``init(backend=backend, method=method)``. If torch has already been imported and
    CUDA is available, it also calls ``torch.cuda.set_device``: with ``device_id`` when given,
    otherwise with the local rank modulo the number of visible devices. On a GPU backend
    (nccl) the communicator chose this rank's GPU at init and keeps it current: a
    ``device_id`` naming another only warns (DistcommWarning); to choose the GPU, pass
    ``init(device="cuda:N")``.

    Args:
        method: the launch method, as ``init``'s ``method``.
        device_id: the CUDA device to make current: a non-negative int, or None.
        backend: the backend, as ``init``'s ``backend``.

    Raises:
        InvalidArgumentError: ``device_id`` is not a non-negative int or None; or what
            ``init`` raises.
    """
    if device_id is not None and (
        not isinstance(device_id, int) or isinstance(device_id, bool) or device_id < 0
    ):
        raise InvalidArgumentError(f"device_id={device_id!r} must be a non-negative int or None")
    comm = init(backend=backend, method=method)
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available():
        wanted = (
            device_id if device_id is not None else get_local_rank() % torch.cuda.device_count()
        )
        use_cuda_device(comm, wanted, f"dist_init(device_id={device_id})")
    return comm.rank, comm.world_size


def use_cuda_device(comm: Any, wanted: int, asked: str, stacklevel: int = 3) -> None:
    """Make CUDA device ``wanted`` current (what ``asked``, a call, chose), unless ``comm`` is a
    GPU backend's bound to another at init (nccl: one GPU per rank): that one stays current,
    with a warning naming both (``stacklevel``: the caller of the caller, by default)."""
    import torch

    bound = getattr(comm, "bound_device", None)
    if bound is not None and bound.startswith("cuda:"):
        index = int(bound.partition(":")[2])
        if index != wanted:
            warnings.warn(
                f"{asked}: rank {comm.rank} stays on {bound}, the GPU its {comm.backend!r} "
                f"communicator uses (one GPU per rank), not cuda:{wanted}. HINT: to choose it, "
                "pass init(device='cuda:N'), or set CUDA_VISIBLE_DEVICES.",
                DistcommWarning,
                stacklevel=stacklevel,
            )
        wanted = index
    torch.cuda.set_device(wanted)


def dist_finalize() -> None:
    """The same as :func:`finalize`."""
    finalize()


class DistContext:
    """``with DistContext() as ctx:`` runs the block initialised (``ctx.rank``, ``ctx.world_size``).

    It initialises on entry (``dist_init(method, backend=backend)``) and finalizes on exit,
    even when the block raises, but only if this context did the initialising: nested inside
    an initialised program, it leaves the program's world alone.

    Args:
        method: the launch method, as ``init``'s ``method``.
        backend: the backend, as ``init``'s ``backend``.
    """

    def __init__(self, method: str | None = None, backend: str | None = None) -> None:
        self.method = method
        self.backend = backend
        self.rank = 0
        self.world_size = 1
        self._owner = False

    def __enter__(self) -> DistContext:
        self._owner = not is_initialized()
        self.rank, self.world_size = dist_init(self.method, backend=self.backend)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._owner:
            dist_finalize()


def dist_mode(func: F) -> F:
    """Decorator (it takes no arguments): run ``func`` inside a ``DistContext()`` and return
    its value."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        with DistContext():
            return func(*args, **kwargs)

    return wrapper  # type: ignore[return-value]
