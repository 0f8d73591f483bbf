"""The hooks of every public collective: ``distcomm.add_hook(before, after)``, the
:class:`CollectiveEvent` each hook is given and the :class:`HookHandle` that removes them.

Registering a hook changes no class: each public collective tests :data:`registered` (empty
while no hook is) and makes its event where the call is numbered (the pipeline's side:
``distcomm.backend._pipeline.observing``, which reads the times from ``distcomm._device_clock``).
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from distcomm.errors import InvalidArgumentError

if TYPE_CHECKING:
    from distcomm.protocol import Communicator

__all__ = [
    "CollectiveEvent",
    "HookHandle",
    "add_hook",
    "after_hooks",
    "before_hooks",
    "registered",
]

Hook = Callable[["CollectiveEvent"], Any]


@dataclasses.dataclass(eq=False)
class CollectiveEvent:
    """One public collective, as the hooks see it.

    Attributes:
        op: the operation, e.g. ``"all_reduce"``, ``"broadcast_object"``.
        seq: its sequence number on ``group`` (the same on every member).
        group: the communicator it runs on.
        rank: this rank in ``group``.
        world_size: the number of ranks of ``group``.
        shape: the tensor's shape (None for barrier and the object collectives).
        numel: the tensor's element count (None likewise).
        dtype: the tensor's canonical dtype name, e.g. ``"float32"`` (None likewise).
        device: ``"cpu"`` or ``"cuda:N"`` (None likewise).
        root: the source or destination rank of a rooted operation, else None.
        reduce_op: the reduce op's name, e.g. ``"SUM"``, for reductions, else None.
        started: ``time.perf_counter()`` when ``before`` hooks were called (for a blocking call
            on a CUDA tensor: once the device finished the work queued before it).
        finished: ``time.perf_counter()`` when the call returned or raised (for ``after``; for
            a blocking call on a CUDA tensor that returned: once the device finished it).
        result: what the call returned (an async call's Work; an object collective's objects).
        error: the exception the call raised, else None (for ``after``).
    """

    op: str
    seq: int
    group: Communicator
    rank: int
    world_size: int
    shape: tuple[int, ...] | None = None
    numel: int | None = None
    dtype: str | None = None
    device: str | None = None
    root: int | None = None
    reduce_op: str | None = None
    started: float = 0.0
    finished: float = 0.0
    result: Any = None
    error: BaseException | None = None

    @property
    def nbytes(self) -> int | None:
        """The tensor's bytes (None for barrier and the object collectives)."""
        if self.numel is None or self.dtype is None:
            return None
        return self.numel * _ITEMSIZE.get(self.dtype, 1)


#: Bytes per element of each dtype name distcomm moves.
_ITEMSIZE = {"bool": 1, "uint8": 1, "int8": 1, "float16": 2, "bfloat16": 2, "int16": 2}
_ITEMSIZE.update({"int32": 4, "float32": 4, "int64": 8, "float64": 8})


class HookHandle:
    """What :func:`add_hook` returns: ``remove()`` it (or use it as a context manager)."""

    def __init__(self, before: Hook | None, after: Hook | None) -> None:
        self.before = before
        self.after = after

    def remove(self) -> None:
        """Stop calling these hooks; idempotent."""
        _registry.remove(self)

    def __enter__(self) -> HookHandle:
        return self

    def __exit__(self, *exc: object) -> None:
        self.remove()


def add_hook(before: Hook | None = None, after: Hook | None = None) -> HookHandle:
    """Call ``before(event)`` and ``after(event)`` around every public collective.

    Hooks see every communicator of the process (``event.group`` says which), in every thread;
    ``before`` hooks run in the order they were added, ``after`` hooks in reverse. A ``before``
    hook that raises stops the call before any traffic (the operation is not run, and its
    number is given back); ``after`` still runs, with ``event.error`` set. Exceptions of
    ``after`` hooks propagate to the caller.

    Args:
        before: called with a :class:`CollectiveEvent` once the call passed validation.
        after: called with the same event once the call returned (async: once it was issued;
            ``event.result`` is its Work) or raised.

    Returns:
        A handle: ``handle.remove()``, or ``with distcomm.add_hook(...):``.

    Raises:
        InvalidArgumentError: neither hook given, or one is not callable.
    """
    for name, hook in (("before", before), ("after", after)):
        if hook is not None and not callable(hook):
            raise InvalidArgumentError(
                f"add_hook: {name}={hook!r} is not callable. HINT: pass a function taking one "
                "CollectiveEvent."
            )
    if before is None and after is None:
        raise InvalidArgumentError(
            "add_hook: give before=, after= or both. HINT: add_hook(before=lambda e: print(e.op))"
        )
    handle = HookHandle(before, after)
    _registry.add(handle)
    return handle


class _Registry:
    """The hooks of the process (``handles`` changes in place: :data:`registered`)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.before: tuple[Hook, ...] = ()
        self.after: tuple[Hook, ...] = ()
        self.handles: list[HookHandle] = []

    def add(self, handle: HookHandle) -> None:
        with self.lock:
            self.handles.append(handle)
            self._publish()

    def remove(self, handle: HookHandle) -> None:
        with self.lock:
            if handle in self.handles:
                self.handles.remove(handle)
                self._publish()

    def _publish(self) -> None:
        self.before = tuple(h.before for h in self.handles if h.before is not None)
        self.after = tuple(h.after for h in reversed(self.handles) if h.after is not None)


_registry = _Registry()
#: The registered hooks' handles, in the order they were added (the same list as long as the
#: process runs: a communicator tests it on each call).
registered: list[HookHandle] = _registry.handles


def before_hooks() -> tuple[Hook, ...]:
    """The ``before`` hooks, in the order they were added."""
    return _registry.before


def after_hooks() -> tuple[Hook, ...]:
    """The ``after`` hooks, in reverse order."""
    return _registry.after
