"""Each rank's progress and whereabouts in torch's store, for a timed-out or failed operation.

Every communicator publishes its sequence number (the latest collective it entered) under a key
of its own in the rendezvous store, from distcomm's monitor thread, whenever it changed since
the last tick: an idle job writes nothing, a busy one a few small values per second, and the
collectives themselves never wait for the store. After a timeout, the rank that waited lets
one tick pass and reads every member's value: the members behind the operation are the ones
that had not arrived. Reads run in a helper thread with a deadline, so a store that cannot
answer (its server, rank 0, died) gives "unknown", never a hang.

After a timeout, the rank that waited also asks the other ranks where they are: it increments
a counter of each in the store, and that rank's monitor thread answers with the Python stack of
its program's thread and what it called (:func:`distcomm.backend.stacks.answer`) and the
counter's value. A rank reads its counter once a tick only while it has entered no collective for
2 s (or half its timeout, if shorter), as a rank that waits for another has not, or while one
of its communicators has failed (its peers are about to ask), so a busy job asks nothing of the
store. Such a
rank counts itself in the store as listening; rank 0, whose process serves the store, says when
it leaves (finalize or exit) and waits a moment for the listening ranks to stop, so that none of
them sends a request to a server that is gone (which torch reports at length on stderr).

Communicators are named by their torch group's name, which torch makes the same on every
member.
"""

from __future__ import annotations

import atexit
import contextlib
import threading
import time
import weakref
from collections.abc import Callable, Mapping
from typing import Any

from distcomm.backend import monitor, stacks

__all__ = ["StoreProgress"]

#: Seconds without entering a collective after which a rank listens for questions (at most: half
#: its timeout if that is shorter). A rank that waits on another, in the engine or in a vote of
#: the mismatch check, answers within a few ticks after it.
_QUIET = 2.0
#: Seconds a read of the store may take before the answer is "unknown".
_READ_LIMIT = 3.0
#: How many ranks read their question counter (listen); set once rank 0 leaves.
_LISTENING = "distcomm/where/listening"
_CLOSING = "distcomm/where/closing"


class StoreProgress:
    """Publishing and reading the sequence numbers of one process's communicators, and
    answering and asking "where are you?" (module docstring)."""

    def __init__(self, store: Any, rank: int) -> None:
        self._store = store
        self._rank = rank
        self._owner: weakref.ref[Any] | None = None
        self._answered = 0
        self._active = time.monotonic()
        self._quiet = 0.0
        self._lock = threading.Lock()
        self._listening = False
        self._left = False  # answers no more
        self._gone = False  # has left the job (finalize or exit)
        self._server_gone = False  # rank 0, whose process serves the store, said it leaves
        self._troubled_until = 0.0  # listens until then, busy or not (a communicator failed)

    @property
    def store(self) -> Any:
        """The store (for :mod:`distcomm_torch.mailbox`)."""
        return self._store

    @property
    def server_gone(self) -> bool:
        """Whether this rank knows that the store's server (rank 0's process) has left or
        failed: nothing may be sent to it any more (torch reports each attempt at length)."""
        return self._server_gone

    def troubled(self, now: float) -> None:
        """One of this process's communicators has failed (its monitor tick says so while it
        is not finalized): listen for the next ticks whatever the program does, since the
        other ranks of that communicator are about to ask where this one is."""
        self._troubled_until = now + 2 * monitor.interval()

    def active(self, now: float) -> None:
        """Note that one of this process's communicators entered a collective by ``now``."""
        self._active = now

    @staticmethod
    def key(group: Any) -> str:
        """The store key prefix of the communicator over torch group ``group``."""
        return f"distcomm/progress/{group.group_name}"

    def publish(self, key: str, rank: int, seq: int) -> None:
        """Record that member ``rank`` of ``key`` has entered collective ``seq``."""
        self._store.set(f"{key}/{rank}", str(seq))

    def read(self, key: str, size: int) -> dict[int, int] | None:
        """Every member's published sequence number (members that published none are left
        out), after one monitor tick so that each live one has published its latest; None if
        the store did not answer in time (or its server is known to be gone)."""
        if self._server_gone:
            return None
        time.sleep(2 * monitor.interval() + 0.1)
        found: dict[int, int] = {}

        def read_all() -> None:
            for rank in range(size):
                name = f"{key}/{rank}"
                if self._store.check([name]):
                    found[rank] = int(self._store.get(name))

        return found if _within(_READ_LIMIT, read_all) else None

    # -- where are you? --------------------------------------------------------------------------
    def answer_for(self, comm: Any) -> None:
        """Answer peers' "where are you?" with the stack of ``comm``'s thread (the process's
        world communicator), from the monitor thread, until :meth:`release` or exit."""
        if self._owner is None:
            self._owner = weakref.ref(comm)
            self._quiet = min(comm.timeout / 2, _QUIET)
            if self._rank == 0:  # a store kept from an earlier init (an adopted group)
                with contextlib.suppress(Exception):
                    self._store.delete_key(_CLOSING)
            monitor.watch(self)
            atexit.register(self._leave)

    def release(self, comm: Any) -> None:
        """Stop answering if ``comm``, being finalized, is the one answered for."""
        if self._owner is not None and self._owner() is comm:
            self._leave()

    def monitor_tick(self, now: float) -> None:
        """Answer the questions of peers that asked since the last tick, while idle."""
        with self._lock:
            if self._left:
                return
            try:
                if now - self._active < self._quiet and now >= self._troubled_until:
                    if self._listening:
                        self._listen(False)
                    return
                if not self._listening:
                    self._listen(True)
                if self._store.check([_CLOSING]):  # rank 0 leaves: its server goes
                    self._server_gone = True
                    self._listen(False)
                    self._stop()
                    return
                asked = int(self._store.add(_asked(self._rank), 0))
                if asked > self._answered:
                    owner = None if self._owner is None else self._owner()
                    self._store.set(_answer(self._rank), f"{asked}\n{stacks.answer(owner)}")
                    self._answered = asked
            except Exception:  # the store's server is gone: nobody can ask any more
                self._server_gone = True
                self._listening = False
                self._stop()
                raise

    def _listen(self, listening: bool) -> None:
        self._store.add(_LISTENING, 1 if listening else -1)
        self._listening = listening

    def _stop(self) -> None:
        self._left = True
        monitor.unwatch(self)

    def _leave(self) -> None:
        """This rank ends: it stops listening; rank 0 says so and waits (a few ticks at most)
        for the listening ranks to stop before its server goes."""

        def leave() -> None:
            with self._lock:
                if self._gone:
                    return
                self._gone = True
                if self._listening:
                    self._listen(False)
                self._stop()
            if self._rank == 0:
                self._store.set(_CLOSING, "1")
                deadline = time.monotonic() + 2 * monitor.interval() + 0.5
                while int(self._store.add(_LISTENING, 0)) > 0 and time.monotonic() < deadline:
                    time.sleep(0.02)

        try:
            _within(_READ_LIMIT, leave)
        except RuntimeError:  # at exit, Python 3.12+ starts no thread: rank 0 is its own server
            with contextlib.suppress(Exception):
                leave()

    def where(self, ranks: Mapping[int, int]) -> dict[int, str] | None:
        """Where each member of ``ranks`` (member -> its rank in the default group) is; members
        that did not answer within a few monitor ticks are left out; None if the store itself
        did not answer (or its server is known to be gone)."""
        if self._server_gone:
            return None
        found: dict[int, str] = {}
        wait = 2 * monitor.interval() + 0.5  # an idle rank answers at its next tick

        def ask_all() -> None:
            asked = {
                member: int(self._store.add(_asked(rank), 1)) for member, rank in ranks.items()
            }
            self._store.add(_LISTENING, 1)  # rank 0 waits for the askers too before it leaves
            try:
                wait_for(asked)
            finally:
                self._store.add(_LISTENING, -1)

        def wait_for(asked: dict[int, int]) -> None:
            deadline = time.monotonic() + wait
            while asked and time.monotonic() < deadline and not monitor.stopping():
                time.sleep(0.05)
                if self._store.check([_CLOSING]):  # rank 0 leaves: no more answers
                    self._server_gone = True
                    return
                for member, question in list(asked.items()):
                    key = _answer(ranks[member])
                    if not self._store.check([key]):
                        continue
                    answer = bytes(self._store.get(key)).decode(errors="replace")
                    number, _, text = answer.partition("\n")
                    if int(number) >= question:
                        found[member] = text
                        del asked[member]

        return found if _within(_READ_LIMIT + wait, ask_all) else (found or None)


def _asked(rank: int) -> str:
    return f"distcomm/where/{rank}/asked"


def _answer(rank: int) -> str:
    return f"distcomm/where/{rank}/answer"


def _within(limit: float, work: Callable[[], None]) -> bool:
    """Run ``work`` in a helper thread; whether it ended well within ``limit`` seconds (a store
    whose server died would otherwise block the caller for the store's whole timeout)."""
    done = threading.Event()
    ended_well: list[bool] = []

    def run() -> None:
        try:
            work()
            ended_well.append(True)
        except Exception:  # the store's server is gone: the caller says "unknown"
            pass
        finally:
            done.set()

    monitor.helper(run, "distcomm-store-read")  # joined at exit: it calls torch's C++ store
    return done.wait(limit) and bool(ended_well)
