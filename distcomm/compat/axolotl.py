"""axolotl's ``utils.distributed`` helpers on any distcomm backend.

Change ``from axolotl.utils import distributed`` to ``from distcomm.compat import axolotl as
distributed``. As in axolotl (which initialised torch through accelerate), the helpers that
communicate initialise distcomm on first use when the launch says there are several ranks.

Kept from axolotl: the names, signatures and return values; ``barrier()`` is a no-op when not
distributed; the gather helpers return a list on rank 0 and None elsewhere; non-distributed they
run ``fn`` and return ``[fn()]`` (gather) or ``fn()`` (compute/reduce).

Fixed here (axolotl differs):

- ``is_main_process()`` is global rank 0 (of the detected launch, before init). axolotl tested
  ``LOCAL_RANK == "0"``, which makes the first process of every node a "main".
- ``zero_only()`` yields True on main and False elsewhere: ``with zero_only() as main: if
  main: ...``. axolotl's yielded on every rank, so its block silently ran everywhere (Python
  cannot skip a ``with`` block). As a decorator (``@zero_only`` or ``@zero_only()``) it runs
  the function on main only; the others get None.
- ``gather_scalar_from_all_ranks`` / ``gather_from_all_ranks`` use the real world size (the
  ``world_size`` argument is accepted and ignored: axolotl needed it and broke with its default
  of 1) and keep each value's type: ints stay ints, with no float32 rounding of large ints.
- ``zero_first``, ``compute_and_broadcast`` and ``reduce_and_broadcast`` never leave ranks
  waiting: when ``fn`` raises on one rank the others raise RankFailedError naming it.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from types import TracebackType
from typing import Any

import distcomm
from distcomm import _peer_failures, helpers
from distcomm._peer_failures import Failure
from distcomm.errors import InvalidArgumentError, RankFailedError
from distcomm.protocol import Communicator

__all__ = [
    "barrier",
    "compute_and_broadcast",
    "gather_from_all_ranks",
    "gather_scalar_from_all_ranks",
    "is_distributed",
    "is_main_process",
    "reduce_and_broadcast",
    "zero_first",
    "zero_only",
]


def _peers() -> Communicator | None:
    """Initialise on first use under a multi-rank launch; the communicator, or None alone."""
    if not distcomm.is_initialized() and distcomm.detect_environment().world_size > 1:
        distcomm.init()
    return _peer_failures.peers()


def is_distributed() -> bool:
    """Whether this is one of several ranks (initialising distcomm when the launch says so)."""
    return _peers() is not None


def is_main_process() -> bool:
    """Whether this is global rank 0; True when not distributed."""
    return distcomm.get_rank() == 0


def barrier() -> None:
    """Wait for every rank; a no-op when not distributed."""
    comm = _peers()
    if comm is not None:
        comm.barrier()


@contextlib.contextmanager
def zero_first(is_main: bool) -> Iterator[None]:
    """Run the block on the main rank(s) first (``is_main``), then on the others."""
    _peers()
    with helpers.zero_first(is_main):
        yield


class zero_only:
    """``with zero_only() as main:`` gives True on the main rank only; ``@zero_only`` (or
    ``@zero_only()``) runs the decorated function on main only (others get None)."""

    def __init__(self, func: Callable[..., Any] | None = None) -> None:
        self._func = func
        if func is not None:
            functools.update_wrapper(self, func)

    def __enter__(self) -> bool:
        return is_main_process()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        return None

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self._func is None:  # @zero_only(): the function to wrap
            if len(args) != 1 or kwargs or not callable(args[0]):
                raise InvalidArgumentError(
                    f"zero_only() was called with {args!r} {kwargs!r}; it decorates one "
                    "function. HINT: @zero_only or @zero_only() above a def, or "
                    "`with zero_only() as main:`."
                )
            return zero_only(args[0])
        if not is_main_process():
            return None
        name = getattr(self._func, "__qualname__", repr(self._func))
        region = f"zero_only {name!r} (called at {_peer_failures.region_site()})"
        with _peer_failures.main_only_section(region):
            return self._func(*args, **kwargs)


def _scalar(value: Any) -> Any:
    """A 0-d tensor or array as its Python number; anything else as it is."""
    item = getattr(value, "item", None)
    return item() if callable(item) and getattr(value, "ndim", None) == 0 else value


def _gather(fn: Callable[[], Any], where: str, convert: Callable[[Any], Any]) -> list[Any] | None:
    comm = _peers()
    if comm is None:
        return [convert(fn())]
    error: BaseException | None = None
    try:
        value: Any = convert(fn())
    except BaseException as exc:
        error, value = exc, Failure.now(comm.rank)
    values = comm.gather_object(value, 0)
    if error is not None:
        raise error
    if values is None:
        return None
    failed = next((v for v in values if isinstance(v, Failure)), None)
    if failed is not None:
        raise failed.error(where)
    return values


def gather_scalar_from_all_ranks(fn: Callable[[], Any], world_size: int = 1) -> list[Any] | None:
    """``fn()`` on every rank; rank 0 gets the list of values (ints stay ints), others None.

    ``world_size`` is ignored: the real world size is used. If ``fn`` raises on a rank, that rank
    re-raises and rank 0 raises RankFailedError; the other ranks return None as usual.
    """
    return _gather(fn, "gather_scalar_from_all_ranks", _scalar)


def gather_from_all_ranks(fn: Callable[[], Any], world_size: int = 1) -> list[Any] | None:
    """``fn()`` on every rank (any picklable value); rank 0 gets the list, others None."""
    return _gather(fn, "gather_from_all_ranks", lambda value: value)


def compute_and_broadcast(fn: Callable[[], Any]) -> Any:
    """``fn()`` on rank 0 only; every rank returns its value."""
    comm = _peers()
    if comm is None:
        return _scalar(fn())
    return _peer_failures.share_from(comm, 0, lambda: _scalar(fn()), "compute_and_broadcast")


def reduce_and_broadcast(fn1: Callable[[], Any], fn2: Callable[[list[Any]], Any]) -> Any:
    """``fn1()`` on every rank, ``fn2(values)`` on rank 0; every rank returns fn2's result."""
    comm = _peers()
    if comm is None:
        return fn2([fn1()])
    error: BaseException | None = None
    try:
        value: Any = fn1()
    except BaseException as exc:
        error, value = exc, Failure.now(comm.rank)
    values = comm.gather_object(value, 0)

    def reduce() -> Any:
        assert values is not None
        failed = next((v for v in values if isinstance(v, Failure)), None)
        if failed is not None:
            raise failed.error("reduce_and_broadcast's fn1")
        return fn2(values)

    try:
        return _peer_failures.share_from(comm, 0, reduce, "reduce_and_broadcast")
    except RankFailedError:
        if error is not None:
            raise error from None
        raise
