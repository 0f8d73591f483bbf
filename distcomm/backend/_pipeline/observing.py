"""The hook point around every public collective: ``before`` and ``after`` hooks see each call.

:func:`add_hook` registers a pair of functions for every communicator of the process; each
public collective (the :data:`OBSERVED` methods of :class:`~distcomm.backend.BaseCommunicator`)
then calls ``before(event)`` once it passed validation and was numbered (before the mismatch
check, so a hook that raises stops the call before any traffic), and ``after(event)`` when the
call returns or raises (``event.error``), once per public call. distcomm's own traffic inside a
call (an object collective's size exchange, new_group and split, a reduction emulated by
gathering, the check) is not seen.

While no hook is registered the methods are the plain ones: the wrappers are put on the class
when the first hook is added and taken off when the last is removed, and the step that numbers
an operation tests one class attribute (``_observing``). The all_reduce shortcut of a backend
(``_all_reduce_plain``) is bypassed while hooks are registered, so that every call is seen.

``event.started`` and ``event.finished`` come from :mod:`~distcomm.backend._pipeline.device_clock`:
for a blocking call on a CUDA tensor each is read once the device finished its queued work (at
the start: the work queued before the call; at the end: the call's own), so the time includes
the transfer, not only its launch. An async call (``async_op=True``) is never synchronised (that
would make it blocking): its time is the time to issue it. A call that raised is not
synchronised at the end (a failed device may hang there). Only calls with a hook registered pay
this; CPU tensors and numpy arrays never synchronise.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from distcomm._operations import named
from distcomm.backend._pipeline import agreement, device_clock
from distcomm.errors import InvalidArgumentError

if TYPE_CHECKING:
    from distcomm.backend._pipeline.steps import Steps
    from distcomm.backend.arrays import Adapter
    from distcomm.protocol import Communicator, ReduceOp

__all__ = ["OBSERVED", "PENDING", "CollectiveEvent", "HookHandle", "add_hook", "before"]

#: The public collectives the hooks see.
OBSERVED = named(observed=True)
#: What a method wrapped for the hooks passes to its call until the call is numbered.
PENDING: Any = object()

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
    """The hooks of the process, and the wrappers they need on the communicator class."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.before: tuple[Hook, ...] = ()
        self.after: tuple[Hook, ...] = ()
        self.handles: list[HookHandle] = []
        self.plain: dict[str, Any] = {}

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
        from distcomm.backend.communicator import BaseCommunicator

        if self.handles and not self.plain:
            for name in OBSERVED:
                self.plain[name] = BaseCommunicator.__dict__.get(name)
                public = getattr(BaseCommunicator, name)
                steps = getattr(BaseCommunicator, _STEPS.get(name, name))
                wrapper = _observed(steps, _async_index(public))
                setattr(BaseCommunicator, name, functools.wraps(public)(wrapper))
            BaseCommunicator._observing = True
        elif not self.handles and self.plain:
            BaseCommunicator._observing = False
            for name, plain in self.plain.items():
                if plain is None:
                    delattr(BaseCommunicator, name)
                else:
                    setattr(BaseCommunicator, name, plain)
            self.plain.clear()


_registry = _Registry()
#: The method a wrapper calls instead of the public one: all_reduce's steps past its shortcut.
_STEPS = {"all_reduce": "_all_reduce_steps"}
#: Whether the call this thread is numbering blocks (``async_op`` false): set by the wrapper,
#: read by :func:`before`, which ``_count`` calls without the call's arguments.
_calling = threading.local()


def _async_index(public: Callable[..., Any]) -> int | None:
    """Where ``async_op`` sits among a public method's positional arguments (None: it has none)."""
    names = list(inspect.signature(public).parameters)
    return names.index("async_op") - 1 if "async_op" in names else None  # - 1: self


def _observed(method: Callable[..., Any], async_at: int | None) -> Callable[..., Any]:
    """``method`` calling the hooks: the event is made by :func:`before` (at numbering)."""

    def observed(self: Steps, *args: Any, **kwargs: Any) -> Any:
        if self._event is not None:  # a public call inside another: seen as part of it
            return method(self, *args, **kwargs)
        if async_at is None:
            blocking = True
        else:
            blocking = not (args[async_at] if len(args) > async_at else kwargs.get("async_op"))
        _calling.blocking = blocking
        self._event = PENDING
        try:
            result = method(self, *args, **kwargs)
        except BaseException as exc:
            event, self._event = self._event, None
            if event is not PENDING:
                _after(event, None, exc, False)
            raise
        event, self._event = self._event, None
        if event is not PENDING:
            _after(event, result, None, blocking)
        return result

    return observed


def before(
    comm: Steps,
    op: str,
    x: Any,
    adapter: Adapter | None,
    root: int | None,
    reduce_op: ReduceOp | None,
) -> None:
    """Make the event of the call being numbered on ``comm`` and call the ``before`` hooks."""
    event = CollectiveEvent(op, comm.seq, comm, comm._rank, comm._world_size)  # type: ignore[arg-type]
    if x is not None and adapter is not None:
        event.shape = agreement.shape_of(x)
        event.numel, event.dtype, event.device = (
            adapter.numel(x),
            adapter.dtype(x),
            adapter.device(x),
        )
    event.root = root
    event.reduce_op = None if reduce_op is None else reduce_op.name
    comm._event = event
    blocking = getattr(_calling, "blocking", True)
    event.started = device_clock.now(event.device if blocking else None)
    try:
        for hook in _registry.before:
            hook(event)
    except BaseException:
        comm.seq -= 1  # not run: the next call takes this number
        raise


def _after(
    event: CollectiveEvent, result: Any, error: BaseException | None, synchronise: bool
) -> None:
    event.finished = device_clock.now(event.device if synchronise else None)
    event.result, event.error = result, error
    for hook in _registry.after:
        hook(event)
