"""scripts/gpu-check.sh, the one command for a GPU machine, on a machine without one: every
part is listed as skipped, the summary says why, and it exits 0 (on a GPU machine it runs them:
docs/backends.md)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_without_a_gpu_every_part_is_skipped_and_it_says_so() -> None:
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a GPU is here: scripts/gpu-check.sh runs its parts (see docs/backends.md)")
    done = subprocess.run(
        ["bash", str(ROOT / "scripts" / "gpu-check.sh")],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    parts = [line for line in lines if "skipped (no GPU)" in line]
    assert len(parts) == 12, done.stdout
    for part in ("a world of 1 calling NCCL", "conformance kit", "DDP", "bench --device cuda"):
        assert any(part in line for line in parts), f"{part!r} is not in the summary"
    assert lines[-1] == "gpu-check: no GPU: skipped (torch sees no CUDA device on this machine)"
