"""What every ``distcomm bench`` test checks of the JSON a run wrote, whatever the launcher."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

#: nccl-tests' bus bandwidth factors, written out here independently of distcomm's table.
FACTORS = {
    "all_reduce": lambda n: 2 * (n - 1) / n,
    "broadcast": lambda n: 1.0,
    "reduce": lambda n: 1.0,
    "all_gather": lambda n: (n - 1) / n,
    "gather": lambda n: (n - 1) / n,
    "scatter": lambda n: (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "all_to_all": lambda n: (n - 1) / n,
    "all_gather_object": lambda n: (n - 1) / n,
    "broadcast_object": lambda n: 1.0,
    "gather_object": lambda n: (n - 1) / n,
    "scatter_object": lambda n: (n - 1) / n,
}
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def check_bench_json(
    path: Path, ops: list[str], sizes: list[int], world_size: int, compared: set[str]
) -> dict[str, Any]:
    """Check the records of a run of ``ops`` at ``sizes``: one per (op, size, engine), distcomm
    always and the engine's own call for the ops in ``compared``; times > 0, algbw = bytes /
    time, busbw = algbw x the nccl-tests factor. Returns the document."""
    doc = json.loads(path.read_text())
    assert doc["world_size"] == world_size
    records = doc["records"]
    keys = [(r["op"], r["size"], r["engine"]) for r in records]
    assert len(keys) == len(set(keys)), f"a (op, size, engine) appears twice: {keys}"
    want = {(op, size, "distcomm") for op in ops for size in sizes}
    want |= {(op, size, "raw") for op in compared for size in sizes}
    assert set(keys) == want, f"missing {want - set(keys)}, unexpected {set(keys) - want}"
    for r in records:
        what = f"{r['op']} {r['size']} {r['engine']}"
        assert r["world_size"] == world_size and r["backend"] == doc["backend"], what
        assert r["time_s"] > 0 and r["time_min_s"] <= r["time_s"] <= r["time_max_s"], what
        assert r["bytes"] > 0 and r["iters"] >= 1, what
        assert math.isclose(r["algbw_GBps"], r["bytes"] / r["time_s"] / 1e9, rel_tol=1e-9), what
        factor = FACTORS[r["op"]](world_size)
        assert math.isclose(r["busbw_factor"], factor), what
        assert math.isclose(r["busbw_GBps"], r["algbw_GBps"] * factor, rel_tol=1e-9), what
        if r["engine"] == "raw":
            assert r["raw_over_distcomm"] > 0, what
    return doc


def check_png(path: Path) -> None:
    """A PNG of a readable size (two panels of lines, not an empty canvas)."""
    data = path.read_bytes()
    assert data.startswith(PNG_MAGIC), f"{path} is not a PNG"
    assert len(data) > 20_000, f"{path} is only {len(data)} bytes"
