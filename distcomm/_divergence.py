"""Where ranks parted: the first operation at which their calls differ, and the error saying so.

A rank's calls are a :class:`Timeline`: runs of equal keys (a fingerprint, an op name) by the
``seq`` each starts at, up to the rank's latest ``seq``. :func:`first_divergence` compares the
ranks' timelines from the first operation all of them still hold and returns the first one at
which two ranks made different calls; a rank that has not reached it yet is not a difference,
one that ended (``finalize``) before it is. Used with the histories the ranks exchange after a
disagreement (:mod:`~distcomm.backend._pipeline.mismatch_check`) and with the flight
recorder's dumps (``distcomm trace``). :func:`mismatch_error` writes the
:class:`~distcomm.errors.CollectiveMismatchError` of a divergence found in histories.
"""

from __future__ import annotations

import bisect
import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from distcomm.errors import CollectiveMismatchError

__all__ = [
    "ENDED",
    "Divergence",
    "Timeline",
    "find",
    "first_divergence",
    "mismatch_error",
    "timeline",
]

#: The key of an operation a rank never made because it had ended (finalize).
ENDED = "ended"
_HINT = (
    "HINT: every rank calls the same collectives in the same order, with the same element "
    "count, dtype, root and reduce op (look for a collective inside an if that only some ranks "
    "take, or a batch whose size differs between ranks)."
)


@dataclasses.dataclass(frozen=True)
class Timeline:
    """One rank's calls: ``runs`` of ``(start seq, key)`` in order, each lasting until the next
    starts, the last until ``end`` (the rank's latest ``seq``); ``ended``: the rank called
    nothing after ``end``; ``agreed``: calls up to it are known to be the same on every rank."""

    runs: Sequence[tuple[int, Any]]
    end: int
    ended: bool = False
    agreed: int = 0

    def key_at(self, seq: int) -> Any:
        """The key of call ``seq``: None if not held (before the runs, or not reached yet),
        :data:`ENDED` if the rank had ended before it."""
        if seq > self.end:
            return ENDED if self.ended else None
        starts = [start for start, _ in self.runs]
        index = bisect.bisect_right(starts, seq) - 1
        return None if index < 0 else self.runs[index][1]


@dataclasses.dataclass(frozen=True)
class Divergence:
    """The first operation ``seq`` at which the ranks' calls differ; ``keys``: each rank's key
    there (None: it had not reached it); ``exact``: False when some rank no longer held the
    calls before ``seq``, so that they may have parted earlier."""

    seq: int
    keys: dict[int, Any]
    exact: bool = True


def first_divergence(timelines: Mapping[int, Timeline]) -> Divergence | None:
    """The first operation at which two ranks' keys differ (module docstring), else None."""
    if len(timelines) < 2:
        return None
    known = min(t.agreed for t in timelines.values()) + 1
    held = max((t.runs[0][0] if t.runs else t.end + 1) for t in timelines.values())
    low = max(known, held)
    high = max(t.end for t in timelines.values()) + 1
    candidates = {low}
    for t in timelines.values():
        candidates.update(start for start, _ in t.runs if low <= start <= high)
        if t.ended and low <= t.end + 1 <= high:
            candidates.add(t.end + 1)
    for seq in sorted(candidates):
        keys = {rank: t.key_at(seq) for rank, t in sorted(timelines.items())}
        if len({key for key in keys.values() if key is not None}) > 1:
            return Divergence(seq, keys, exact=held <= known)
    return None


def find(dumps: Mapping[int, Mapping[str, Any]]) -> Divergence | None:
    """The first divergence of the ranks' history dumps (rank -> dump), else None."""
    return first_divergence({rank: timeline(dump) for rank, dump in dumps.items()})


def timeline(dump: Mapping[str, Any]) -> Timeline:
    """The timeline of a history's dump
    (:meth:`~distcomm.backend._pipeline.mismatch_check.MismatchCheck.dump`), keyed by
    fingerprint."""
    runs, start = [], int(dump["first"])
    for index, length in dump["runs"]:
        runs.append((start, dump["fps"][index]))
        start += int(length)
    return Timeline(
        runs=runs,
        end=int(dump["seq"]),
        ended=bool(dump.get("ended")),
        agreed=int(dump.get("agreed", 0)),
    )


def mismatch_error(
    description: str, found: Divergence, dumps: Mapping[int, Mapping[str, Any]]
) -> CollectiveMismatchError:
    """The error for ``found`` in the ranks' ``dumps`` on the communicator ``description``: the
    first diverging operation, each rank's call there (ranks with the same call together),
    and which operations ran with mismatched arguments (so their results may be wrong)."""
    table = [_row(found, rank, dumps[rank]) for rank in sorted(dumps)]
    lines: dict[str, list[int]] = {}
    for rank, row in zip(sorted(dumps), table, strict=True):
        lines.setdefault(_said(row), []).append(rank)
    shown = "\n".join(
        f"  {'rank' if len(ranks) == 1 else 'ranks'} {', '.join(map(str, ranks))}: {text}"
        for text, ranks in lines.items()
    )
    issued = {rank: int(d.get("issued", d["seq"])) for rank, d in dumps.items()}
    last = max(issued.values())
    went_on = [rank for rank, n in sorted(issued.items()) if n >= found.seq]
    who = f"{'rank' if len(went_on) == 1 else 'ranks'} {', '.join(map(str, went_on))}"
    they = who[0].upper() + who[1:]
    if last < found.seq:
        after = "The operation was not run; the communicator can still be used."
    elif last == found.seq:
        after = f"{they} had already issued it: the communicator can no longer be used."
    else:
        after = (
            f"Operations #{found.seq} to #{last} ran after the ranks parted ({who} went on): "
            "their results may be wrong, and the communicator can no longer be used."
        )
    where = "first called different collectives at" if found.exact else "parted at or before"
    message = (
        f"collective mismatch at operation #{found.seq} on {description}: the ranks {where} "
        f"this operation:\n{shown}\n{after} {_HINT}"
    )
    op = next((row["op"] for row in table if row["op"] is not None), None)
    ran = (found.seq, last) if last >= found.seq else None
    return CollectiveMismatchError(
        message, table=table, op=op, seq=found.seq, group=description, ran=ran
    )


def _row(found: Divergence, rank: int, dump: Mapping[str, Any]) -> dict[str, Any]:
    key = found.keys.get(rank)
    row: dict[str, Any] = dict.fromkeys(
        ("op", "shape", "dtype", "numel", "root", "reduce_op", "site")
    )
    if key is None:
        row["note"] = f"had not reached it (at operation #{dump['seq']}, {dump['op'] or '-'})"
        return row
    if key == ENDED:
        row["note"] = f"called finalize() after operation #{dump['seq']}: no collective"
        return row
    fps = list(dump["fps"])
    known = dump["calls"][fps.index(key)] if key in fps else [None] * 7
    op, dtype, numel, root, reduce_op, site, shape = known
    row.update(op=op, dtype=dtype, numel=numel, root=root, reduce_op=reduce_op, site=site)
    row["shape"] = None if shape is None else tuple(shape)
    if dump.get("site") and int(dump["seq"]) == found.seq:  # the call it is making now
        row["site"] = dump["site"]
    return row


def _said(row: Mapping[str, Any]) -> str:
    """A table row in words: ``all_reduce, shape (4,), float32, 4 elements, op SUM  at f:7``."""
    if row.get("note"):
        return str(row["note"])
    if row["op"] is None:
        return "a call this rank could not describe"
    parts = [str(row["op"])]
    if row["dtype"] is not None:
        if row["shape"] is not None:
            parts.append(f"shape {row['shape']}")
        parts += [str(row["dtype"]), f"{row['numel']} elements"]
    if row["root"] is not None:
        parts.append(f"root {row['root']}")
    if row["reduce_op"] is not None:
        parts.append(f"op {row['reduce_op']}")
    site = f"  at {row['site']}" if row["site"] else ""
    return ", ".join(parts) + site
