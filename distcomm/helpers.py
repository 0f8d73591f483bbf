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
import functools
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, TypeVar

from distcomm._peer_failures import (
    Failure,
    main_only_section,
    peers,
    region_site,
    settle,
    share_from,
)
from distcomm._runtime.getters import get_rank, get_world_size, is_initialized
from distcomm.protocol import Communicator

__all__ = ["main_process_only", "rank_prefixed_message", "run_on_main", "zero_first"]

F = TypeVar("F", bound=Callable[..., Any])


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
        with main_only_section(f"zero_first's block on the main rank ({region_site()})"):
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

    return _main_only(function, "main_process_only")


def _main_only(function: F, helper: str) -> F:
    """``function`` run on main only, every rank returning its result (``helper`` names the
    helper for messages)."""

    @functools.wraps(function)
    def main_only(*args: Any, **kwargs: Any) -> Any:
        comm = peers()
        region = f"{helper} {function.__qualname__!r} (called at {region_site()})"

        def run() -> Any:
            with main_only_section(region):
                return function(*args, **kwargs)

        if comm is None:
            return run() if _is_main(None) else None
        return share_from(comm, 0, run, f"{function.__qualname__} ({helper})")

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
    result = _main_only(func, "run_on_main's func")(*(args or ()), **(kwargs or {}))
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
