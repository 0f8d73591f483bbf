"""Each rank's progress in torch's store, for the ranks a timed-out or failed operation names.

Every communicator publishes its sequence number (the latest collective it entered) under a key
of its own in the rendezvous store, from distcomm's monitor thread, whenever it changed since
the last tick: an idle job writes nothing, a busy one a few small values per second, and the
collectives themselves never wait for the store. After a timeout, the rank that waited lets
one tick pass and reads every member's value: the members behind the operation are the ones
that had not arrived. Reads run in a helper thread with a deadline, so a store that cannot
answer (its server, rank 0, died) gives "unknown", never a hang.

Communicators are named by their torch group's name, which torch makes the same on every
member.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from distcomm.backend import monitor

__all__ = ["StoreProgress"]

#: Seconds a read of the store may take before the answer is "unknown".
_READ_LIMIT = 3.0


class StoreProgress:
    """Publishing and reading the sequence numbers of one process's communicators."""

    def __init__(self, store: Any) -> None:
        self._store = store

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
        the store did not answer in time."""
        time.sleep(2 * monitor.interval() + 0.1)
        found: dict[int, int] = {}
        done = threading.Event()

        def read_all() -> None:
            for rank in range(size):
                name = f"{key}/{rank}"
                if self._store.check([name]):
                    found[rank] = int(self._store.get(name))
            done.set()

        threading.Thread(target=read_all, name="distcomm-progress-read", daemon=True).start()
        return found if done.wait(_READ_LIMIT) else None
