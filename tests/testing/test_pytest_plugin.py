"""distcomm's pytest plugin ends a real MPI job as soon as one rank fails a multi-rank test."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from jobs import dev_shm_names

FAILING = """
import pytest
import distcomm


@pytest.mark.mpi(min_size=2)
def test_rank_one_disagrees():
    comm = distcomm.init(backend="mpi")
    if comm.rank == 1:
        assert comm.rank == 0, "rank 1 disagrees"
    comm.barrier()  # without the plugin, the other ranks would wait here forever
"""


@pytest.mark.timeout(120)
@pytest.mark.usefixtures("aborted_mpich_job")
def test_a_failing_rank_ends_the_job_with_its_report(tmp_path: Path, mpirun: str) -> None:
    (tmp_path / "test_failing.py").write_text(textwrap.dedent(FAILING))
    shm = dev_shm_names()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DISTCOMM_", "PYTEST_"))}
    command = [
        mpirun,
        "-n",
        "3",
        sys.executable,
        "-m",
        "pytest",
        "--with-mpi",
        "-q",
        "-p",
        "no:cacheprovider",
        "test_failing.py",
    ]
    done = subprocess.run(
        command,
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=90,
        stdin=subprocess.DEVNULL,
    )  # a deadlock would hit this
    assert done.returncode != 0
    assert (
        "[rank 1] distcomm: rank 1 of 3 failed test_failing.py::test_rank_one_disagrees (call)"
        in done.stderr
    )
    assert "rank 1 disagrees" in done.stderr
    assert not dev_shm_names() - shm  # MPICH's segment removed before MPI_Abort


def test_plugin_is_inert_outside_mpi(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
        import pytest

        @pytest.mark.mpi
        def test_fails():
            assert False

        def test_after():
            pass
        """
    )
    result = pytester.runpytest("-p", "no:cacheprovider", "-p", "no:mpi")
    result.assert_outcomes(failed=1, passed=1)
