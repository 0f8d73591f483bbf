"""What ``distcomm bench`` shows: progress on rank 0 (a tqdm bar on a terminal when tqdm is
installed, else one line per step), the table at the end, the JSON file."""

from __future__ import annotations

import json
import sys
from typing import Any

from distcomm._measures import human_bytes

__all__ = ["Progress", "print_table", "write_json"]


def _time(seconds: float) -> str:
    if seconds < 1e-3:
        return f"{seconds * 1e6:.1f} us"
    return f"{seconds * 1e3:.2f} ms" if seconds < 1 else f"{seconds:.2f} s"


class Progress:
    """Progress of the plan's steps on stderr; silent when not ``enabled`` (other ranks)."""

    def __init__(self, total: int, enabled: bool) -> None:
        self.total, self.enabled, self.count = total, enabled, 0
        self.bar: Any = None
        if enabled and sys.stderr.isatty():
            try:
                from tqdm import tqdm
            except ImportError:
                pass
            else:
                self.bar = tqdm(total=total, unit="step", desc="distcomm bench", leave=False)

    def note(self, text: str) -> None:
        if self.enabled:
            self._write(f"distcomm bench: {text}")

    def start(self, step: str) -> None:
        if self.bar is not None:
            self.bar.set_postfix_str(step)

    def done(self, records: list[dict[str, Any]]) -> None:
        self.count += 1
        if not self.enabled:
            return
        if self.bar is not None:
            self.bar.update(1)
            return
        first = records[0]
        times = ", ".join(f"{r['engine']} {_time(r['time_s'])}" for r in records)
        self._write(
            f"[{self.count}/{self.total}] {first['op']} {human_bytes(first['size'])}: {times}"
        )

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()

    def _write(self, line: str) -> None:
        if self.bar is not None:
            self.bar.write(line, file=sys.stderr)
        else:
            sys.stderr.write(line + "\n")
            sys.stderr.flush()


def print_table(records: list[dict[str, Any]]) -> None:
    """The records as a table on stdout; ``raw/distcomm`` above 1 means distcomm is faster."""
    if not records:
        print("distcomm bench: nothing was measured")
        return
    first = records[0]
    print(
        f"distcomm bench: {first['backend']}, {first['world_size']} rank(s); time per call is "
        "the slowest rank's, median (min-max) of the rounds; busbw as nccl-tests"
    )
    compare = any("raw_over_distcomm" in r for r in records)
    head = f"{'op':<18} {'size':>8} {'engine':<8} {'time per call':>30} {'algbw GB/s':>11} "
    head += f"{'busbw GB/s':>11}" + (f" {'raw/distcomm':>13}" if compare else "")
    print(head)
    for r in records:
        spread = f"{_time(r['time_s'])} ({_time(r['time_min_s'])}-{_time(r['time_max_s'])})"
        line = f"{r['op']:<18} {human_bytes(r['size']):>8} {r['engine']:<8} {spread:>30} "
        line += f"{r['algbw_GBps']:>11.3f} {r['busbw_GBps']:>11.3f}"
        if "raw_over_distcomm" in r:
            line += f" {r['raw_over_distcomm']:>13.2f}"
        print(line)
    sys.stdout.flush()


def write_json(path: str, header: dict[str, Any], records: list[dict[str, Any]]) -> None:
    """``{...header, "records": [...]}`` to ``path``."""
    with open(path, "w", encoding="utf-8") as out:
        json.dump({**header, "records": records}, out, indent=1)
        out.write("\n")
