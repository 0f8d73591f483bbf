"""What the rank-zero helpers, the workspace and the compat modules are built from (private).

A :class:`Failure` is what a rank tells its peers when the code it ran raised; :func:`settle`
and :func:`share_from` make every rank learn of it instead of waiting; a main-only section marks
code that only main runs, where helpers must not synchronise.
"""

from __future__ import annotations

import contextlib
import dataclasses
import pickle
import threading
import traceback
from collections.abc import Callable, Iterator
from typing import Any

from distcomm._call_sites import call_site
from distcomm._runtime.collectives import resolve_group
from distcomm.backend._pipeline import object_transport as objects
from distcomm.backend.events import CollectiveEvent, HookHandle, add_hook
from distcomm.errors import InvalidArgumentError, MainOnlyCollectiveError, RankFailedError
from distcomm.protocol import Communicator

__all__ = [
    "Failure",
    "in_main_only_section",
    "main_only_section",
    "peers",
    "region_site",
    "settle",
    "share_from",
]


class _Sections(threading.local):
    depth = 0
    #: What the outermost section is and where it was entered (for the guard's message).
    region = ""
    guard: HookHandle | None = None


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
def main_only_section(region: str = "a main-only section") -> Iterator[None]:
    """Mark a main-only section for this thread (nested sections count).

    ``region`` says what it is and where it was entered, e.g. ``"main_process_only 'save'
    (train.py:8)"``. While the thread is in one, a collective it calls on a group of more than
    one rank raises MainOnlyCollectiveError (the guard, a hook) instead of hanging the job,
    unless the group's check policy is ``"off"``.
    """
    if _sections.depth == 0:
        _sections.region = region
        _sections.guard = add_hook(before=_guard)
    _sections.depth += 1
    try:
        yield
    finally:
        _sections.depth -= 1
        if _sections.depth == 0 and _sections.guard is not None:
            _sections.guard.remove()
            _sections.guard = None


def _guard(event: CollectiveEvent) -> None:
    """Stop a collective this thread calls inside a main-only section (see above)."""
    group = event.group
    if _sections.depth == 0 or event.world_size == 1 or getattr(group, "debug", "") == "off":
        return
    site = call_site()
    where = group.describe() if hasattr(group, "describe") else repr(group)
    raise MainOnlyCollectiveError(
        f"{event.op} (operation #{event.seq} on {where}) was called at {site}, inside "
        f"{_sections.region}, which only this rank runs: the other ranks would never join it "
        "and the job would hang. It was not run. HINT: move the collective out of the "
        "main-only code, or give it a group of this rank alone, made beforehand on every rank "
        "(g = distcomm.new_group([0]); ... group=g); DISTCOMM_DEBUG=off turns this guard off.",
        site=site,
        region=_sections.region,
        op=event.op,
        seq=event.seq,
        group=where,
    )


def region_site() -> str:
    """``file:line`` of the user's code that entered a region: the innermost frame outside
    distcomm and contextlib."""
    return call_site(skip=(contextlib.__file__,))


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
