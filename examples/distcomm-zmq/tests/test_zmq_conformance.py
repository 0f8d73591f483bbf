"""The zmq backend as its users meet it: distcomm's conformance kit at 1, 2, 3 and 4 ranks under
``distcomm run``, ``examples/hello.py`` on 4 ranks, and the selection by name."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from distcomm.testing.conformance import CHECKS

ROOT = Path(__file__).resolve().parents[3]


def run(*args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    """``python *args`` from the repository's root, as a user's shell would start it."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DISTCOMM_", "MASTER_"))}
    return subprocess.run(
        [sys.executable, *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )


@pytest.mark.timeout(300)
@pytest.mark.parametrize("nprocs", [1, 2, 3, 4])
def test_the_conformance_kit_passes(nprocs: int) -> None:
    kit = ["-m", "pytest", "-q", "-p", "no:cacheprovider"]
    kit += ["--pyargs", "distcomm.testing.conformance"]
    done = run("-m", "distcomm", "run", "-n", str(nprocs), *kit, "--distcomm-backend=zmq")
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    for rank in range(nprocs):  # pytest's last line on every rank: every check passed
        assert f"[rank {rank}] {len(CHECKS)} passed in " in done.stdout, done.stdout[-4000:]
    assert "[rank 0] total" in done.stdout  # the summary per capability and topic


@pytest.mark.timeout(120)
def test_hello_on_four_ranks() -> None:
    done = run("-m", "distcomm", "run", "-n", "4", "--backend", "zmq", "examples/hello.py")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "[rank 0] 4 ranks on zmq (env launch): sum of ranks 6 (expected 6)",
        "[rank 0] hello from rank-0, rank-1, rank-2, rank-3",
    ]


def test_info_explains_it() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "distcomm", "info", "--explain"],
        env={**os.environ, "DISTCOMM_BACKEND": "zmq"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert "backend 'zmq' requested by DISTCOMM_BACKEND" in done.stdout, done.stdout
    assert "zmq                            distcomm-zmq" in done.stdout
