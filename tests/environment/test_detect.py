"""Tests of distcomm.environment.detect (through distcomm.detect_environment): the order in which
the detectors are asked, an explicit method, explain_detection, and purity. Each detector's own
cases: test_detect_env.py, test_detect_slurm.py, test_detect_mpi.py, test_detect_single_node.py.
"""

from __future__ import annotations

import os
import subprocess
import sys
import types
import warnings

import pytest
from launch_tables import (
    BATCH_SCRIPT,
    MPIRUN_IN_SBATCH,
    TORCHRUN,
    TORCHRUN_MULTINODE,
    check_detected,
    launch,
    srun_task,
)

from distcomm._plugins import builtin
from distcomm._plugins.loader import PluginRegistry
from distcomm._runtime.detection import detect_environment, explain_detection
from distcomm.errors import DistcommWarning, EnvironmentDetectionError, InvalidArgumentError

#: Launches that more than one detector could claim: the precedence decides.
PRECEDENCE = [
    pytest.param(
        {**srun_task(1, 1, 0, 2, "n1", "2", 1, job_id="66"), **TORCHRUN_MULTINODE},
        launch("env", 5, 8, 1, 4, 1, 2, "node01", 29400, "job42"),
        id="torchrun-inside-srun",
    ),
    pytest.param(
        {**srun_task(0, 0, 0, 1, "n1", "1", 1, job_id="66"), **TORCHRUN},
        launch("env", 3, 4, 3, 4, 0, 1, "127.0.0.1", 29500, "66", agent_store=True),
        id="torchrun-inside-srun-no-run-id",
    ),
    pytest.param(
        srun_task(1, 1, 0, 2, "n1", "2", 1, PMI_RANK="1", PMI_SIZE="2"),
        launch("slurm", 1, 2, 1, 2, 0, 1, "n1", 16234, "1234.0", "PMI_SIZE=2"),
        id="srun-mpi-pmi2",
    ),
    pytest.param(
        srun_task(1, 1, 0, 2, "n1", "2", 1, PMIX_RANK="1"),
        launch("slurm", 1, 2, 1, 2, 0, 1, "n1", 16234, "1234.0"),
        id="srun-mpi-pmix",
    ),
    pytest.param(
        MPIRUN_IN_SBATCH,
        launch("mpi", 1, 2, 1, 2, 0, 1, "host1", 15077, "77"),
        id="mpirun-in-sbatch",
    ),
]


@pytest.mark.parametrize(("environ", "expected"), PRECEDENCE)
def test_detect_environment(environ: dict[str, str], expected: dict[str, object]) -> None:
    check_detected(environ, expected)


def test_mpirun_in_sbatch_is_mpi_because_the_sizes_differ() -> None:
    lines = explain_detection(MPIRUN_IN_SBATCH)
    assert lines[:2] == ["env: not detected", "slurm: not detected"]
    assert lines[2].startswith("mpi: detected (PMI_RANK and PMI_SIZE set")


@pytest.mark.parametrize(
    ("method", "environ", "expected_method", "expected_rank"),
    [
        ("env", TORCHRUN, "env", 3),
        ("slurm", {**srun_task(1, 1, 0, 2, "n1", "2", 1), **TORCHRUN}, "slurm", 1),
        ("mpi", {**TORCHRUN, "PMI_RANK": "1", "PMI_SIZE": "2"}, "mpi", 1),
        ("single_node", TORCHRUN, "single_node", 0),
        (" SLURM ", srun_task(1, 1, 0, 2, "n1", "2", 1), "slurm", 1),
    ],
)
def test_explicit_method(
    method: str, environ: dict[str, str], expected_method: str, expected_rank: int
) -> None:
    info = detect_environment(method, environ=environ)
    assert (info.method, info.rank) == (expected_method, expected_rank)


@pytest.mark.parametrize(
    ("method", "environ", "needs"),
    [
        ("env", srun_task(1, 1, 0, 2, "n1", "2", 1), "RANK and WORLD_SIZE"),
        ("slurm", TORCHRUN, "an srun task step"),
        ("slurm", MPIRUN_IN_SBATCH, "an srun task step"),
        ("mpi", {}, "an MPI launcher's rank/size variables"),
    ],
)
def test_explicit_method_that_does_not_match(
    method: str, environ: dict[str, str], needs: str
) -> None:
    with pytest.raises(EnvironmentDetectionError) as info:
        detect_environment(method, environ=environ)
    message = str(info.value)
    assert f"method={method!r}" in message
    assert needs in message
    assert "HINT:" in message


@pytest.mark.parametrize(
    ("method", "suggestion"),
    [
        ("slurn", "did you mean 'slurm'?"),
        ("singlenode", "did you mean 'single_node'?"),
        ("torch", "use one of env, mpi, single_node, slurm"),
    ],
)
@pytest.mark.usefixtures("core_registry")
def test_unknown_method(method: str, suggestion: str) -> None:
    with pytest.raises(InvalidArgumentError) as info:
        detect_environment(method, environ={})
    message = str(info.value)
    assert f"unknown launch method {method!r}" in message
    assert "env, mpi, single_node, slurm" in message
    assert f"HINT: {suggestion}" in message


# -- explain_detection ------------------------------------------------------------------------


def test_explain_stops_at_the_first_detected() -> None:
    lines = explain_detection(srun_task(0, 0, 0, 2, "n1", "2", 1))
    assert lines == [
        "env: not detected",
        "slurm: detected (srun task step (SLURM_STEP_ID='0', SLURM_PROCID set))",
    ]


def test_explain_reports_an_error_and_stops() -> None:
    lines = explain_detection({"RANK": "0", "WORLD_SIZE": "abc"})
    assert lines == [
        "env: error: WORLD_SIZE='abc' is not an integer. HINT: unset it or give "
        "it an integer value."
    ]


def test_explain_ends_with_the_fallback() -> None:
    lines = explain_detection({})
    assert lines[:3] == ["env: not detected", "slurm: not detected", "mpi: not detected"]
    assert lines[-1].startswith("single_node: detected (")


# -- registration and purity ------------------------------------------------------------------


def test_builtin_environments_register_in_precedence_order() -> None:
    registry = PluginRegistry()
    record = registry.register(builtin, "builtin", "distcomm")
    assert record.error is None
    specs = registry.environments
    order = sorted(specs, key=lambda name: -specs[name].priority)
    assert order == ["env", "slurm", "mpi", "single_node"]
    assert specs["single_node"].priority < -1_000_000


@pytest.mark.parametrize(
    "environ", [TORCHRUN, MPIRUN_IN_SBATCH, BATCH_SCRIPT, srun_task(0, 0, 0, 1, "a", "1", 1)]
)
def test_detection_does_not_modify_its_input(environ: dict[str, str]) -> None:
    given = dict(environ)
    os_environ = dict(os.environ)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DistcommWarning)
        detect_environment(environ=given)
        detect_environment(environ=types.MappingProxyType(given))
        explain_detection(given)
    assert given == environ
    assert dict(os.environ) == os_environ


def test_given_environ_ignores_os_environ(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert detect_environment(environ={}).method == "single_node"
    assert detect_environment().method == "env"
    assert detect_environment().rank == 1


def test_import_is_light() -> None:
    code = (
        "import sys, distcomm.environment\n"
        "heavy = {'torch', 'numpy', 'mpi4py'} & set(sys.modules)\n"
        "assert not heavy, heavy\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
