"""A communication summary: ``DISTCOMM_PROFILE=1`` and ``with distcomm.profile() as p:``.

A :class:`Recorder` is a pair of hooks (:func:`~distcomm.add_hook`): per operation and size bucket
(powers of two of the bytes moved), each rank counts the calls and sums the time it spent in them
(the event's ``finished - started``: for a blocking call on a CUDA tensor, the device's work
included, synchronised by :mod:`~distcomm.backend._pipeline.observing`; for an async call, the time
to issue it), and keeps the last :data:`KEPT` calls' ``(group, seq, seconds)``. :func:`summarise`
is collective: it all-gathers every rank's tables and returns the same dict everywhere: the count
and the slowest rank's total time per bucket, algbw and busbw (nccl-tests' factors) from those, and
how often each rank *waited longest* in a call: the rank that arrived first waits for the others,
so each rank's own wait times are compared (no clock is shared between hosts).

Off (no recorder), nothing is registered and the collectives run unwrapped.
"""

from __future__ import annotations

import collections
import contextlib
import sys
import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from distcomm import _settings
from distcomm._measures import busbw_factor, human_bytes
from distcomm.backend.events import CollectiveEvent, HookHandle, add_hook

if TYPE_CHECKING:
    from distcomm.protocol import Communicator

__all__ = [
    "KEPT",
    "Recorder",
    "enabled_by_environment",
    "format_summary",
    "profile",
    "report",
    "start",
    "summarise",
]

#: The calls each rank keeps for "waited longest" (the counts and times cover every call).
KEPT = 10_000


class Recorder:
    """Hooks that count and time every public collective of this process (module docstring)."""

    def __init__(self, global_rank: int) -> None:
        #: Only this rank's calls count: thread-ranks share the process and its hooks.
        self.global_rank = global_rank
        self.lock = threading.Lock()
        #: (op, bucket) -> [count, seconds, bytes]
        self.table: dict[tuple[str, int], list[float]] = {}
        self.calls: collections.deque[tuple[tuple[int, ...], int, str, int, float]] = (
            collections.deque(maxlen=KEPT)
        )
        self.handle: HookHandle | None = add_hook(after=self._after)

    def stop(self) -> None:
        if self.handle is not None:
            self.handle.remove()
            self.handle = None

    def _after(self, event: CollectiveEvent) -> None:
        group = tuple(event.group.global_ranks)
        if group[event.rank] != self.global_rank:
            return
        seconds = event.finished - event.started
        nbytes = event.nbytes
        bucket = -1 if nbytes is None else (0 if nbytes == 0 else 1 << (nbytes.bit_length() - 1))
        with self.lock:
            row = self.table.setdefault((event.op, bucket), [0, 0.0, 0])
            row[0] += 1
            row[1] += seconds
            row[2] += nbytes or 0
            self.calls.append((group, event.seq, event.op, bucket, seconds))

    def snapshot(self) -> dict[str, Any]:
        with self.lock:
            return {"table": dict(self.table), "calls": list(self.calls)}


def summarise(comm: Communicator, recorder: Recorder) -> dict[str, Any]:
    """Every rank's tables combined (collective on ``comm``: every rank must call it)."""
    mine = recorder.snapshot()
    recorder.stop()  # the summary's own traffic is not counted
    every = comm.all_gather_object((comm.global_ranks[comm.rank], mine))
    ranks = [rank for rank, _ in every]
    keys = sorted({key for _, snap in every for key in snap["table"]}, key=lambda k: k)
    longest = _waited_longest(every)
    ops = []
    for op, bucket in keys:
        rows = [snap["table"].get((op, bucket), [0, 0.0, 0]) for _, snap in every]
        count = max(int(row[0]) for row in rows)
        seconds = max(row[1] for row in rows)
        nbytes = max(row[2] for row in rows)
        algbw = nbytes / seconds / 1e9 if seconds > 0 and bucket >= 0 else None
        factor = busbw_factor(op, comm.world_size)
        ops.append(
            {
                "op": op,
                "size": None if bucket < 0 else bucket,
                "count": count,
                "total_s": seconds,
                "algbw_GBps": algbw,
                "busbw_GBps": None if algbw is None else algbw * factor,
                "waited_longest": {r: longest.get((op, bucket, r), 0) for r in ranks},
            }
        )
    return {"world_size": comm.world_size, "ranks": ranks, "ops": ops}


def _waited_longest(every: list[tuple[int, dict[str, Any]]]) -> dict[tuple[str, int, int], int]:
    """(op, bucket, rank) -> how many of the kept calls that rank spent longest in."""
    waits: dict[tuple[tuple[int, ...], int], list[tuple[float, int, str, int]]] = {}
    for rank, snap in every:
        for group, seq, op, bucket, seconds in snap["calls"]:
            waits.setdefault((group, seq), []).append((seconds, rank, op, bucket))
    counts: dict[tuple[str, int, int], int] = collections.Counter()
    for entries in waits.values():
        if len(entries) > 1:
            _, rank, op, bucket = max(entries)
            counts[(op, bucket, rank)] += 1
    return counts


def format_summary(summary: dict[str, Any]) -> str:
    """The summary as a table, for people (what DISTCOMM_PROFILE prints on rank 0)."""
    lines = [
        f"distcomm profile: {summary['world_size']} rank(s); total is the slowest rank's; "
        "waited longest: the rank that spent longest in a call (it arrived first), per rank",
        f"{'op':<24} {'size':>9} {'count':>7} {'total':>10} {'algbw GB/s':>11} {'busbw GB/s':>11}"
        "  waited longest",
    ]
    for row in summary["ops"]:
        size = "-" if row["size"] is None else human_bytes(row["size"])
        bw = ["-" if v is None else f"{v:.3f}" for v in (row["algbw_GBps"], row["busbw_GBps"])]
        waited = " ".join(f"{r}:{n}" for r, n in row["waited_longest"].items() if n)
        lines.append(
            f"{row['op']:<24} {size:>9} {row['count']:>7} {_seconds(row['total_s']):>10} "
            f"{bw[0]:>11} {bw[1]:>11}  {waited or '-'}"
        )
    return "\n".join(lines)


def _seconds(value: float) -> str:
    return f"{value * 1e3:.2f} ms" if value < 1 else f"{value:.2f} s"


def enabled_by_environment() -> bool:
    """Whether DISTCOMM_PROFILE asks for the summary at finalize.

    Raises:
        InvalidArgumentError: DISTCOMM_PROFILE is set to something other than 0 or 1.
    """
    return bool(_settings.read("DISTCOMM_PROFILE"))


@contextlib.contextmanager
def profile(group: Communicator | None = None) -> Iterator[dict[str, Any]]:
    """Count and time the collectives run inside the block; on leaving it, the dict yielded is
    filled with the summary of every rank (the same on each). Leaving is collective on ``group``
    (default: the default communicator): every rank must run the block.

    ``with distcomm.profile() as p: train_step()`` then ``p["ops"]``: one entry per operation
    and size bucket with ``count``, ``total_s`` (the slowest rank's), ``algbw_GBps``,
    ``busbw_GBps`` and ``waited_longest`` (rank -> how many calls it spent longest in).
    """
    from distcomm._runtime.collectives import resolve_group

    comm = resolve_group(group)
    recorder = Recorder(comm.global_ranks[comm.rank])
    result: dict[str, Any] = {}
    try:
        yield result
    except BaseException:
        recorder.stop()  # no summary: the other ranks may not reach it
        raise
    result.update(summarise(comm, recorder))


def start(comm: Communicator) -> Recorder | None:
    """The recorder DISTCOMM_PROFILE=1 asks for (init), or None."""
    return Recorder(comm.global_ranks[comm.rank]) if enabled_by_environment() else None


def report(comm: Communicator, recorder: Recorder) -> None:
    """The summary at finalize: collective; rank 0 prints it to stderr."""
    summary = summarise(comm, recorder)
    if comm.rank == 0:
        sys.stderr.write(format_summary(summary) + "\n")
        sys.stderr.flush()
