"""What a rank called on a communicator: the running fingerprint of its collectives, and the calls
since the ranks last agreed.

Every collective a communicator counts (``seq``) has a *signature*: op, dtype, element count,
root and reduce op (shapes are not part of it: torch accepts (2, 3) on one rank and (6,) on
another). Its fingerprint is 62 bits of blake2b over the signature's text, the same in every
process. Consecutive calls with one fingerprint form a *run*, and the running value folds each
run (fingerprint and length) into one integer: two ranks have equal values when they made the
same calls in the same order (barring an accident of 2**-62), and a call like the one before it
costs nothing to record.

The ranks compare running values at check points (:mod:`~distcomm.backend._pipeline.mismatch_check`,
:mod:`~distcomm.backend._pipeline.p2p_vote`). The runs since the last agreement (a ring of
at most :data:`RING`) and the signature of each fingerprint with the call site where it was
first seen are what a rank shows when they differ: :mod:`~distcomm._divergence`
finds the first operation where ranks parted from them, and a peer asked out of band (the answer
of :func:`distcomm.backend.stacks.where`) sends its :meth:`CallHistory.dump`.
"""

from __future__ import annotations

import contextlib
import hashlib
import weakref
from collections.abc import Iterator
from typing import Any

__all__ = [
    "NEUTRAL",
    "RING",
    "CallHistory",
    "fingerprint",
    "histories",
    "minimal_dump",
    "same_communicator",
]

#: Runs kept since the last agreement (at least the calls between two sampled checks).
RING = 512
#: Fingerprints remembered as agreed, and signatures remembered as described, per communicator.
_REMEMBERED = 4096
_BITS = (1 << 62) - 1
_MULTIPLIER = 0x9E3779B97F4A7C15 & _BITS | 1
_NO_RUN = -1
#: Every live history of this process, for a peer's question (weak: a finalized one goes).
_LIVE: weakref.WeakSet[CallHistory] = weakref.WeakSet()


def fingerprint(signature: tuple[Any, ...]) -> int:
    """62 bits of blake2b over ``signature``'s canonical text (stable across processes)."""
    text = "|".join(map(str, signature)).encode()
    return int.from_bytes(hashlib.blake2b(text, digest_size=8).digest(), "little") & _BITS


#: The fingerprint a call takes when the ranks found it mismatched before any of them ran it,
#: so that their histories agree again and the communicator stays usable.
NEUTRAL = fingerprint(("not run: the ranks disagreed",))


def _mix(value: int, fp: int, length: int) -> int:
    return ((value ^ fp) * _MULTIPLIER + length) & _BITS


class CallHistory:
    """The calls of one rank on communicator ``comm`` (module docstring)."""

    __slots__ = (
        "__weakref__",
        "agreed",
        "agreed_seq",
        "closed",
        "described",
        "ended",
        "fps",
        "ledger",
        "owner",
        "run_fp",
        "run_start",
        "runs",
        "voting",
    )

    def __init__(self, comm: Any, ledger: Any) -> None:
        self.owner = weakref.ref(comm)
        self.closed = 0  # the running value of the runs before the current one
        self.run_fp, self.run_start = _NO_RUN, 1
        self.runs: list[tuple[int, int]] = []  # closed runs since the last agreement
        self.agreed_seq = 0
        self.agreed: set[int] = set()
        self.fps: dict[tuple[Any, ...], int] = {}  # signature -> fingerprint
        self.described: dict[int, tuple[Any, ...]] = {}  # fingerprint -> signature and site
        self.ended = False
        #: The ``seq`` of the call whose vote this rank is in, before it reaches the engine.
        self.voting = 0
        #: The uneven all-to-alls' split tables since the last check point
        #: (:class:`~distcomm.backend._pipeline.routing_ledger.Ledger`).
        self.ledger = ledger
        _LIVE.add(self)

    @contextlib.contextmanager
    def voting_on(self, seq: int) -> Iterator[None]:
        """While this rank is in the vote on call ``seq``, before the call reaches the engine
        (a peer asking where it is hears that ``seq`` was not issued)."""
        self.voting = seq
        try:
            yield
        finally:
            self.voting = 0

    def end(self) -> None:
        """finalize began: the calls end here."""
        self.ended = True

    def fingerprint(self, signature: tuple[Any, ...]) -> int:
        """``signature``'s fingerprint (remembered)."""
        fp = self.fps.get(signature)
        if fp is None:
            if len(self.fps) >= _REMEMBERED:
                self.fps.clear()
            fp = self.fps[signature] = fingerprint(signature)
        return fp

    def start_run(self, seq: int, fp: int) -> bool:
        """Call ``seq`` has fingerprint ``fp``, unlike the one before: close that run, start
        one. Returns whether the ranks have never agreed on ``fp`` (a call to confirm)."""
        if self.run_fp != _NO_RUN:
            self.closed = _mix(self.closed, self.run_fp, seq - self.run_start)
            self.runs.append((self.run_start, self.run_fp))
            if len(self.runs) > RING:
                del self.runs[: len(self.runs) - RING]
        self.run_fp, self.run_start = fp, seq
        return fp not in self.agreed

    def describe(self, fp: int, signature: tuple[Any, ...], site: str, shape: Any) -> None:
        """Remember what ``fp`` is (the first time it is seen), for the table of a mismatch."""
        if fp not in self.described:
            if len(self.described) >= _REMEMBERED:
                self.described.clear()
            self.described[fp] = (*signature, site, shape)

    def value(self, seq: int) -> int:
        """The running value of calls 1 to ``seq`` (``seq`` is the latest)."""
        if self.run_fp == _NO_RUN:
            return self.closed
        return _mix(self.closed, self.run_fp, seq - self.run_start + 1)

    def agree(self, seq: int) -> None:
        """The ranks agreed on calls 1 to ``seq``: their fingerprints are known good."""
        if len(self.agreed) >= _REMEMBERED:
            self.agreed.clear()
        self.agreed.update(fp for _, fp in self.runs)
        self.agreed.add(self.run_fp)
        self.runs.clear()
        self.agreed_seq = seq

    def neutralise(self, seq: int) -> None:
        """Call ``seq`` (the latest) was found mismatched before any rank ran it: it counts as
        :data:`NEUTRAL` on every rank, so that the ranks' histories agree again."""
        if self.run_start != seq:
            self.start_run(seq, NEUTRAL)
        self.run_fp = NEUTRAL

    def dump(
        self, shape: Any = None, keep: int = RING + 1, site: str | None = None
    ) -> dict[str, Any]:
        """What this rank called since the last agreement, as plain data (JSON, compact: a peer
        sends it out of band): the communicator (``ranks``, ``name``, ``lineage``), its
        ``seq``, current ``op``, ``agreed`` (the last agreement's seq), ``issued`` (the latest
        call that reached the engine) and ``ended`` (finalize began); ``first``, the seq the
        first run starts at, and ``runs``, ``[index, length]`` each (the current run last, up
        to ``seq``), where ``index`` picks the fingerprint in ``fps`` and its call in
        ``calls``: ``[op, dtype, numel, root, reduce_op, site, shape]`` (site: where it was
        first made; shape: the current call's, when given), and ``site``, where the current
        call is being made (when known: the rank is in it). Only the newest ``keep`` runs are
        in it."""
        comm = self.owner()
        seq, op = (0, "") if comm is None else (comm.seq, comm.op)
        runs = [*self.runs, (self.run_start, self.run_fp)] if self.run_fp != _NO_RUN else []
        runs = runs[-keep:] if keep > 0 else []
        fps: list[int] = []
        index: dict[int, int] = {}
        encoded = []
        for i, (start, fp) in enumerate(runs):
            end = runs[i + 1][0] if i + 1 < len(runs) else seq + 1
            if fp not in index:
                index[fp] = len(fps)
                fps.append(fp)
            encoded.append([index[fp], end - start])
        calls = [list(self.described.get(fp) or (None,) * 7) for fp in fps]
        if shape is not None and calls:
            calls[index[runs[-1][1]]][6] = list(shape)
        return {
            "ranks": [] if comm is None else list(comm.global_ranks),
            "name": "" if comm is None else comm.name,
            "lineage": "" if comm is None else getattr(comm, "_lineage", ""),
            "seq": seq,
            "op": op,
            "agreed": self.agreed_seq,
            "issued": seq - 1 if self.voting == seq else seq,
            "ended": self.ended,
            "first": runs[0][0] if runs else seq + 1,
            "runs": encoded,
            "fps": fps,
            "calls": calls,
            "site": site,
        }


def histories() -> list[CallHistory]:
    """The histories of this process's live communicators (a peer may ask about any)."""
    return [history for history in list(_LIVE) if history.owner() is not None]


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
