"""The hook point around every public collective: ``before`` and ``after`` hooks see each call.

:func:`~distcomm.backend.events.add_hook` registers a pair of functions for every
communicator of the process; each public collective (the :data:`OBSERVED` methods of
:class:`~distcomm.backend.BaseCommunicator`) then calls ``before(event)`` once it passed
validation and was numbered (before the mismatch check, so a hook that raises stops the call
before any traffic), and ``after(event)`` when the call returns or raises (``event.error``),
once per public call. distcomm's own traffic inside a call (an object collective's size
exchange, new_group and split, a reduction emulated by gathering, the check) is not seen.

Registering a hook changes no method of any class. Each public collective's pipeline is
:func:`observed` once and for all: with no hook registered (:data:`registered` is empty) it
costs one test; with hooks, the event is made where ``_count`` numbers the call. A call
that the engine's plan runs (:meth:`~distcomm.backend._pipeline.steps.Steps._planned`,
before the pipeline) makes its event there (:func:`planned_event`, :func:`ended`): the hooks
and the profile keep the plans. Should the plan decline the call after the ``before`` hooks saw
it (``NotPlanned``), the event is handed to the pipeline (:class:`Carried`), which calls no
``before`` hook again. This module makes events and calls the hooks; the communicator keeps
its event (``_event``) itself (:meth:`~distcomm.backend._pipeline.steps.Steps._observe`).

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
from typing import TYPE_CHECKING, Any, TypeVar

from distcomm import _device_clock as device_clock
from distcomm._operations import named
from distcomm.backend import events
from distcomm.backend._pipeline import mismatch_check
from distcomm.backend.arrays import cached_adapter
from distcomm.backend.events import CollectiveEvent
from distcomm.protocol import ReduceOp

if TYPE_CHECKING:
    from distcomm.backend._pipeline.steps import Steps
    from distcomm.backend.arrays import Adapter

__all__ = [
    "OBSERVED",
    "PENDING",
    "UNSEEN",
    "Carried",
    "ended",
    "event_of",
    "observed",
    "planned_event",
    "started",
]

#: The public collectives the hooks see.
OBSERVED = named(observed=True)
#: The hooks registered (the list :mod:`distcomm.backend.events` keeps): empty when none.
registered = events.registered
#: What an observed call holds in ``_event`` until it is numbered.
PENDING: Any = object()
#: What ``_event`` holds while the hooks must not see a communicator's calls
#: (``Steps._setting_up``): as inside another public call.
UNSEEN: Any = object()
#: The reductions a plan runs (SUM only), for their event's ``reduce_op``.
_REDUCED = frozenset({"all_reduce", "reduce", "reduce_scatter_tensor"})

F = TypeVar("F", bound=Callable[..., Any])


class Carried:
    """An event whose ``before`` hooks ran on the plan's way, handed to the pipeline."""

    __slots__ = ("event",)

    def __init__(self, event: CollectiveEvent) -> None:
        self.event = event


def observed(steps: F) -> F:
    """``steps`` (a public collective, or its pipeline past the plan) as the hooks see it: while
    hooks are registered, its event is made where the call is numbered (:func:`before`) and the
    ``after`` hooks run when it returns or raises. A public call inside another is seen as part
    of it."""
    names = list(inspect.signature(steps).parameters)
    async_at = names.index("async_op") - 1 if "async_op" in names else None  # - 1: self

    @functools.wraps(steps)
    def method(self: Steps, *args: Any, **kwargs: Any) -> Any:
        made = self._event
        if made is None:
            if not registered:
                return steps(self, *args, **kwargs)
        elif made.__class__ is not Carried:  # inside another public call: part of it
            return steps(self, *args, **kwargs)
        if async_at is None:
            blocking = True
        else:
            blocking = not (args[async_at] if len(args) > async_at else kwargs.get("async_op"))
        _calling.blocking = blocking
        self._event = PENDING if made is None else made.event
        try:
            result = steps(self, *args, **kwargs)
        except BaseException as exc:
            event, self._event = self._event, None
            if event is not PENDING:
                _after(event, None, exc, False)
            raise
        event, self._event = self._event, None
        if event is not PENDING:
            _after(event, result, None, blocking)
        return result

    return method  # type: ignore[return-value]


#: Whether the call this thread is numbering blocks (``async_op`` false): set by the wrapper,
#: read by :func:`before`, which ``_count`` calls without the call's arguments.
_calling = threading.local()


def event_of(
    comm: Steps,
    op: str,
    x: Any,
    adapter: Adapter | None,
    root: int | None,
    reduce_op: ReduceOp | None,
) -> CollectiveEvent:
    """The event of the call ``comm`` is numbering (``comm.seq``)."""
    event = CollectiveEvent(op, comm.seq, comm, comm._rank, comm._world_size)  # type: ignore[arg-type]
    if x is not None and adapter is not None:
        event.shape = mismatch_check.shape_of(x)
        event.numel, event.dtype, event.device = (
            adapter.numel(x),
            adapter.dtype(x),
            adapter.device(x),
        )
    event.root = root
    event.reduce_op = None if reduce_op is None else reduce_op.name
    return event


def planned_event(comm: Steps, op: str, x: Any, root: int | None) -> CollectiveEvent:
    """The event of blocking call ``op`` that a plan runs (a SUM where ``op`` reduces)."""
    _calling.blocking = True
    adapter = cached_adapter(x)
    reduce_op = ReduceOp.SUM if op in _REDUCED else None
    return event_of(comm, op, x if adapter is not None else None, adapter, root, reduce_op)


def started(event: CollectiveEvent) -> None:
    """``event``'s call starts: its time, then the ``before`` hooks (one may raise)."""
    blocking = getattr(_calling, "blocking", True)
    event.started = device_clock.now(event.device if blocking else None)
    for hook in events.before_hooks():
        hook(event)


def ended(event: CollectiveEvent, error: BaseException | None) -> None:
    """The plan's call of ``event`` returned (``error`` None) or raised: the ``after`` hooks."""
    _after(event, None, error, error is None)


def _after(
    event: CollectiveEvent, result: Any, error: BaseException | None, synchronise: bool
) -> None:
    event.finished = device_clock.now(event.device if synchronise else None)
    event.result, event.error = result, error
    for hook in events.after_hooks():
        hook(event)
