"""distcomm.profile() and DISTCOMM_PROFILE: the counts equal the calls made, per operation and
size bucket, on thread-ranks and in a real 2-rank gloo job."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from jobs import run_job

import distcomm
from distcomm.errors import InvalidArgumentError
from distcomm.testing import run_threads

# float32: 1 KiB and 8 B (their buckets: 1024 and 8); objects and barrier have no size
CALLS = {("all_reduce", 1024): 5, ("broadcast", 8): 3, ("all_gather_object", None): 2}


def workload() -> None:
    rank = distcomm.get_rank()
    big, small = np.ones(256, dtype=np.float32), np.ones(2, dtype=np.float32)
    for _ in range(5):
        distcomm.all_reduce(big)
    for _ in range(3):
        distcomm.broadcast(small, src=1)
    for _ in range(2):
        distcomm.all_gather_object({"rank": rank})


def profiled() -> dict[str, Any]:
    with distcomm.profile() as p:
        workload()
    distcomm.barrier()  # after the block: not counted
    return p


def counts(summary: dict[str, Any]) -> dict[tuple[str, int | None], int]:
    return {(row["op"], row["size"]): row["count"] for row in summary["ops"]}


def test_profile_counts_every_call_once_on_every_rank() -> None:
    summaries = run_threads(profiled, 3)
    assert all(s == summaries[0] for s in summaries), "the same summary on every rank"
    summary = summaries[0]
    assert summary["world_size"] == 3 and summary["ranks"] == [0, 1, 2]
    assert counts(summary) == CALLS
    for row in summary["ops"]:
        assert row["total_s"] > 0
        assert sum(row["waited_longest"].values()) == row["count"], row
        if row["size"] is None:
            assert row["algbw_GBps"] is None and row["busbw_GBps"] is None
        else:
            nbytes = row["size"] * row["count"]
            assert row["algbw_GBps"] == pytest.approx(nbytes / row["total_s"] / 1e9)
    reduce = next(r for r in summary["ops"] if r["op"] == "all_reduce")
    assert reduce["busbw_GBps"] == pytest.approx(reduce["algbw_GBps"] * 2 * 2 / 3)


def late_rank() -> dict[str, Any]:
    """Rank 2 arrives late at every all_reduce: ranks 0 and 1 wait for it, longest."""
    import time

    with distcomm.profile() as p:
        for _ in range(4):
            if distcomm.get_rank() == 2:
                time.sleep(0.05)
            distcomm.all_reduce(np.ones(4, dtype=np.float32))
    return p


def test_waited_longest_names_the_ranks_that_arrived_first() -> None:
    summary = run_threads(late_rank, 3)[0]
    (row,) = summary["ops"]
    assert row["waited_longest"][2] == 0
    assert row["waited_longest"][0] + row["waited_longest"][1] == 4


def test_a_bad_distcomm_profile_is_refused_at_init(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DISTCOMM_PROFILE", "yes")
    with pytest.raises(InvalidArgumentError, match=r"DISTCOMM_PROFILE='yes'.*HINT"):
        distcomm.init()
    assert not distcomm.is_initialized()


SCRIPT = """
import numpy as np
import distcomm

distcomm.init()
for _ in range(7):
    distcomm.all_reduce(np.ones(16384, dtype=np.float32))  # 64 KiB
distcomm.barrier()
distcomm.broadcast_object({"x": 1})
distcomm.finalize()
"""


@pytest.mark.timeout(120)
def test_distcomm_profile_prints_the_summary_at_finalize_on_rank_0(tmp_path: Path) -> None:
    script = tmp_path / "job.py"
    script.write_text(SCRIPT)
    command = ["env", "DISTCOMM_PROFILE=1", sys.executable, "-m", "distcomm", "run", "-n", "2"]
    done = run_job([*command, "--backend", "gloo", str(script)], timeout=100)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stderr.splitlines()
    assert sum("distcomm profile: 2 rank(s)" in line for line in lines) == 1, done.stderr
    assert not any(line.startswith("[rank 1] distcomm profile") for line in lines)
    counted = {}
    for line in lines:  # [rank 0] op size count ...; size is "-" or two words ("64 KiB")
        words = line.split()
        if line.startswith("[rank 0] ") and words[2] in (
            "all_reduce",
            "barrier",
            "broadcast_object",
        ):
            counted[(words[2], " ".join(words[3:5]) if words[3] != "-" else None)] = int(
                words[5] if words[3] != "-" else words[4]
            )
    assert counted == {
        ("all_reduce", "64 KiB"): 7,
        ("barrier", None): 1,
        ("broadcast_object", None): 1,
    }
