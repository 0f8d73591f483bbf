"""The conformance suite on gloo, through the kit a plugin author runs: ``distcomm run -n N -m
pytest --pyargs distcomm.testing.conformance --distcomm-backend=gloo`` at N = 1, 2 and 4, with
node memory (docs/backends.md#node-memory) forced on (``DISTCOMM_NODE_MEMORY=require``: a group
that cannot use it fails) and off (Gloo carries every call)."""

from __future__ import annotations

import re
import sys

import pytest
from jobs import run_job

from distcomm.testing.conformance import CHECKS


@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    ("nprocs", "node_memory"),
    [(1, "auto"), (2, "require"), (2, "off"), (4, "require"), (4, "off")],
)
def test_gloo_passes_the_conformance_kit(nprocs: int, node_memory: str) -> None:
    kit = ["-m", "pytest", "-q", "-p", "no:cacheprovider", "--pyargs"]
    kit += ["distcomm.testing.conformance", "--distcomm-backend=gloo"]
    command = [sys.executable, "-m", "distcomm", "run", "-n", str(nprocs), *kit]
    done = run_job(command, timeout=280, env={"DISTCOMM_NODE_MEMORY": node_memory})
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    passed = re.findall(rf"\[rank (\d+)\] {len(CHECKS)} passed in ", done.stdout)
    assert sorted(map(int, passed)) == list(range(nprocs)), done.stdout[-4000:]
    assert re.search(rf"\[rank 0\] total\s+{len(CHECKS)}\s+0\n", done.stdout)  # the summary
