"""What ``distcomm run`` says when a job fails: the root cause, once, and a line per other rank.

The ranks' reports (:mod:`distcomm._runtime.failure_reports`) name each uncaught exception, its
time, its kind and whether it is a communication error (a consequence of another rank's trouble:
a timeout, a lost peer, a failed rank). The root cause is the earliest exception that is not one
(a collective mismatch, say, even when another rank's timeout came first; else the earliest;
else, without reports, the first rank to fail). Every other rank gets one line that says what
happened to it: its own operation timed out, a peer went away, a collective mismatch, another
exception, or how it ended.
"""

from __future__ import annotations

import json
import os
import signal
from typing import Any

__all__ = ["ended", "failed", "killed_by", "read_reports", "root_cause", "summary_line"]

#: The longest exception message a line quotes.
_QUOTED = 100


def killed_by(code: int, launcher: bool = False) -> signal.Signals | None:
    """The signal that ended a process, from its return code (``-N``); for a ``launcher``'s
    exit status (mpirun's, srun's, distcomm run's own), also from ``128 + N``, the way a
    launcher reports a child killed by signal N. None for an ordinary exit: a Python process's
    own ``sys.exit(130)`` is an exit code."""
    number = -code if code < 0 else code - 128 if launcher and code > 128 else 0
    try:
        return signal.Signals(number) if number else None
    except ValueError:
        return None


def ended(code: int, launcher: bool = False) -> str:
    """How a process ended, in words: ``exit code 3``, ``killed by SIGKILL (signal 9)``, or, for
    a ``launcher``'s ``128 + N``, ``killed by SIGKILL (signal 9; exit code 137)``."""
    sig = killed_by(code, launcher)
    if sig is None:
        return f"exit code {code}"
    return f"killed by {sig.name} (signal {sig.value}{f'; exit code {code}' if code > 0 else ''})"


def failed(code: int) -> str:
    """``failed with exit code 3`` or ``was killed by SIGKILL (signal 9)``: after a rank."""
    return f"was {ended(code)}" if killed_by(code) else f"failed with {ended(code)}"


def read_reports(folder: str) -> dict[int, dict[str, Any]]:
    """The reports the ranks wrote in ``folder``, by rank (unreadable ones skipped)."""
    reports: dict[int, dict[str, Any]] = {}
    try:
        names = os.listdir(folder)
    except OSError:
        return reports
    for name in names:
        if name.startswith("rank-") and name.endswith(".json"):
            try:
                with open(os.path.join(folder, name), encoding="utf-8") as source:
                    report = json.load(source)
                reports[int(report["rank"])] = report
            except (OSError, ValueError, KeyError, TypeError):
                continue
    return reports


def root_cause(reports: dict[int, dict[str, Any]], first_failed: int) -> int:
    """The rank whose exception started it all (module docstring)."""
    if not reports:
        return first_failed
    real = [r for r in reports.values() if not r.get("communication")]
    return int(min(real or reports.values(), key=lambda r: float(r.get("time", 0)))["rank"])


def summary_line(
    rank: int,
    status: int | None,
    report: dict[str, Any] | None,
    root: dict[str, Any] | None = None,
) -> str:
    """One line for a rank that is not the root cause: what happened to it.

    Args:
        rank: the rank.
        status: its return code (-N for signal N), or None if it is still running.
        report: its report, if it wrote one.
        root: the root cause's report, if any: a rank that ``distcomm run`` stopped is said to
            be stopped after the root cause's collective mismatch, or to be a rank that the
            root cause's timed-out operation waited for.
    """
    if report is not None:
        return f"rank {rank}: {_what_happened(report)}"
    if status is None or status == 0:
        return f"rank {rank}: finished" if status == 0 else f"rank {rank}: still running"
    sig = killed_by(status)
    if sig in (signal.SIGTERM, signal.SIGKILL):
        return f"rank {rank}: stopped by distcomm run ({sig.name})" + _after(rank, root)
    return f"rank {rank}: {ended(status)}"


def _what_happened(report: dict[str, Any]) -> str:
    """What a report says happened to its rank, in a few words."""
    kind = report.get("kind")
    operation = _operation(report)
    if kind == "mismatch":  # seq: the first operation at which the ranks' calls differ
        seq = report.get("seq")
        return "collective mismatch" + (f" at operation #{seq}" if seq else "")
    if kind == "timeout":
        limit = report.get("limit")
        line = "timed out" + (f" in {operation}" if operation else "")
        line += f" after {limit:g} s" if isinstance(limit, (int, float)) else ""
        waited = report.get("missing_ranks")
        if waited:
            line += f", waiting for {_ranks(waited)}"
        return line
    if kind == "lost peer":
        return "a peer went away " + (f"during {operation}" if operation else f"({_quote(report)})")
    if kind == "rank failed":
        return f"another rank failed ({_quote(report)})"
    if kind == "interrupted":
        return "interrupted (KeyboardInterrupt)"
    return f"also failed: {_quote(report)}"


def _after(rank: int, root: dict[str, Any] | None) -> str:
    """What the root cause says about a rank that ``distcomm run`` stopped ("" if nothing)."""
    if root is None:
        return ""
    cause = f"rank {root.get('rank')}"
    if root.get("kind") == "mismatch":
        seq = root.get("seq")
        return f" after {cause}'s collective mismatch" + (f" at operation #{seq}" if seq else "")
    if root.get("kind") == "timeout" and rank in (root.get("missing_ranks") or ()):
        return f"; {cause} timed out waiting for it"
    return ""


def _operation(report: dict[str, Any]) -> str:
    """``all_reduce (operation #12)``, or ``recv`` (no sequence number), or "" (no operation)."""
    op, seq = report.get("op"), report.get("seq")
    if not op:
        return ""
    return f"{op} (operation #{seq})" if seq else str(op)


def _ranks(ranks: list[int]) -> str:
    return f"rank {ranks[0]}" if len(ranks) == 1 else "ranks " + ", ".join(map(str, ranks))


def _quote(report: dict[str, Any]) -> str:
    """``Type: the message's first line``, cut at 100 characters."""
    first = (str(report.get("message", "")).strip().splitlines() or [""])[0]
    first = first if len(first) <= _QUOTED else first[: _QUOTED - 1] + "..."
    kind = str(report.get("type", "Exception"))
    return f"{kind}: {first}" if first else kind
