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
        step = f"{first['op']} {human_bytes(first['size'])}" if first["bytes"] else first["op"]
        self._write(f"[{self.count}/{self.total}] {step}: {times}")

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()

    def _write(self, line: str) -> None:
        if self.bar is not None:
            self.bar.write(line, file=sys.stderr)
        else:
            sys.stderr.write(line + "\n")
            sys.stderr.flush()


#: What a table's "time per call" is for the ops where it is not one collective on ``size``.
_NOTES = {
    "barrier": "barrier: one call, no payload (size -), so no bandwidth",
    "sendrecv": "sendrecv: one message of size bytes, half a ping-pong round trip between ranks "
    "0 and 1 (the others idle)",
}


def print_table(
    records: list[dict[str, Any]],
    no_raw: list[str] | tuple[str, ...] = (),
    node_memory: bool = False,
) -> None:
    """The records as a table on stdout; ``raw/distcomm`` above 1 means distcomm is faster.
    The ops in ``no_raw`` (``--compare raw`` found no engine call) get a ``raw n/a`` row;
    ``node_memory``: the communicator's CPU tensors went through node memory, which a line
    says (the ``raw`` rows are then the engine's own path)."""
    if not records:
        print("distcomm bench: nothing was measured")
        return
    first = records[0]
    print(
        f"distcomm bench: {first['backend']}, {first['world_size']} rank(s); time per call is "
        "the slowest rank's, median (min-max) of the rounds; busbw as nccl-tests"
    )
    if node_memory:
        print(
            "distcomm's CPU tensor collectives and barriers go through node memory (every rank "
            "on this node; docs/backends.md#node-memory); raw rows: the engine's own call"
        )
    compare = any("raw_over_distcomm" in r for r in records) or bool(no_raw)
    head = f"{'op':<18} {'size':>8} {'engine':<8} {'time per call':>30} {'algbw GB/s':>11} "
    print(head + f"{'busbw GB/s':>11}" + (f" {'raw/distcomm':>13}" if compare else ""))
    for r in records:
        size = human_bytes(r["size"]) if r["bytes"] else "-"
        spread = f"{_time(r['time_s'])} ({_time(r['time_min_s'])}-{_time(r['time_max_s'])})"
        line = f"{r['op']:<18} {size:>8} {r['engine']:<8} {spread:>30} "
        line += f"{_rate(r['algbw_GBps']):>11} {_rate(r['busbw_GBps']):>11}"
        if "raw_over_distcomm" in r:
            line += f" {r['raw_over_distcomm']:>13.2f}"
        print(line)
        if r["engine"] == "distcomm" and r["op"] in no_raw:
            print(f"{r['op']:<18} {size:>8} {'raw':<8} {'n/a (no engine call)':>30}")
    ops = dict.fromkeys(r["op"] for r in records)
    for op in (op for op in _NOTES if op in ops):
        print(f"  {_NOTES[op]}")
    sys.stdout.flush()


def _rate(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def write_json(path: str, header: dict[str, Any], records: list[dict[str, Any]]) -> None:
    """``{...header, "records": [...]}`` to ``path``."""
    with open(path, "w", encoding="utf-8") as out:
        json.dump({**header, "records": records}, out, indent=1)
        out.write("\n")
