"""Fault injection: make one rank slow, failing, absent or different at a chosen collective.

For users' own tests: reproduce a hang or a mismatch in milliseconds and assert on distcomm's
error. Pass faults to :func:`~distcomm.testing.run_threads` (``faults=[...]``) or apply them to
a communicator with :func:`inject`::

    from distcomm.testing import faults, run_threads

    run_threads(train_step, 4, faults=[faults.resize(rank=2, at=3)])  # CollectiveMismatchError

``at`` is the collective's sequence number on the rank's communicator (1 for its first
collective; object collectives count once each, point-to-point messages not at all), so a fault
hits the same call in every run. A fault acts before the call reaches distcomm: ``skip`` and
``raise_at`` leave the call out entirely, ``resize`` passes the engine a tensor of another size.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import time
from collections.abc import Callable, Iterable
from typing import Any

from distcomm._operations import named
from distcomm.backend import CompletedWork, adapter_for
from distcomm.errors import InvalidArgumentError

__all__ = ["Fault", "checked", "delay", "inject", "raise_at", "resize", "skip"]


@dataclasses.dataclass(frozen=True)
class Fault:
    """One fault: what happens to ``rank`` at collective ``at`` (None: at every collective)."""

    kind: str
    rank: int
    at: int | None
    seconds: float = 0.0
    error: BaseException | None = None
    by: int = 0

    def __post_init__(self) -> None:
        if not isinstance(self.rank, int) or isinstance(self.rank, bool) or self.rank < 0:
            raise InvalidArgumentError(
                f"faults.{self.kind}: rank={self.rank!r} must be a rank (an int >= 0)"
            )
        if self.at is not None and (
            not isinstance(self.at, int) or isinstance(self.at, bool) or self.at < 1
        ):
            raise InvalidArgumentError(
                f"faults.{self.kind}: at={self.at!r} must be a collective's sequence number "
                "(an int >= 1: 1 is the rank's first collective). HINT: distcomm errors name "
                "the operation as '#N'; pass that N."
            )


def delay(rank: int, seconds: float, at: int | None = None) -> Fault:
    """``rank`` sleeps ``seconds`` before collective ``at`` (None: before every collective):
    a slow rank, which the others wait for."""
    if not isinstance(seconds, (int, float)) or seconds < 0:
        raise InvalidArgumentError(f"faults.delay: seconds={seconds!r} must be a number >= 0")
    return Fault("delay", rank, at, seconds=float(seconds))


def raise_at(rank: int, at: int, error: BaseException | None = None) -> Fault:
    """``rank`` raises ``error`` (default: RuntimeError naming the fault) instead of calling
    collective ``at``: a rank that crashes while the others wait for it."""
    if error is not None and not isinstance(error, BaseException):
        raise InvalidArgumentError(
            f"faults.raise_at: error={error!r} must be an exception instance, e.g. "
            "RuntimeError('boom')"
        )
    return Fault("raise_at", rank, at, error=error)


def skip(rank: int, at: int) -> Fault:
    """``rank`` does not call collective ``at`` and goes on to its next line (the call returns
    None, or a completed Work with ``async_op=True``): a collective inside an ``if`` only
    some ranks take. The others hang in it until their timeout, or pair it with the skipping
    rank's next collective, which the mismatch check catches when they differ."""
    return Fault("skip", rank, at)


def resize(rank: int, at: int, by: int = 1) -> Fault:
    """``rank`` passes collective ``at`` a flat copy of its first tensor argument, ``by``
    elements longer (negative: shorter): different sizes on different ranks. Meant for the
    operations of one tensor (all_reduce, reduce, broadcast); where a second argument must
    match the first, the call fails validation on that rank instead. Results land in the copy,
    not in the caller's tensor."""
    if not isinstance(by, int) or isinstance(by, bool) or by == 0:
        raise InvalidArgumentError(f"faults.resize: by={by!r} must be a non-zero int")
    return Fault("resize", rank, at, by=by)


def checked(faults: Iterable[Any], world_size: int) -> list[Fault]:
    """``faults`` as a list, each a :class:`Fault` for a rank of a world of ``world_size``.

    Raises:
        InvalidArgumentError: an item is not a Fault, or names a rank outside the world.
    """
    out = list(faults)
    for fault in out:
        if not isinstance(fault, Fault):
            raise InvalidArgumentError(
                f"{fault!r} is not a fault. HINT: make one with distcomm.testing.faults.delay, "
                "raise_at, skip or resize."
            )
        if fault.rank >= world_size:
            raise InvalidArgumentError(
                f"faults.{fault.kind}: rank={fault.rank} is not a rank of a world of "
                f"{world_size}; valid: 0..{world_size - 1}"
            )
    return out


def inject(comm: Any, faults: Iterable[Fault]) -> None:
    """Apply the ``faults`` for ``comm``'s rank to ``comm`` (others' are ignored).

    Raises:
        InvalidArgumentError: an item is not a :class:`Fault`, or names a rank outside the
            communicator.
    """
    mine = [f for f in checked(faults, comm.world_size) if f.rank == comm.rank]
    if not mine:
        return
    fired: set[Fault] = set()
    for name in named(observed=True):
        setattr(comm, name, _faulty(comm, name, tuple(mine), fired))


def _faulty(
    comm: Any, name: str, faults: tuple[Fault, ...], fired: set[Fault]
) -> Callable[..., Any]:
    """``comm``'s method ``name`` with ``faults``; the method is looked up at each call, so that
    hooks added later see the call."""
    public = getattr(type(comm), name)

    @functools.wraps(public)
    def call(*args: Any, **kwargs: Any) -> Any:
        method = getattr(type(comm), name)
        at = comm.seq + 1
        for fault in faults:
            if fault.at is not None and (fault.at != at or fault in fired):
                continue
            if fault.at is not None:
                fired.add(fault)  # once: a skipped call leaves seq where it was
            if fault.kind == "delay":
                time.sleep(fault.seconds)
            elif fault.kind == "raise_at":
                raise fault.error or RuntimeError(
                    f"fault injected: rank {comm.rank} raises at {name} #{at}"
                )
            elif fault.kind == "skip":
                call = inspect.signature(public).bind(comm, *args, **kwargs)
                return CompletedWork() if call.arguments.get("async_op") else None
            elif fault.kind == "resize":
                args = _resized(args, fault.by)
        return method(comm, *args, **kwargs)

    return call


def _resized(args: tuple[Any, ...], by: int) -> tuple[Any, ...]:
    """``args`` with the first tensor or array replaced by a flat copy ``by`` elements longer."""
    for index, arg in enumerate(args):
        try:
            adapter = adapter_for(arg)
        except InvalidArgumentError:
            continue
        numel = adapter.numel(arg)
        longer = adapter.empty(arg, max(numel + by, 0))
        flat = adapter.flat(longer)
        kept = min(numel, numel + by)
        adapter.copy_(flat[:kept], adapter.flat(adapter.clone(arg))[:kept])
        return (*args[:index], longer, *args[index + 1 :])
    return args
