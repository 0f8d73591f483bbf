"""The mismatch check's histories as the ranks exchange them, out of band (a peer's answer,
:func:`distcomm.backend.stacks.answer`) or after a disagreement: the live checks of this
process (:class:`~distcomm.backend._pipeline.mismatch_check.MismatchCheck`, whose ``dump``
is a history's plain data), the dump of a communicator that keeps none, and a communicator's
dump among a peer's.
"""

from __future__ import annotations

import weakref
from typing import Any

__all__ = ["RING", "live_checks", "minimal_dump", "register", "same_communicator"]

#: Runs kept since the last agreement (at least the calls between two sampled checks).
RING = 512
#: Every live check of this process, for a peer's question (weak: a finalized one goes).
_LIVE: weakref.WeakSet[Any] = weakref.WeakSet()


def register(check: Any) -> None:
    """Let a peer's question find ``check`` while its communicator lives."""
    _LIVE.add(check)


def live_checks() -> list[Any]:
    """The checks of this process's live communicators (a peer may ask about any's history)."""
    return [check for check in list(_LIVE) if check.owner() is not None]


def minimal_dump(comm: Any) -> dict[str, Any]:
    """A dump with ``comm``'s current call only, by its op name (a communicator keeping no
    history: the policy is off); compared with another, it shows two ranks at the same
    ``seq`` in different collectives."""
    seq, op = int(comm.seq), str(comm.op)
    return {
        "ranks": list(comm.global_ranks),
        "name": comm.name,
        "lineage": getattr(comm, "_lineage", ""),
        "seq": seq,
        "op": op,
        "agreed": max(0, seq - 1),
        "issued": seq,
        "ended": False,
        "first": seq,
        "runs": [[0, 1]] if seq else [],
        "fps": [op],
        "calls": [[op, None, None, None, None, None, None]],
    }


def same_communicator(mine: dict[str, Any], dumps: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The dump among ``dumps`` (a peer's) of the communicator ``mine`` is of: the same members,
    name and lineage (which sub-communicator of which parent it is: groups of the same members
    made one after another differ in it)."""
    for dump in dumps:
        if (dump.get("ranks"), dump.get("name"), dump.get("lineage", "")) == (
            mine["ranks"],
            mine["name"],
            mine.get("lineage", ""),
        ):
            return dump
    return None
