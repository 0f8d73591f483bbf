"""Ready-made :class:`~distcomm.protocol.Work` handles for backends."""

from __future__ import annotations

from collections.abc import Callable

from distcomm.protocol import Work

__all__ = ["ChainedWork", "CompletedWork"]


class CompletedWork:
    """A Work that is already complete (eager backends, worlds of 1)."""

    def __init__(self, source: int | None = None) -> None:
        self.source = source

    def wait(self, timeout: float | None = None) -> bool:
        return True

    def is_completed(self) -> bool:
        return True

    def __repr__(self) -> str:
        return "<CompletedWork>"


class ChainedWork:
    """A Work that runs ``finish`` once, in the waiting thread, after ``inner`` completes.

    BaseCommunicator uses it to copy results back into the caller's tensor (staged, bridged or
    non-contiguous inputs) and to finish emulated ops such as AVG. Results are in the caller's
    tensor once :meth:`wait` returns or :meth:`is_completed` returns True; call either from the
    thread that owns the communicator.
    """

    def __init__(self, inner: Work, finish: Callable[[], None]) -> None:
        self._inner = inner
        self._finish: Callable[[], None] | None = finish

    @property
    def source(self) -> int | None:
        """For an irecv: the rank the message came from, once complete."""
        return getattr(self._inner, "source", None)

    def wait(self, timeout: float | None = None) -> bool:
        self._inner.wait(timeout)
        finish, self._finish = self._finish, None
        if finish is not None:
            finish()
        return True

    def is_completed(self) -> bool:
        """True once the result is in the caller's tensor (finishing it here if need be)."""
        if self._finish is None:
            return True
        if not self._inner.is_completed():
            return False
        self.wait()
        return True

    def __repr__(self) -> str:
        return f"<ChainedWork of {self._inner!r}>"
