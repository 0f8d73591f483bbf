"""Rank-zero helpers: run code on the main rank first, or only there, and share what it made.

Every helper here is safe when the code it runs raises on some ranks: the others learn it at the
helper's next synchronisation point and raise :class:`~distcomm.errors.RankFailedError` naming
the rank that failed (with its traceback), instead of waiting for it until the timeout. The rank
that raised re-raises its own exception.

"Main" is rank 0 of the default communicator (before ``init()``: of the detected launch). In a
world of 1 the helpers just run the code. While waiting for main, the other ranks are inside a
collective, so main's work is bounded by the communicator's timeout (``DISTCOMM_TIMEOUT``,
default 1800 s): raise it for long data preparation.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import pickle
import threading
import traceback
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, TypeVar

from distcomm import objects
from distcomm.collectives import resolve_group
from distcomm.errors import InvalidArgumentError, RankFailedError
from distcomm.lifecycle import get_rank, get_world_size, is_initialized
from distcomm.protocol import Communicator

__all__ = [
    "Failure",
    "in_main_only_section",
    "main_only_section",
    "main_process_only",
    "rank_prefixed_message",
    "run_on_main",
    "settle",
    "share_from",
    "zero_first",
]

F = TypeVar("F", bound=Callable[..., Any])


class _Sections(threading.local):
    depth = 0


_sections = _Sections()


@dataclasses.dataclass(frozen=True)
class Failure:
    """What a rank sends its peers when the code a helper ran there raised."""

    rank: int
    traceback: str

    @classmethod
    def now(cls, rank: int) -> Failure:
        """The exception being handled, on ``rank``."""
        return cls(rank, traceback.format_exc())

    def error(self, where: str) -> RankFailedError:
        """The error the other ranks raise."""
        return RankFailedError(
            self.rank,
            self.traceback,
            f"rank {self.rank} raised inside {where}, so this rank stops too. "
            f"Rank {self.rank}'s traceback:\n{self.traceback.rstrip()}",
        )


def in_main_only_section() -> bool:
    """Whether this thread is inside a main-only section (:func:`main_process_only`'s body).

    Only main runs there, so helpers and compat functions must not synchronise with the other
    ranks: they run the code locally instead.
    """
    return _sections.depth > 0


@contextlib.contextmanager
def main_only_section() -> Iterator[None]:
    """Mark a main-only section for this thread (nested sections count)."""
    _sections.depth += 1
    try:
        yield
    finally:
        _sections.depth -= 1


def peers(group: Any = None) -> Communicator | None:
    """The communicator a helper synchronises on; None when there is no one to wait for.

    None inside a main-only section and in a world of 1. Before ``init()`` under a launch of
    several ranks, NotInitializedError with the hint (as every collective).
    """
    if _sections.depth > 0:
        return None
    comm = resolve_group(group)
    return comm if comm.world_size > 1 else None


def settle(comm: Communicator, failure: Failure | None, where: str) -> None:
    """Every rank says whether it failed; a rank that did not, but learns of one, raises.

    A rank that failed passes its :class:`Failure` and re-raises its own exception afterwards.
    """
    outcomes = comm.all_gather_object(failure)
    if failure is None:
        failed = next((f for f in outcomes if f is not None), None)
        if failed is not None:
            raise failed.error(where)


def share_from(comm: Communicator, src: int, fn: Callable[[], Any], where: str) -> Any:
    """Run ``fn`` on rank ``src`` only; every rank returns its result (others: a copy).

    When ``fn`` raises on ``src``, the other ranks raise RankFailedError at once. A result that
    cannot be pickled is an InvalidArgumentError on every rank.
    """
    if comm.rank != src:
        got = comm.broadcast_object(None, src)
        if isinstance(got, Failure):
            raise got.error(where)
        return objects.unpack(memoryview(got))
    try:
        value = fn()
    except RankFailedError as exc:  # fn found another rank's failure: pass that one on
        comm.broadcast_object(Failure(exc.rank, exc.traceback), src)
        raise
    except BaseException:
        comm.broadcast_object(Failure.now(comm.rank), src)
        raise
    try:
        payload = objects.pack(value)
    except Exception as exc:
        text = (
            f"{where} returned {type(value).__name__!r}, which cannot be pickled to send to "
            f"the other ranks: {exc}. HINT: return plain data (numbers, strings, lists, dicts, "
            "arrays, tensors)."
        )
        comm.broadcast_object(Failure(comm.rank, text), src)
        raise InvalidArgumentError(text) from exc
    comm.broadcast_object(pickle.PickleBuffer(payload), src)
    return value


def _is_main(comm: Communicator | None) -> bool:
    return get_rank() == 0 if comm is None else comm.rank == 0


@contextlib.contextmanager
def zero_first(is_main: bool | None = None, *, group: Any = None) -> Iterator[None]:
    """Run the ``with`` block on main first, then on the other ranks.

    Typical use: main downloads or preprocesses a dataset, the others then load it from the
    cache. The other ranks wait before their block; main's block runs without waiting.

    Args:
        is_main: whether this rank runs first; default: rank 0 of the group. Several or no
            ranks may say True.
        group: the communicator to synchronise (default: the default communicator).

    Raises:
        RankFailedError: on a waiting rank, when a main rank's block raised.
    """
    comm = peers(group)
    main = _is_main(comm) if is_main is None else bool(is_main)
    if comm is None:
        yield
        return
    if not main:
        settle(comm, None, "zero_first")
        yield
        return
    try:
        yield
    except BaseException:
        settle(comm, Failure.now(comm.rank), "zero_first")
        raise
    settle(comm, None, "zero_first")


def main_process_only(function: F) -> F:
    """Decorator: run ``function`` on main only; every rank returns main's result.

    The result is broadcast at the outermost decorated call: calls nested inside one (which
    only main makes) run directly. If the function raises on main, the other ranks raise
    RankFailedError at once instead of waiting.
    """

    @functools.wraps(function)
    def main_only(*args: Any, **kwargs: Any) -> Any:
        comm = peers()

        def run() -> Any:
            with main_only_section():
                return function(*args, **kwargs)

        if comm is None:
            return run() if _is_main(None) else None
        return share_from(comm, 0, run, f"{function.__qualname__} (main_process_only)")

    return main_only  # type: ignore[return-value]


def run_on_main(
    func: Callable[..., Any],
    args: Sequence[Any] | None = None,
    kwargs: Mapping[str, Any] | None = None,
    post_func: Callable[..., Any] | None = None,
    post_args: Sequence[Any] | None = None,
    post_kwargs: Mapping[str, Any] | None = None,
    run_post_on_main: bool = False,
) -> Any:
    """Run ``func`` on main; then ``post_func`` on the other ranks (all: ``run_post_on_main``).

    Every rank returns ``func``'s result (from main). The ranks wait for main's ``func``
    before ``post_func``, and for every ``post_func`` before returning, so what ``func`` made
    (a downloaded file, a vocabulary) can be loaded by ``post_func``.

    Raises:
        RankFailedError: on the ranks where nothing failed, when ``func`` (on main) or a
            ``post_func`` raised elsewhere; the rank that raised re-raises its own exception.
    """
    result = main_process_only(func)(*(args or ()), **(kwargs or {}))
    if post_func is None:
        return result
    comm = peers()
    try:
        if run_post_on_main or not _is_main(comm):
            post_func(*(post_args or ()), **(post_kwargs or {}))
    except BaseException:
        if comm is not None:
            settle(comm, Failure.now(comm.rank), "run_on_main's post_func")
        raise
    if comm is not None:
        settle(comm, None, "run_on_main's post_func")
    return result


def rank_prefixed_message(message: str) -> str:
    """``"[rank: N] message"`` when the world has several ranks (or is initialised), else the
    message as it is."""
    if is_initialized() or get_world_size() > 1:
        return f"[rank: {get_rank()}] {message}"
    return message
