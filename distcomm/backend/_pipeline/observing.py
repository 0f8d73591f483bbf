"""The hook point around every public collective: ``before`` and ``after`` hooks see each call.

:func:`~distcomm.backend.events.add_hook` registers a pair of functions for every
communicator of the process; each public collective (the :data:`OBSERVED` methods of
:class:`~distcomm.backend.BaseCommunicator`) then calls ``before(event)`` once it passed
validation and was numbered (before the mismatch check, so a hook that raises stops the call
before any traffic), and ``after(event)`` when the call returns or raises (``event.error``),
once per public call. distcomm's own traffic inside a call (an object collective's size
exchange, new_group and split, a reduction emulated by gathering, the check) is not seen.

While no hook is registered the methods are the plain ones: the wrappers are put on the class
when the first hook is added and taken off when the last is removed, and the step that numbers
an operation tests one class attribute (``_observing``). The engine's plans
(:mod:`~distcomm.backend._pipeline.plans`) and the uneven all-to-all's way past the records are
bypassed while hooks are registered, so that every call is seen.

``event.started`` and ``event.finished`` come from :mod:`~distcomm._device_clock`:
for a blocking call on a CUDA tensor each is read once the device finished its queued work (at
the start: the work queued before the call; at the end: the call's own), so the time includes
the transfer, not only its launch. An async call (``async_op=True``) is never synchronised (that
would make it blocking): its time is the time to issue it. A call that raised is not
synchronised at the end (a failed device may hang there). Only calls with a hook registered pay
this; CPU tensors and numpy arrays never synchronise.
"""

from __future__ import annotations

import functools
import inspect
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from distcomm import _device_clock as device_clock
from distcomm._operations import named
from distcomm.backend import events
from distcomm.backend._pipeline import agreement
from distcomm.backend.events import CollectiveEvent

if TYPE_CHECKING:
    from distcomm.backend._pipeline.steps import Steps
    from distcomm.backend.arrays import Adapter
    from distcomm.protocol import ReduceOp

__all__ = ["OBSERVED", "PENDING", "before", "wrap"]

#: The public collectives the hooks see.
OBSERVED = named(observed=True)
#: What a method wrapped for the hooks passes to its call until the call is numbered.
PENDING: Any = object()
#: The plain methods of BaseCommunicator while the wrappers are on (None: inherited).
_plain: dict[str, Any] = {}


def wrap(on: bool) -> None:
    """Put the observing wrappers on :class:`~distcomm.backend.BaseCommunicator` (``on``) or
    take them off; :mod:`distcomm.backend.events` calls it, under its lock, as hooks come and
    go."""
    from distcomm.backend.communicator import BaseCommunicator

    if on and not _plain:
        for name in OBSERVED:
            _plain[name] = BaseCommunicator.__dict__.get(name)
            public = getattr(BaseCommunicator, name)
            steps = getattr(BaseCommunicator, _STEPS.get(name, name))
            wrapper = _observed(steps, _async_index(public))
            setattr(BaseCommunicator, name, functools.wraps(public)(wrapper))
        BaseCommunicator._kit_observing = True
    elif not on and _plain:
        BaseCommunicator._kit_observing = False
        for name, plain in _plain.items():
            if plain is None:
                delattr(BaseCommunicator, name)
            else:
                setattr(BaseCommunicator, name, plain)
        _plain.clear()


_STEPS = {
    "all_reduce": "_kit_all_reduce_steps",
    "all_to_all_single": "_kit_all_to_all_single_steps",
}
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
        if self._kit_event is not None:  # a public call inside another: seen as part of it
            return method(self, *args, **kwargs)
        if async_at is None:
            blocking = True
        else:
            blocking = not (args[async_at] if len(args) > async_at else kwargs.get("async_op"))
        _calling.blocking = blocking
        self._kit_event = PENDING
        try:
            result = method(self, *args, **kwargs)
        except BaseException as exc:
            event, self._kit_event = self._kit_event, None
            if event is not PENDING:
                _after(event, None, exc, False)
            raise
        event, self._kit_event = self._kit_event, None
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
    event = CollectiveEvent(op, comm.seq, comm, comm._kit_rank, comm._kit_world_size)  # type: ignore[arg-type]
    if x is not None and adapter is not None:
        event.shape = agreement.shape_of(x)
        event.numel, event.dtype, event.device = (
            adapter.numel(x),
            adapter.dtype(x),
            adapter.device(x),
        )
    event.root = root
    event.reduce_op = None if reduce_op is None else reduce_op.name
    comm._kit_event = event
    blocking = getattr(_calling, "blocking", True)
    event.started = device_clock.now(event.device if blocking else None)
    try:
        for hook in events.before_hooks():
            hook(event)
    except BaseException:
        comm.seq -= 1  # not run: the next call takes this number
        raise


def _after(
    event: CollectiveEvent, result: Any, error: BaseException | None, synchronise: bool
) -> None:
    event.finished = device_clock.now(event.device if synchronise else None)
    event.result, event.error = result, error
    for hook in events.after_hooks():
        hook(event)
