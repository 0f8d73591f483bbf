"""distcomm.compat.speechbrain: speechbrain.utils.distributed, at world 1 and on 4 ranks of every
backend (fakelink threads, gloo processes, mpirun; scenarios in tests/support/multirank.py)."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from jobs import run_job
from multirank import outcome, scenario

import distcomm
from distcomm.compat import speechbrain as sb
from distcomm.errors import EnvironmentDetectionError, RankFailedError

BACKENDS = ["threads", "gloo", "mpirun"]


def test_single_process() -> None:
    assert sb.get_rank() is None and sb.if_main_process()
    assert sb.rank_prefixed_message("hi") == "hi"
    sb.ddp_init_group({"distributed_backend": "gloo"})  # a plain process: returns, no init
    assert not sb.is_distributed_initialized()
    sb.ddp_barrier()
    assert sb.ddp_broadcast({"a": 1}) == {"a": 1}
    assert sb.ddp_all_reduce(3, "sum") == 3
    assert sb.run_on_main(lambda: 7) == 7


@pytest.mark.parametrize(
    ("environ", "rank"),
    [
        ({"RANK": "3", "LOCAL_RANK": "1"}, 3),
        ({"LOCAL_RANK": "1", "SLURM_PROCID": "5"}, 1),
        ({"SLURM_PROCID": "5", "JSM_NAMESPACE_RANK": "2"}, 5),
        ({"JSM_NAMESPACE_RANK": "2"}, 2),
        ({"PMI_RANK": "1", "PMI_SIZE": "2"}, 1),  # mpirun (MPICH): from launch detection
        ({}, None),
    ],
)
def test_get_rank_reads_the_launcher(
    monkeypatch: pytest.MonkeyPatch, environ: dict[str, str], rank: int | None
) -> None:
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    assert sb.get_rank() == rank
    assert sb.if_main_process() == (rank in (0, None))
    assert sb.rank_prefixed_message("m") == ("m" if rank is None else f"[rank: {rank}] m")


def test_bad_rank_variable_names_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RANK", "zero")
    with pytest.raises(EnvironmentDetectionError, match="RANK='zero'"):
        sb.get_rank()


def test_unknown_backend_is_a_value_error() -> None:
    with pytest.raises(ValueError, match=r"unknown backend 'ncl'.*did you mean 'nccl'"):
        sb.ddp_init_group({"distributed_backend": "ncl"})


RECIPE = """
import sys
from distcomm.compat import speechbrain as sb
import distcomm

sb.ddp_init_group({"distributed_backend": sys.argv[1]})
total = sb.ddp_all_reduce(1, "sum")
print(sb.rank_prefixed_message(f"{distcomm.get_backend()} {total}"), flush=True)
distcomm.finalize()
"""


def distcomm_run(request: pytest.FixtureRequest) -> list[str]:
    """``distcomm run`` starting 2 ranks of the script that follows."""
    return [sys.executable, "-m", "distcomm", "run", "-n", "2"]


def mpirun_job(request: pytest.FixtureRequest) -> list[str]:
    """``mpirun`` starting 2 ranks of the script that follows (the ``mpirun`` fixture's)."""
    return [request.getfixturevalue("mpirun"), "-n", "2", sys.executable]


@pytest.mark.timeout(200)
@pytest.mark.parametrize(
    ("launcher", "backend"),
    [pytest.param(distcomm_run, "gloo", id="gloo"), pytest.param(mpirun_job, "mpi", id="mpirun")],
)
def test_init_group_initialises_under_a_launcher(
    launcher: Callable[[pytest.FixtureRequest], list[str]],
    backend: str,
    tmp_path: Path,
    request: pytest.FixtureRequest,
) -> None:
    """As a speechbrain recipe: launched (distcomm run / mpirun), ddp_init_group inits."""
    script = tmp_path / "recipe.py"
    script.write_text(RECIPE)
    done = run_job([*launcher(request), str(script), backend])
    assert done.returncode == 0, done.stdout + done.stderr
    for rank in range(2):
        assert f"[rank: {rank}] {backend} 2" in done.stdout


# -- scenarios, on every backend ----------------------------------------------------------------
@scenario
def speechbrain_helpers(workdir: str) -> dict[str, Any]:
    rank = distcomm.get_rank()
    seen: dict[str, Any] = {"rank": sb.get_rank(), "main": sb.if_main_process()}
    seen["message"] = sb.rank_prefixed_message("epoch 1")

    @sb.main_process_only
    def checkpoint(step: int) -> str:
        sb.ddp_barrier()  # no-ops inside a main-only function: nobody else is there
        same = sb.ddp_broadcast("local", src=0)
        total = sb.ddp_all_reduce(5, "sum")
        return f"{step}:{same}:{total}:{distcomm.get_rank()}"

    seen["checkpoint"] = checkpoint(10)
    with sb.MainProcessContext():
        seen["in_context"] = sb.ddp_broadcast(rank)
    seen["broadcast"] = sb.ddp_broadcast({"from": rank}, src=2)
    grads = torch.full((3,), float(rank))
    seen["all_reduce"] = sb.ddp_all_reduce(grads, torch.distributed.ReduceOp.SUM).tolist()
    seen["numpy_max"] = sb.ddp_all_reduce(np.array([rank]), distcomm.ReduceOp.MAX).tolist()
    seen["number_mean"] = sb.ddp_all_reduce(float(rank), "mean")
    seen["run_on_main"] = sb.run_on_main(lambda: f"made by {distcomm.get_rank()}")
    return seen


@scenario
def speechbrain_faults(workdir: str) -> tuple[str, Any]:
    @sb.main_process_only
    def prepare() -> None:
        raise RuntimeError("corrupt archive")

    try:
        sb.run_on_main(prepare)
    except RankFailedError as exc:
        return "RankFailedError", exc.rank
    except RuntimeError as exc:
        return "RuntimeError", str(exc)
    return "ok", None


@pytest.mark.parametrize("backend", BACKENDS)
def test_helpers_on_four_ranks(backend: str, scenario_worlds: Any) -> None:
    results = scenario_worlds(backend)[outcome(speechbrain_helpers)]
    for rank, seen in enumerate(results):
        assert (seen["rank"], seen["main"]) == (rank, rank == 0)
        assert seen["message"] == f"[rank: {rank}] epoch 1"
        assert seen["checkpoint"] == "10:local:5:0"  # main's result on every rank
        assert seen["in_context"] == rank
        assert seen["broadcast"] == {"from": 2}
        assert seen["all_reduce"] == [6.0] * 3 and seen["numpy_max"] == [3]
        assert seen["number_mean"] == 1.5
        assert seen["run_on_main"] == "made by 0"


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_failure_on_main_ends_the_others(backend: str, scenario_worlds: Any) -> None:
    results = scenario_worlds(backend)[outcome(speechbrain_faults)]
    assert results == [("RuntimeError", "corrupt archive"), *[("RankFailedError", 0)] * 3]


def test_main_only_sections_keep_ddp_no_ops_and_guard_direct_collectives() -> None:
    """speechbrain's ddp_* stay no-ops inside a main-only section (as in speechbrain); a direct
    distcomm collective there raises MainOnlyCollectiveError instead of hanging."""
    from distcomm.testing import run_threads

    def body() -> tuple[Any, ...]:
        if not sb.if_main_process():
            return ()
        with sb.MainProcessContext():
            sb.ddp_barrier()
            got = sb.ddp_broadcast({"a": 1})
            try:
                distcomm.barrier()
            except distcomm.MainOnlyCollectiveError as exc:
                return got, exc.region.split(" (")[0]
        return (got, "no guard")

    results = run_threads(body, 2)
    assert results == [({"a": 1}, "speechbrain's MainProcessContext"), ()]
