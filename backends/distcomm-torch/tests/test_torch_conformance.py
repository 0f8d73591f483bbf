"""The conformance suite on gloo, through the kit a plugin author runs: ``distcomm run -n N -m
pytest --pyargs distcomm.testing.conformance --distcomm-backend=gloo`` at N = 1, 2 and 4."""

from __future__ import annotations

import re
import sys

import pytest
from jobs import run_job

from distcomm.testing.conformance import CHECKS


@pytest.mark.timeout(300)
@pytest.mark.parametrize("nprocs", [1, 2, 4])
def test_gloo_passes_the_conformance_kit(nprocs: int) -> None:
    kit = ["-m", "pytest", "-q", "-p", "no:cacheprovider", "--pyargs"]
    kit += ["distcomm.testing.conformance", "--distcomm-backend=gloo"]
    done = run_job([sys.executable, "-m", "distcomm", "run", "-n", str(nprocs), *kit], timeout=280)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    passed = re.findall(rf"\[rank (\d+)\] {len(CHECKS)} passed in ", done.stdout)
    assert sorted(map(int, passed)) == list(range(nprocs)), done.stdout[-4000:]
    assert re.search(rf"\[rank 0\] total\s+{len(CHECKS)}\s+0\n", done.stdout)  # the summary
