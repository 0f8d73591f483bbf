"""The timeout watchdog: MPI cannot interrupt or cancel a blocked call, so distcomm aborts the job.

Before a blocking MPI call a communicator writes the operation's name and sequence number into
two attributes and clears them after (no clock, no lock: the fast path pays two stores). One
daemon thread per process looks at every live communicator a few times per timeout; an
operation seen pending under the same sequence number for longer than the communicator's
timeout gets a diagnostic on stderr (operation, sequence number, communicator, rank) and
``MPI_Abort``, which ends every rank of the job instead of letting it hang.
"""

from __future__ import annotations

import sys
import threading
import time
import weakref
from typing import Any

__all__ = ["watch"]

_lock = threading.Lock()
_watched: weakref.WeakSet[Any] = weakref.WeakSet()
_thread: threading.Thread | None = None
#: The longest sleep between two looks, in seconds.
_MAX_TICK = 1.0


def watch(comm: Any) -> None:
    """Watch ``comm`` (an MpiCommunicator) from now on; starts the thread on first use."""
    global _thread
    with _lock:
        _watched.add(comm)
        if _thread is None:
            _thread = threading.Thread(target=_run, name="distcomm-mpi-watchdog", daemon=True)
            _thread.start()


def _run() -> None:
    seen: dict[int, tuple[int, float]] = {}
    while True:
        with _lock:
            comms = list(_watched)
        tick = min([_MAX_TICK, *(c.timeout / 4 for c in comms)])
        time.sleep(tick)
        now = time.monotonic()
        for comm in comms:
            seq = comm.blocked_seq
            if not seq:
                seen.pop(id(comm), None)
                continue
            first = seen.get(id(comm))
            if first is None or first[0] != seq:
                seen[id(comm)] = (seq, now)
            elif now - first[1] >= comm.timeout:
                _abort(comm, seq, now - first[1])


def _abort(comm: Any, seq: int, waited: float) -> None:
    sys.stderr.write(
        f"distcomm: rank {comm.rank} of {comm.describe()}: {comm.blocked_op} (operation #{seq}) "
        f"has not completed after {waited:.0f} s (timeout {comm.timeout:g} s); MPI cannot cancel "
        "it, so distcomm aborts the job (MPI_Abort). HINT: a rank is stuck or skipped this "
        "call; if it is merely slow, raise init(timeout=...) or DISTCOMM_TIMEOUT.\n"
    )
    sys.stderr.flush()
    from mpi4py import MPI

    MPI.COMM_WORLD.Abort(1)
