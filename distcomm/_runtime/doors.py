"""The method-first doors of the seed projects: ``dist_init``, ``dist_finalize``,
``DistContext`` and ``@dist_mode``, over ``init`` and ``finalize``."""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from types import TracebackType
from typing import Any, TypeVar

from distcomm._runtime.getters import get_local_rank, is_initialized
from distcomm._runtime.lifecycle import finalize, init
from distcomm.errors import InvalidArgumentError

__all__ = ["DistContext", "dist_finalize", "dist_init", "dist_mode"]

F = TypeVar("F", bound=Callable[..., Any])


def dist_init(
    method: str | None = None, device_id: int | None = None, *, backend: str | None = None
) -> tuple[int, int]:
    """Initialise (method first) and return ``(rank, world_size)``.

    When torch is imported and CUDA is available, also sets the current CUDA device:
    ``device_id`` if given, else the local rank modulo the visible devices.
    """
    if device_id is not None and (
        not isinstance(device_id, int) or isinstance(device_id, bool) or device_id < 0
    ):
        raise InvalidArgumentError(f"device_id={device_id!r} must be a non-negative int or None")
    comm = init(backend=backend, method=method)
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available():
        count = torch.cuda.device_count()
        torch.cuda.set_device(device_id if device_id is not None else get_local_rank() % count)
    return comm.rank, comm.world_size


def dist_finalize() -> None:
    """The same as :func:`finalize`."""
    finalize()


class DistContext:
    """``with DistContext() as ctx:`` runs the block initialised (``ctx.rank``, ``ctx.world_size``).

    It finalizes on exit, even when the block raises, but only if it was the one that
    initialised.
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
    """Decorator: run ``func`` inside a :class:`DistContext` and return its value."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        with DistContext():
            return func(*args, **kwargs)

    return wrapper  # type: ignore[return-value]
