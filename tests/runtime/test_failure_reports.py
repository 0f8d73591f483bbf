"""Tests of distcomm._runtime.failure_reports: what a rank under ``distcomm run`` reports of its
uncaught exception (its kind, whether it is a communication error, the operation)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from distcomm._runtime.failure_reports import VARIABLE, is_communication_error, kind_of, report
from distcomm.errors import (
    CollectiveMismatchError,
    DistTimeoutError,
    EngineError,
    NotInitializedError,
    RankFailedError,
)

TIMEOUT = DistTimeoutError(
    "all_reduce (operation #12) on gloo 'world' (4 ranks) did not complete within 2.5 s; ...",
    op="all_reduce",
    seq=12,
    missing_ranks=[0, 2],
)
MISMATCH = CollectiveMismatchError(
    "collective mismatch at operation #7 on gloo 'world' (2 ranks): ...",
    table=[],
    op="broadcast",
    seq=7,
)


@pytest.mark.parametrize(
    ("exc", "kind", "communication"),
    [
        (TIMEOUT, "timeout", True),
        (DistTimeoutError("barrier timed out"), "timeout", True),
        (EngineError("all_reduce failed: Connection closed by peer"), "lost peer", True),
        (RuntimeError("[pair.cc:534] Connection reset by peer"), "lost peer", True),
        (RankFailedError(3, "boom"), "rank failed", True),
        (MISMATCH, "mismatch", False),
        (EngineError("all_reduce failed: invalid device pointer"), "other", False),
        (RuntimeError("CUDA out of memory"), "other", False),
        (ValueError("Connection closed by peer"), "other", False),
        (NotInitializedError("call distcomm.init()"), "other", False),
        (KeyboardInterrupt(), "interrupted", False),
    ],
)
def test_each_exception_has_a_kind(exc: BaseException, kind: str, communication: bool) -> None:
    assert kind_of(exc) == kind
    assert is_communication_error(exc) is communication


def test_a_report_carries_the_operation_and_a_timeout_s_limit() -> None:
    timed_out = report(1, TIMEOUT, None)
    assert timed_out["kind"] == "timeout" and timed_out["communication"] is True
    assert (timed_out["op"], timed_out["seq"], timed_out["missing_ranks"]) == (
        "all_reduce",
        12,
        [0, 2],
    )
    assert timed_out["limit"] == 2.5
    assert (timed_out["rank"], timed_out["type"]) == (1, "DistTimeoutError")
    mismatch = report(0, MISMATCH, None)
    assert (mismatch["kind"], mismatch["communication"]) == ("mismatch", False)
    assert (mismatch["op"], mismatch["seq"], mismatch["missing_ranks"]) == ("broadcast", 7, None)
    assert "limit" not in mismatch
    other = report(0, ValueError("bad shard"), None)
    assert (other["kind"], other["message"]) == ("other", "bad shard")
    assert "op" not in other
    assert json.loads(json.dumps(timed_out)) == timed_out


RAISES = """
from distcomm._runtime import failure_reports
from distcomm.errors import DistTimeoutError
failure_reports.install(3)
message = "barrier (operation #2) on x did not complete within 5 s"
raise DistTimeoutError(message, op="barrier", seq=2)
"""


@pytest.mark.timeout(60)
def test_an_uncaught_exception_is_reported_then_printed(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-c", RAISES],
        env={VARIABLE: str(tmp_path), "PATH": ""},
        capture_output=True,
        text=True,
        timeout=50,
        check=False,
    )
    assert done.returncode == 1
    assert done.stderr.splitlines()[-1].startswith("distcomm.errors.DistTimeoutError: barrier")
    written = json.loads((tmp_path / "rank-3.json").read_text())
    assert (written["rank"], written["kind"], written["op"], written["seq"]) == (
        3,
        "timeout",
        "barrier",
        2,
    )
    assert (written["limit"], written["missing_ranks"]) == (5.0, None)
    assert written["traceback"].startswith("Traceback (most recent call last):")
    assert [path.name for path in tmp_path.iterdir()] == ["rank-3.json"]
