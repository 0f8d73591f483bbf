"""What a user of released packages gets, and the API reference: the two jobs of the repository
that are shell scripts, run by the suite so that they overlap with the other tests.

- **The wheel job** (``scripts/wheels.sh``): every distribution built (``scripts/release.sh``)
  and installed from its wheels into a fresh venv outside the checkout, where ``distcomm info``,
  ``examples/hello.py`` under ``distcomm run -n 2`` and ``mpirun -n 2``, the conformance kit at 2
  ranks on gloo and on mpi, and ``distcomm bench --plot`` run.
- **The documentation site** (``scripts/docs.sh``): the API reference's pages up to date with
  the docstrings of every public module's ``__all__`` (``scripts/reference.py --check``, which
  tests/test_reference.py also runs, alone and in seconds), ``mkdocs build --strict`` of docs/,
  and the checks mkdocs cannot make.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from jobs import job_environment

ROOT = Path(__file__).resolve().parents[1]


def run_script(script: str, timeout: float) -> subprocess.CompletedProcess[str]:
    """``bash scripts/SCRIPT`` from the checkout, its output (stderr too) captured."""
    return subprocess.run(
        ["bash", f"scripts/{script}"],
        cwd=ROOT,
        env=job_environment(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )


@pytest.mark.timeout(900)
def test_the_wheel_job_installs_every_distribution_from_wheels_and_runs_there() -> None:
    done = run_script("wheels.sh", 840)
    assert done.returncode == 0, done.stdout[-6000:]
    steps = [line for line in done.stdout.splitlines() if line.startswith("scripts/wheels.sh: ")]
    assert steps[-1] == "scripts/wheels.sh: passed", done.stdout[-6000:]


@pytest.mark.timeout(600)
def test_the_api_reference_builds_strictly_and_shows_every_public_name() -> None:
    done = run_script("docs.sh", 540)
    assert done.returncode == 0, done.stdout[-6000:]
    assert "the documentation builds (mkdocs build --strict) and matches every __all__" in (
        done.stdout
    ), done.stdout[-6000:]
