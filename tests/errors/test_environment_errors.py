"""The catalogue's malformed-launcher rows (docs/errors.md, row 9): each variable set wrong
raises EnvironmentDetectionError naming the variable and its value, from detection, from
``init()`` and from the getters before init."""

from __future__ import annotations

import pytest

import distcomm
from distcomm import EnvironmentDetectionError

#: An srun task step of 2 tasks on one node, rank 0, before the mistake is applied.
SRUN_STEP = {
    "SLURM_JOB_ID": "42",
    "SLURM_STEP_ID": "0",
    "SLURM_PROCID": "0",
    "SLURM_NTASKS": "2",
    "SLURM_LOCALID": "0",
    "SLURM_NODEID": "0",
    "SLURM_NNODES": "1",
    "SLURM_NODELIST": "node1",
}
TORCHRUN = {"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}

#: (id, environment, variable, value, the message's start)
ROWS = [
    (
        "SLURM_NTASKS=abc",
        {**SRUN_STEP, "SLURM_NTASKS": "abc"},
        "SLURM_NTASKS",
        "abc",
        "SLURM_NTASKS='abc' is not an integer. HINT: unset it or give it an integer value.",
    ),
    (
        "RANK empty",
        {**TORCHRUN, "RANK": ""},
        "RANK",
        "",
        "RANK='' is not an integer. HINT: unset it or give it an integer value.",
    ),
    (
        "WORLD_SIZE=0",
        {**TORCHRUN, "WORLD_SIZE": "0"},
        "WORLD_SIZE",
        "0",
        "WORLD_SIZE='0' must be at least 1. HINT: check the launcher's variables.",
    ),
    (
        "RANK=3 WORLD_SIZE=2",
        {**TORCHRUN, "RANK": "3"},
        "RANK",
        "3",
        "env launch: rank=3 (from RANK) must be in [0, world_size=2). HINT: check the "
        "launcher's variables, or pass distcomm.init(method=...) to pick another method.",
    ),
]


@pytest.mark.parametrize(
    ("environ", "variable", "value", "expected"),
    [pytest.param(*row[1:], id=row[0]) for row in ROWS],
)
def test_detection_names_the_variable_and_value(
    environ: dict[str, str], variable: str, value: str, expected: str
) -> None:
    with pytest.raises(EnvironmentDetectionError) as info:
        distcomm.detect_environment(environ=environ)
    assert str(info.value) == expected
    assert (info.value.variable, info.value.value) == (variable, value)


@pytest.mark.parametrize(
    ("environ", "expected"), [pytest.param(row[1], row[4], id=row[0]) for row in ROWS]
)
def test_init_and_getters_raise_the_same(
    monkeypatch: pytest.MonkeyPatch, environ: dict[str, str], expected: str
) -> None:
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    for fn in (distcomm.init, distcomm.get_rank, distcomm.is_main_process):
        with pytest.raises(EnvironmentDetectionError) as info:
            fn()
        assert str(info.value) == expected
    assert not distcomm.is_initialized()
