"""Tests of distcomm._traces (``distcomm trace DIR``) on made-up flight-recorder dumps: rings that
start at #1 and rings that have wrapped, diverging at the first operation every rank holds; a
rank that left only its black box; which folder a folder of jobs means."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from distcomm import cli
from distcomm._traces import analyse, job_folder, load


def ring(rank: int, ops: dict[int, str], world_size: int = 2) -> dict[str, Any]:
    """A rank's dump: one entry per ``seq: op`` on the world, every one completed."""
    entries = [
        {
            "op": op,
            "seq": seq,
            "group": list(range(world_size)),
            "site": f"train.py:{seq}",
            "issued": 1.0,
            "completed": 2.0,
            "error": None,
        }
        for seq, op in sorted(ops.items())
    ]
    return {"rank": rank, "world_size": world_size, "entries": entries}


def test_rings_from_the_first_operation_diverge_there() -> None:
    lines = analyse(
        {
            0: ring(0, {1: "all_reduce", 2: "barrier"}),
            1: ring(1, {1: "broadcast", 2: "barrier"}),
        }
    )
    said = [line for line in lines if "diverge" in line]
    assert said == [
        "the world: the ranks diverge at operation #1: ranks [0] called all_reduce; rank 1 "
        "called broadcast (train.py:1). The odd rank(s) skipped or added a collective before "
        "this one."
    ], lines


def test_wrapped_rings_diverge_at_the_first_operation_both_hold() -> None:
    # rank 0's ring holds #3-#8, rank 1's #5-#8: they part at #5, the first one both hold
    zero = {seq: "all_reduce" for seq in range(3, 9)}
    one = {5: "broadcast", **{seq: "all_reduce" for seq in range(6, 9)}}
    lines = analyse({0: ring(0, zero), 1: ring(1, one)})
    assert any("diverge at operation #5:" in line for line in lines), lines


def test_equal_rings_and_a_rank_that_stopped_early() -> None:
    same = {seq: "all_reduce" for seq in range(1, 4)}
    assert "the world: every rank called the same 3 operations" in analyse(
        {0: ring(0, same), 1: ring(1, same)}
    )
    lines = analyse({0: ring(0, same), 1: ring(1, {1: "all_reduce", 2: "all_reduce"})})
    assert any("rank 1 stopped early: its last operation was #2" in line for line in lines), lines
    early = {1: "all_reduce", 2: "all_reduce"}
    lines = analyse({0: ring(0, same, 3), 1: ring(1, early, 3), 2: ring(2, early, 3)})
    said = [line for line in lines if "stopped early" in line]
    assert len(said) == 2 and all(
        line.endswith("; rank 0 reached #3 (all_reduce)") for line in said
    )


def test_a_rank_that_left_only_its_black_box_is_named_with_its_last_call() -> None:
    box = {**ring(1, {1: "all_reduce", 2: "all_reduce"}), "reason": "black box", "dumped": 0.5}
    lines = analyse({0: {**ring(0, {1: "all_reduce", 2: "all_reduce"}), "reason": "exit"}, 1: box})
    said = [line for line in lines if "black box" in line]
    assert len(said) == 1 and said[0].startswith(
        "rank 1 left only its black box (its last call: #2 all_reduce; written "
    ), lines
    assert "killed by SIGKILL" in said[0], said


def _job(folder: Path, when: float) -> None:
    folder.mkdir(parents=True)
    dump = folder / "rank-0.json"
    dump.write_text(json.dumps(ring(0, {1: "barrier"}, world_size=1)))
    os.utime(dump, (when, when))


def test_a_folder_of_jobs_means_its_newest_job(tmp_path: Path) -> None:
    _job(tmp_path / "b-older", 1_000_000)
    _job(tmp_path / "a-newer", 2_000_000)
    (tmp_path / "empty").mkdir()
    assert job_folder(str(tmp_path)) == (str(tmp_path / "a-newer"), 2)
    assert job_folder(str(tmp_path / "b-older")) == (str(tmp_path / "b-older"), 0)
    with pytest.raises(FileNotFoundError, match="nor in a folder in it"):
        job_folder(str(tmp_path / "empty"))


def test_distcomm_trace_without_a_folder_reads_the_newest_job_here(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _job(tmp_path / "distcomm-trace" / "old", 1_000_000)
    _job(tmp_path / "distcomm-trace" / "new", 2_000_000)
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("DISTCOMM_TRACE_DIR", raising=False)
    assert cli.main(["trace"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == f"{Path('distcomm-trace', 'new')}: the newest of 2 jobs in distcomm-trace", out
    assert out[1] == "1 of 1 ranks dumped: 0", out
    (tmp_path / "distcomm-trace" / "new" / "rank-0.json").unlink()
    (tmp_path / "distcomm-trace" / "old" / "rank-0.json").unlink()
    assert cli.main(["trace"]) == 2
    err = capsys.readouterr().err
    assert "'distcomm-trace'" in err and "the newest job is read" in err and "HINT" in err, err


def test_a_rank_without_calls_a_missing_rank_and_a_failed_call_are_said() -> None:
    same = {1: "all_reduce", 2: "barrier"}
    zero = ring(0, same, 3)
    zero["entries"][-1] |= {"completed": None, "error": "DistTimeoutError: waited 3 s"}
    lines = analyse({0: zero, 1: {**ring(1, {}, 3), "entries": []}})
    assert "no dump from ranks [2] (killed before dumping, or never started)" in lines, lines
    assert "rank 1 recorded no collective: it stopped (or still waits) before its first" in lines
    failed = (
        "the world: its last operation failed: rank 0 (#2 barrier: DistTimeoutError: waited 3 s)"
    )
    assert failed in lines, lines
    assert not any("still in an operation" in line or "every rank" in line for line in lines)


def test_files_that_are_no_recorders_are_left_out_and_named(tmp_path: Path) -> None:
    (tmp_path / "rank-0.json").write_text(json.dumps(ring(0, {1: "barrier"})))
    (tmp_path / "rank-1.json").write_text('{"rank": 1, "entries": null}')
    (tmp_path / "rank-2.json").write_text("[]")
    (tmp_path / "rank-3.json").write_text("{not json")
    dumps, skipped = load(str(tmp_path))
    assert list(dumps) == [0], dumps
    assert [line.split(":")[0] for line in skipped] == [f"rank-{r}.json" for r in (1, 2, 3)]
    assert "'entries'" in skipped[0] and "a list, not" in skipped[1], skipped
    (tmp_path / "rank-0.json").unlink()
    with pytest.raises(FileNotFoundError, match=r"rank-3\.json: JSONDecodeError"):
        load(str(tmp_path))
