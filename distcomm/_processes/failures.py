"""What ``distcomm run`` says when a job fails: the root cause, once, and a line per other rank.

The ranks' reports (:mod:`distcomm._runtime.failure_reports`) name each uncaught exception, its
time and whether it is a communication error. The root cause is the earliest exception that is
not one (else the earliest; else, without reports, the first rank to fail).
"""

from __future__ import annotations

import json
import os
import signal
from typing import Any

__all__ = ["read_reports", "root_cause", "summary_line"]


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


def summary_line(rank: int, status: int | None, report: dict[str, Any] | None) -> str:
    """One line for a rank that is not the root cause: what happened to it."""
    if report is not None:
        first = (str(report.get("message", "")).strip().splitlines() or [""])[0]
        first = first if len(first) <= 100 else first[:99] + "..."
        what = f"{report.get('type', 'Exception')}: {first}" if first else report.get("type", "")
        if report.get("communication"):
            return f"rank {rank}: peer went away ({what})"
        return f"rank {rank}: also failed: {what}"
    if status is None or status == 0:
        return f"rank {rank}: finished" if status == 0 else f"rank {rank}: still running"
    if status > 128 and status - 128 in (signal.SIGTERM, signal.SIGKILL):
        return f"rank {rank}: stopped by distcomm run ({signal.Signals(status - 128).name})"
    return f"rank {rank}: exit code {status}"
