"""Tests of launch detection: tables of environments, what each detects, and what each rejects."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import types
import warnings

import pytest

from distcomm.environment import LaunchInfo, builtin, detect_environment, explain_detection
from distcomm.errors import DistcommWarning, EnvironmentDetectionError, InvalidArgumentError
from distcomm.registry import Registry

FIELDS = [field.name for field in dataclasses.fields(LaunchInfo) if field.name != "sources"]
#: Fields every detector names a source for (mpi_wireup has one only when it is set).
SOURCED = [name for name in FIELDS[1:] if name != "mpi_wireup"]


def launch(
    method: str,
    rank: int,
    world_size: int,
    local_rank: int,
    local_world_size: int,
    node_rank: int,
    num_nodes: int,
    master_addr: str | None,
    master_port: int | None,
    job_id: str | None,
    mpi_wireup: str | None = None,
) -> dict[str, object]:
    """Return the expected LaunchInfo fields by name."""
    return {
        "method": method,
        "rank": rank,
        "world_size": world_size,
        "local_rank": local_rank,
        "local_world_size": local_world_size,
        "node_rank": node_rank,
        "num_nodes": num_nodes,
        "master_addr": master_addr,
        "master_port": master_port,
        "job_id": job_id,
        "mpi_wireup": mpi_wireup,
    }


def srun_task(
    procid: int,
    localid: int,
    nodeid: int,
    ntasks: int,
    nodelist: str,
    tasks_per_node: str,
    nnodes: int,
    job_id: str = "1234",
    **extra: str,
) -> dict[str, str]:
    """Return what srun sets for one task of step 0 (Slurm >= 20), plus ``extra``."""
    return {
        "SLURM_JOB_ID": job_id,
        "SLURM_JOBID": job_id,
        "SLURM_STEP_ID": "0",
        "SLURM_STEPID": "0",
        "SLURM_PROCID": str(procid),
        "SLURM_LOCALID": str(localid),
        "SLURM_NODEID": str(nodeid),
        "SLURM_NTASKS": str(ntasks),
        "SLURM_NPROCS": str(ntasks),
        "SLURM_STEP_NUM_TASKS": str(ntasks),
        "SLURM_NNODES": str(nnodes),
        "SLURM_STEP_NUM_NODES": str(nnodes),
        "SLURM_JOB_NODELIST": nodelist,
        "SLURM_NODELIST": nodelist,
        "SLURM_STEP_NODELIST": nodelist,
        "SLURM_TASKS_PER_NODE": tasks_per_node,
        "SLURM_STEP_TASKS_PER_NODE": tasks_per_node,
        **extra,
    }


TORCHRUN = {
    "RANK": "3",
    "WORLD_SIZE": "4",
    "LOCAL_RANK": "3",
    "LOCAL_WORLD_SIZE": "4",
    "GROUP_RANK": "0",
    "GROUP_WORLD_SIZE": "1",
    "ROLE_RANK": "3",
    "ROLE_WORLD_SIZE": "4",
    "MASTER_ADDR": "127.0.0.1",
    "MASTER_PORT": "29500",
    "TORCHELASTIC_RUN_ID": "none",
}
TORCHRUN_MULTINODE = {
    "RANK": "5",
    "WORLD_SIZE": "8",
    "LOCAL_RANK": "1",
    "LOCAL_WORLD_SIZE": "4",
    "GROUP_RANK": "1",
    "GROUP_WORLD_SIZE": "2",
    "MASTER_ADDR": "node01",
    "MASTER_PORT": "29400",
    "TORCHELASTIC_RUN_ID": "job42",
}
BATCH_SCRIPT = {
    "SLURM_JOB_ID": "9001",
    "SLURM_NTASKS": "4",
    "SLURM_NPROCS": "4",
    "SLURM_PROCID": "0",
    "SLURM_LOCALID": "0",
    "SLURM_NODEID": "0",
    "SLURM_NNODES": "1",
    "SLURM_NODELIST": "n1",
    "SLURM_TASKS_PER_NODE": "4",
}
MPIRUN_IN_SBATCH = {
    **srun_task(0, 0, 0, 1, "host1", "1", 1, job_id="77"),
    "SLURM_NTASKS": "2",
    "PMI_RANK": "1",
    "PMI_SIZE": "2",
    "MPI_LOCALRANKID": "1",
    "MPI_LOCALNRANKS": "2",
}

DETECTED = [
    pytest.param(
        TORCHRUN, launch("env", 3, 4, 3, 4, 0, 1, "127.0.0.1", 29500, None), id="torchrun"
    ),
    pytest.param(
        TORCHRUN_MULTINODE,
        launch("env", 5, 8, 1, 4, 1, 2, "node01", 29400, "job42"),
        id="torchrun-multinode",
    ),
    pytest.param(
        {"RANK": "1", "WORLD_SIZE": "2"},
        launch("env", 1, 2, 1, 2, 0, 1, "127.0.0.1", None, None),
        id="env-minimal",
    ),
    pytest.param(
        {"RANK": "5", "WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "4"},
        launch("env", 5, 8, 1, 4, 1, 2, None, None, None),
        id="env-local-size-only",
    ),
    pytest.param(
        {"RANK": "0", "WORLD_SIZE": "1", "SLURM_JOB_ID": "55"},
        launch("env", 0, 1, 0, 1, 0, 1, "127.0.0.1", None, "55"),
        id="env-slurm-job",
    ),
    pytest.param(
        {**srun_task(1, 1, 0, 2, "n1", "2", 1, job_id="66"), **TORCHRUN_MULTINODE},
        launch("env", 5, 8, 1, 4, 1, 2, "node01", 29400, "job42"),
        id="torchrun-inside-srun",
    ),
    pytest.param(
        {**srun_task(0, 0, 0, 1, "n1", "1", 1, job_id="66"), **TORCHRUN},
        launch("env", 3, 4, 3, 4, 0, 1, "127.0.0.1", 29500, "66"),
        id="torchrun-inside-srun-no-run-id",
    ),
    pytest.param(
        srun_task(4, 0, 2, 6, "node[01-03]", "2(x3)", 3),
        launch("slurm", 4, 6, 0, 2, 2, 3, "node01", 16234, "1234"),
        id="srun-node01-03",
    ),
    pytest.param(
        srun_task(6, 0, 3, 7, "a,b[1-2],c", "2(x3),1", 4),
        launch("slurm", 6, 7, 0, 1, 3, 4, "a", 16234, "1234"),
        id="srun-a-b12-c-last",
    ),
    pytest.param(
        srun_task(3, 1, 1, 7, "a,b[1-2],c", "2(x3),1", 4, job_id="987654"),
        launch("slurm", 3, 7, 1, 2, 1, 4, "a", 22654, "987654"),
        id="srun-a-b12-c-mid",
    ),
    pytest.param(
        srun_task(1, 1, 0, 7, "a,b[1-2],c", "2(x3),1", 4),
        launch("slurm", 1, 7, 1, 2, 0, 4, "a", 16234, "1234"),
        id="srun-a-b12-c-first",
    ),
    pytest.param(
        srun_task(1, 0, 1, 2, "linux[1,2]", "1(x2)", 2),
        launch("slurm", 1, 2, 0, 1, 1, 2, "linux1", 16234, "1234"),
        id="srun-linux12",
    ),
    pytest.param(
        srun_task(3, 1, 1, 7, "nodeA,nodeB[001,003],nodeC", "2(x3),1", 4),
        launch("slurm", 3, 7, 1, 2, 1, 4, "nodeA", 16234, "1234"),
        id="srun-nodeB001",
    ),
    pytest.param(
        srun_task(5, 1, 1, 8, "gpu-[1-2]-ib", "4(x2)", 2),
        launch("slurm", 5, 8, 1, 4, 1, 2, "gpu-1-ib", 16234, "1234"),
        id="srun-gpu-ib",
    ),
    pytest.param(
        srun_task(2, 0, 2, 4, "x[1-2]y[3-4]", "1(x4)", 4),
        launch("slurm", 2, 4, 0, 1, 2, 4, "x1y3", 16234, "1234"),
        id="srun-xy",
    ),
    pytest.param(
        {
            "SLURM_STEP_ID": "3",
            "SLURM_PROCID": "1",
            "SLURM_NTASKS": "2",
            "SLURM_LOCALID": "0",
            "SLURM_NODEID": "1",
            "SLURM_JOB_NODELIST": "linux[1,2]",
            "SLURM_TASKS_PER_NODE": "1(x2)",
            "SLURM_JOB_ID": "10000",
        },
        launch("slurm", 1, 2, 0, 1, 1, 2, "linux1", 15000, "10000"),
        id="srun-old-variables",
    ),
    pytest.param(
        {
            "SLURM_STEP_ID": "0",
            "SLURM_PROCID": "2",
            "SLURM_STEP_NUM_TASKS": "4",
            "SLURM_LOCALID": "0",
            "SLURM_NODEID": "1",
            "SLURM_STEP_NUM_NODES": "2",
        },
        launch("slurm", 2, 4, 0, 2, 1, 2, None, None, None),
        id="srun-bare",
    ),
    pytest.param(
        srun_task(1, 1, 0, 2, "n1", "2", 1, PMI_RANK="1", PMI_SIZE="2"),
        launch("slurm", 1, 2, 1, 2, 0, 1, "n1", 16234, "1234", "PMI_SIZE=2"),
        id="srun-mpi-pmi2",
    ),
    pytest.param(
        srun_task(1, 1, 0, 2, "n1", "2", 1, PMIX_RANK="1"),
        launch("slurm", 1, 2, 1, 2, 0, 1, "n1", 16234, "1234"),
        id="srun-mpi-pmix",
    ),
    pytest.param(
        srun_task(1, 1, 0, 2, "n1", "2", 1, MASTER_ADDR="10.0.0.7", MASTER_PORT="2345"),
        launch("slurm", 1, 2, 1, 2, 0, 1, "10.0.0.7", 2345, "1234"),
        id="srun-master-override",
    ),
    pytest.param(
        MPIRUN_IN_SBATCH,
        launch("mpi", 1, 2, 1, 2, 0, 1, "host1", 15077, "77"),
        id="mpirun-in-sbatch",
    ),
    pytest.param(
        {
            "OMPI_COMM_WORLD_RANK": "2",
            "OMPI_COMM_WORLD_SIZE": "4",
            "OMPI_COMM_WORLD_LOCAL_RANK": "0",
            "OMPI_COMM_WORLD_LOCAL_SIZE": "2",
            "OMPI_MCA_ess_base_jobid": "3456",
            "PMIX_RANK": "2",
        },
        launch("mpi", 2, 4, 0, 2, 1, 2, None, None, "3456"),
        id="openmpi",
    ),
    pytest.param(
        {
            "MV2_COMM_WORLD_RANK": "1",
            "MV2_COMM_WORLD_SIZE": "3",
            "MV2_COMM_WORLD_LOCAL_RANK": "1",
            "MV2_COMM_WORLD_LOCAL_SIZE": "3",
        },
        launch("mpi", 1, 3, 1, 3, 0, 1, None, None, None),
        id="mvapich",
    ),
    pytest.param(
        {"PMI_RANK": "3", "PMI_SIZE": "4", "MPI_LOCALRANKID": "1", "MPI_LOCALNRANKS": "2"},
        launch("mpi", 3, 4, 1, 2, 1, 2, None, None, None),
        id="mpich-hydra",
    ),
    pytest.param(
        {"PMI_RANK": "3", "PMI_SIZE": "4"},
        launch("mpi", 3, 4, 3, 4, 0, 1, None, None, None),
        id="mpich-no-local",
    ),
    pytest.param(
        {"PMIX_RANK": "2", "OMPI_COMM_WORLD_SIZE": "3"},
        launch("mpi", 2, 3, 2, 3, 0, 1, None, None, None),
        id="pmix-ompi-size",
    ),
    pytest.param(
        {"PMIX_RANK": "1", "PMI_SIZE": "2", "MPI_LOCALNRANKS": "1"},
        launch("mpi", 1, 2, 0, 1, 1, 2, None, None, None),
        id="pmix-pmi-size",
    ),
    pytest.param(
        {
            "PMI_RANK": "0",
            "PMI_SIZE": "2",
            "MASTER_ADDR": "head",
            "MASTER_PORT": "4000",
            "SLURM_JOB_ID": "12",
            "SLURM_NODELIST": "n[3-4]",
        },
        launch("mpi", 0, 2, 0, 2, 0, 1, "head", 4000, "12"),
        id="mpi-master-override",
    ),
    pytest.param(
        {"PMI_RANK": "0", "PMI_SIZE": "2", "SLURM_JOB_ID": "12", "SLURM_NODELIST": "n[3-4]"},
        launch("mpi", 0, 2, 0, 2, 0, 1, "n3", 15012, "12"),
        id="mpi-slurm-defaults",
    ),
    pytest.param(
        {"PMIX_RANK": "0"},
        launch("single_node", 0, 1, 0, 1, 0, 1, "127.0.0.1", None, None),
        id="pmix-alone",
    ),
    pytest.param({}, launch("single_node", 0, 1, 0, 1, 0, 1, "127.0.0.1", None, None), id="empty"),
    pytest.param(
        {"SLURM_JOB_ID": "8", "SLURM_NTASKS": "1", "SLURM_PROCID": "0"},
        launch("single_node", 0, 1, 0, 1, 0, 1, "127.0.0.1", None, "8"),
        id="batch-one-task",
    ),
    pytest.param(
        {**BATCH_SCRIPT, "SLURM_NTASKS": "1", "SLURM_STEP_ID": "extern"},
        launch("single_node", 0, 1, 0, 1, 0, 1, "127.0.0.1", None, "9001"),
        id="extern-step",
    ),
]


@pytest.mark.parametrize(("environ", "expected"), DETECTED)
def test_detect_environment(environ: dict[str, str], expected: dict[str, object]) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        info = detect_environment(environ=environ)
    assert {name: getattr(info, name) for name in FIELDS} == expected
    wireup = {"mpi_wireup"} if info.mpi_wireup is not None else set()
    assert set(info.sources) == {*SOURCED, "method", *wireup}
    for name in SOURCED:
        source = info.sources[name]
        assert source in environ or source == "default" or source.startswith("derived: ")
    assert info.sources["method"]


@pytest.mark.parametrize(
    "environ",
    [
        pytest.param(BATCH_SCRIPT, id="no-step-id"),
        pytest.param({**BATCH_SCRIPT, "SLURM_STEP_ID": "batch"}, id="batch-step"),
        pytest.param({**BATCH_SCRIPT, "SLURM_STEP_ID": "4294967294"}, id="batch-step-number"),
        pytest.param({**BATCH_SCRIPT, "SLURM_STEP_ID": "4294967290"}, id="salloc-interactive"),
    ],
)
def test_batch_script_without_srun_warns(environ: dict[str, str]) -> None:
    with pytest.warns(DistcommWarning, match=r"SLURM_NTASKS=4.*HINT: srun python") as record:
        info = detect_environment(environ=environ)
    assert len(record) == 1
    assert (info.method, info.rank, info.world_size, info.job_id) == ("single_node", 0, 1, "9001")


def test_mpirun_in_sbatch_is_mpi_because_the_sizes_differ() -> None:
    lines = explain_detection(MPIRUN_IN_SBATCH)
    assert lines[:2] == ["env: not detected", "slurm: not detected"]
    assert lines[2].startswith("mpi: detected (PMI_RANK and PMI_SIZE set")


def test_srun_pmi2_reason_names_the_agreeing_size() -> None:
    info = detect_environment(
        environ=srun_task(0, 0, 0, 2, "n1", "2", 1, PMI_SIZE="2", PMI_RANK="0")
    )
    assert "PMI_SIZE=2 equals the step's task count" in info.sources["method"]
    assert info.mpi_wireup == "PMI_SIZE=2" and info.sources["mpi_wireup"] == "PMI_SIZE=2"
    assert detect_environment(environ=srun_task(0, 0, 0, 2, "n1", "2", 1)).mpi_wireup is None


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


# -- malformed values: an error naming the variable and its value ------------------------------

ERRORS = [
    pytest.param({"RANK": "", "WORLD_SIZE": "2"}, "RANK", "''", id="empty-rank"),
    pytest.param({"RANK": "0", "WORLD_SIZE": "abc"}, "WORLD_SIZE", "'abc'", id="bad-world"),
    pytest.param({"RANK": "0", "WORLD_SIZE": "0"}, "WORLD_SIZE", "'0'", id="zero-world"),
    pytest.param({"RANK": "4", "WORLD_SIZE": "4"}, "RANK", "rank=4", id="rank-too-big"),
    pytest.param({"RANK": "0"}, "WORLD_SIZE", "RANK='0'", id="rank-without-world"),
    pytest.param({"WORLD_SIZE": "2"}, "RANK", "WORLD_SIZE='2'", id="world-without-rank"),
    pytest.param(
        {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "-1"},
        "LOCAL_RANK",
        "'-1'",
        id="negative-local-rank",
    ),
    pytest.param(
        {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "2", "LOCAL_WORLD_SIZE": "2"},
        "LOCAL_RANK",
        "local_rank=2",
        id="local-rank-too-big",
    ),
    pytest.param(
        {"RANK": "0", "WORLD_SIZE": "2", "MASTER_PORT": "http"},
        "MASTER_PORT",
        "'http'",
        id="bad-port",
    ),
    pytest.param(
        {"RANK": "0", "WORLD_SIZE": "2", "MASTER_PORT": "70000"},
        "MASTER_PORT",
        "70000",
        id="port-out-of-range",
    ),
    pytest.param(
        {"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": " "},
        "MASTER_ADDR",
        "' '",
        id="empty-master-addr",
    ),
    pytest.param(
        {**srun_task(0, 0, 0, 2, "n1", "2", 1), "SLURM_STEP_NODELIST": "node[1-"},
        "SLURM_STEP_NODELIST",
        "'node[1-'",
        id="hostlist-unclosed",
    ),
    pytest.param(
        {**srun_task(0, 0, 0, 2, "n1", "2", 1), "SLURM_STEP_NODELIST": "node[3-1]"},
        "SLURM_STEP_NODELIST",
        "'node[3-1]'",
        id="hostlist-backwards",
    ),
    pytest.param(
        {**srun_task(0, 0, 0, 2, "n1", "2", 1), "SLURM_STEP_NODELIST": "node[a-b]"},
        "SLURM_STEP_NODELIST",
        "'node[a-b]'",
        id="hostlist-letters",
    ),
    pytest.param(
        {**srun_task(0, 0, 0, 2, "n1", "2", 1), "SLURM_STEP_NODELIST": ","},
        "SLURM_STEP_NODELIST",
        "','",
        id="hostlist-comma",
    ),
    pytest.param(
        {**srun_task(0, 0, 0, 2, "n1", "2", 1), "SLURM_STEP_NODELIST": ""},
        "SLURM_STEP_NODELIST",
        "''",
        id="hostlist-empty",
    ),
    pytest.param(
        {**srun_task(0, 0, 0, 2, "n1", "2", 1), "SLURM_STEP_TASKS_PER_NODE": "2(x)"},
        "SLURM_STEP_TASKS_PER_NODE",
        "'2(x)'",
        id="tasks-per-node-no-count",
    ),
    pytest.param(
        {**srun_task(0, 0, 0, 2, "n1", "2", 1), "SLURM_STEP_TASKS_PER_NODE": "x3"},
        "SLURM_STEP_TASKS_PER_NODE",
        "'x3'",
        id="tasks-per-node-letters",
    ),
    pytest.param(
        srun_task(0, 0, 0, 6, "n[1-3]", "2(x2)", 3),
        "SLURM_STEP_TASKS_PER_NODE",
        "'2(x2)'",
        id="tasks-per-node-length",
    ),
    pytest.param(
        srun_task(0, 0, 2, 4, "n[1-2]", "2(x2)", 2), "SLURM_NODEID", "'2'", id="node-id-too-big"
    ),
    pytest.param(
        srun_task(4, 0, 0, 4, "n1", "4", 1), "SLURM_PROCID", "rank=4", id="procid-too-big"
    ),
    pytest.param(
        {**srun_task(0, 0, 0, 2, "n1", "2", 1), "SLURM_STEP_NUM_TASKS": "two"},
        "SLURM_STEP_NUM_TASKS",
        "'two'",
        id="bad-step-tasks",
    ),
    pytest.param(
        {k: v for k, v in srun_task(0, 0, 0, 2, "n1", "2", 1).items() if k != "SLURM_LOCALID"},
        "SLURM_LOCALID",
        "is unset",
        id="no-localid",
    ),
    pytest.param(
        {"SLURM_STEP_ID": "", "SLURM_PROCID": "0"}, "SLURM_STEP_ID", "''", id="empty-step-id"
    ),
    pytest.param(
        {"OMPI_COMM_WORLD_RANK": "0"},
        "OMPI_COMM_WORLD_SIZE",
        "OMPI_COMM_WORLD_RANK='0'",
        id="ompi-rank-without-size",
    ),
    pytest.param({"PMI_RANK": "0", "PMI_SIZE": "two"}, "PMI_SIZE", "'two'", id="bad-pmi-size"),
    pytest.param({"PMI_RANK": "2", "PMI_SIZE": "2"}, "PMI_RANK", "rank=2", id="pmi-rank-too-big"),
    pytest.param(
        {**BATCH_SCRIPT, "SLURM_NTASKS": "many"}, "SLURM_NTASKS", "'many'", id="batch-bad-ntasks"
    ),
]


@pytest.mark.parametrize(("environ", "variable", "shown"), ERRORS)
def test_malformed_environment(environ: dict[str, str], variable: str, shown: str) -> None:
    with pytest.raises(EnvironmentDetectionError) as info:
        detect_environment(environ=environ)
    message = str(info.value)
    assert variable in message
    assert shown in message
    assert "HINT:" in message
    assert info.value.variable == variable


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
    registry = Registry()
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
