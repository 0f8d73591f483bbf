"""``distcomm trace [DIR]``: the flight recorder's dumps of every rank, read together and said in
words: the first operation where the ranks diverge, the ranks that stopped early, the ranks that
left only their black box, and the slowest ranks per operation (the rank that arrived last
spends least time in a call). Also where a job's dumps go (:func:`traces_folder`), for the ranks
that write them and the launcher that says where they are."""

from __future__ import annotations

import collections
import json
import os
import time
from typing import Any

from distcomm import _settings
from distcomm._divergence import Timeline, first_divergence

__all__ = ["TRACES", "analyse", "job_folder", "load", "traces_folder"]

#: The folder of the jobs' dump folders, unless DISTCOMM_TRACE_DIR names one job's.
TRACES = "distcomm-trace"


def traces_folder(job: str) -> str:
    """Where the ranks of ``job`` (its launcher's job id) write their dumps: DISTCOMM_TRACE_DIR,
    else ``./distcomm-trace/<job>``; absolute."""
    return os.path.abspath(_settings.read("DISTCOMM_TRACE_DIR") or os.path.join(TRACES, job))


def job_folder(folder: str) -> tuple[str, int]:
    """The folder of one job's dumps that ``folder`` means: itself when it holds a
    ``rank-N.json``, else its sub-folder that does whose newest dump is the newest (the last
    job run); with how many sub-folders hold dumps (0 for ``folder`` itself).

    Raises:
        FileNotFoundError: neither ``folder`` nor a folder in it holds a dump.
    """
    if _dumps_in(folder):
        return folder, 0
    jobs = {}
    for entry in os.scandir(folder):
        if entry.is_dir():
            times = [os.stat(path).st_mtime for path in _dumps_in(entry.path)]
            if times:
                jobs[entry.path] = max(times)
    if not jobs:
        raise FileNotFoundError(f"no rank-N.json in {folder!r} nor in a folder in it")
    return max(jobs, key=jobs.__getitem__), len(jobs)


def _dumps_in(folder: str) -> list[str]:
    return [
        os.path.join(folder, name)
        for name in os.listdir(folder)
        if name.startswith("rank-") and name.endswith(".json")
    ]


def load(folder: str) -> tuple[dict[int, dict[str, Any]], list[str]]:
    """Every ``rank-N.json`` of ``folder`` that is a flight recorder's file, by rank; and a line
    for each one that is not (unreadable, not JSON, not the shape a recorder writes), left out.

    Raises:
        FileNotFoundError: ``folder`` holds no file a recorder wrote.
    """
    dumps: dict[int, dict[str, Any]] = {}
    skipped = []
    for path in sorted(_dumps_in(folder)):
        try:
            with open(path, encoding="utf-8") as source:
                document = json.load(source)
            _check(document)
        except (OSError, ValueError, KeyError, TypeError) as exc:
            skipped.append(f"{os.path.basename(path)}: {type(exc).__name__}: {exc}")
            continue
        dumps[int(document["rank"])] = document
    if not dumps:
        why = f" ({'; '.join(skipped)})" if skipped else ""
        raise FileNotFoundError(f"no flight recorder's rank-N.json in {folder!r}{why}")
    return dumps, skipped


def _check(document: Any) -> None:
    """Raise ValueError unless ``document`` has a recorder's shape."""
    if not isinstance(document, dict):
        raise ValueError(f"a {type(document).__name__}, not a recorder's object")
    if not isinstance(document.get("rank"), int) or not isinstance(document.get("entries"), list):
        raise ValueError("no integer 'rank' and list of 'entries'")
    wanted = ("op", "seq", "group", "site", "issued", "completed", "error")
    for entry in document["entries"]:
        if not isinstance(entry, dict) or any(name not in entry for name in wanted):
            raise ValueError(f"an entry without {', '.join(wanted)}: {entry!r:.80}")


def analyse(dumps: dict[int, dict[str, Any]]) -> list[str]:
    """What the dumps say, in lines for people."""
    sizes = [d.get("world_size") for d in dumps.values()]
    world = max([n for n in sizes if isinstance(n, int)] + [max(dumps) + 1])
    lines = [f"{len(dumps)} of {world} ranks dumped: {', '.join(map(str, sorted(dumps)))}"]
    missing = sorted(set(range(world)) - set(dumps))
    if missing:
        lines.append(f"no dump from ranks {missing} (killed before dumping, or never started)")
    silent = sorted(rank for rank, document in dumps.items() if not document["entries"])
    for rank in silent:
        lines.append(
            f"rank {rank} recorded no collective: it stopped (or still waits) before its first"
        )
    for rank, document in sorted(dumps.items()):
        if document.get("reason") == "black box":
            kept = document["entries"]
            last = f"#{kept[-1]['seq']} {kept[-1]['op']}" if kept else "no call"
            lines.append(
                f"rank {rank} left only its black box (its last call: {last}; written "
                f"{_clock(document['dumped'])}): it ended without dumping, killed by SIGKILL or "
                "by an abort in C, or it still runs"
            )
    by_group: dict[tuple[int, ...], dict[int, dict[int, dict[str, Any]]]] = {}
    for rank, document in dumps.items():
        for entry in document["entries"]:
            group = tuple(entry["group"])
            by_group.setdefault(group, {}).setdefault(rank, {})[int(entry["seq"])] = entry
    for group, ranks in sorted(by_group.items(), key=lambda kv: (-len(kv[0]), kv[0])):
        name = "the world" if len(group) == world else f"group {list(group)}"
        whole = not (silent or missing) or len(group) < world
        lines += _divergence(name, group, ranks, every=whole)
        lines += _slowest(name, ranks)
    return lines


def _divergence(
    name: str, group: tuple[int, ...], ranks: dict[int, dict[int, dict[str, Any]]], every: bool
) -> list[str]:
    """The first seq at which the members called different operations, else who stopped early
    (``every``: every member recorded a call)."""
    seqs = sorted({seq for calls in ranks.values() for seq in calls})
    found = first_divergence(
        {
            rank: Timeline(runs=[(seq, calls[seq]["op"]) for seq in sorted(calls)], end=max(calls))
            for rank, calls in ranks.items()
        }
    )
    if found is not None:
        seq = found.seq
        ops = {rank: op for rank, op in found.keys.items() if op is not None}
        counts = collections.Counter(ops.values())
        usual = counts.most_common(1)[0][0]
        odd = {rank: op for rank, op in ops.items() if op != usual}
        most = sorted(rank for rank, op in ops.items() if op == usual)
        where = "; ".join(
            f"rank {rank} called {op} ({ranks[rank][seq].get('site') or '?'})"
            for rank, op in sorted(odd.items())
        )
        return [
            f"{name}: the ranks diverge at operation #{seq}: ranks {most} called {usual}; "
            f"{where}. The odd rank(s) skipped or added a collective before this one."
        ]
    last = {rank: max(calls) for rank, calls in ranks.items()}
    top = max(last.values())
    early = {rank: seq for rank, seq in last.items() if seq < top}
    lines = []
    ahead = sorted(rank for rank, seq in last.items() if seq == top)
    reached = f"rank {ahead[0]}" if len(ahead) == 1 else f"ranks {ahead}"
    for rank, seq in sorted(early.items()):
        entry = ranks[rank][seq]
        lines.append(
            f"{name}: rank {rank} stopped early: its last operation was #{seq} "
            f"({entry['op']}, {entry.get('site') or '?'}); {reached} reached #{top} "
            f"({_op_at(ranks, top)})"
        )
    ends = {rank: calls[max(calls)] for rank, calls in sorted(ranks.items())}
    pending = [
        f"rank {rank} (#{e['seq']} {e['op']})"
        for rank, e in ends.items()
        if e["completed"] is None and e["error"] is None
    ]
    if pending:
        lines.append(f"{name}: still in an operation when dumped: {', '.join(pending)}")
    failed = [
        f"rank {rank} (#{e['seq']} {e['op']}: {e['error']})"
        for rank, e in ends.items()
        if e["error"] is not None
    ]
    if failed:
        lines.append(f"{name}: its last operation failed: {', '.join(failed)}")
    who = "every rank" if every else "the ranks that recorded calls"
    return lines or [f"{name}: {who} called the same {len(seqs)} operations"]


def _clock(stamp: float) -> str:
    """``12:04:31.250`` (local time) of a dump's wall-clock ``stamp``."""
    return time.strftime("%H:%M:%S", time.localtime(stamp)) + f"{stamp % 1:.3f}"[1:]


def _op_at(ranks: dict[int, dict[int, dict[str, Any]]], seq: int) -> str:
    return str(next(calls[seq]["op"] for calls in ranks.values() if seq in calls))


def _slowest(name: str, ranks: dict[int, dict[int, dict[str, Any]]]) -> list[str]:
    """Per operation, the rank that arrived last most often (it spent least time in the call)."""
    last: dict[str, collections.Counter[int]] = collections.defaultdict(collections.Counter)
    seqs = set.intersection(*(set(calls) for calls in ranks.values())) if ranks else set()
    for seq in seqs:
        entries = {rank: calls[seq] for rank, calls in ranks.items()}
        if len({e["op"] for e in entries.values()}) != 1 or len(entries) < 2:
            continue
        spent = {
            rank: e["completed"] - e["issued"]
            for rank, e in entries.items()
            if e["completed"] is not None and e["error"] is None
        }
        if len(spent) == len(entries):
            last[next(iter(entries.values()))["op"]][min(spent, key=spent.__getitem__)] += 1
    return [
        f"{name}: {op}: rank {rank} arrived last in {count} of {sum(counter.values())} calls"
        for op, counter in sorted(last.items())
        for rank, count in [counter.most_common(1)[0]]
    ]
