"""distcomm.compat.axolotl: axolotl's utils.distributed, at world 1 and on 4 ranks of every
backend (fakelink threads, gloo processes, mpirun; scenarios in tests/support/multirank.py)."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from multirank import caught, outcome, scenario

import distcomm
from distcomm.compat import axolotl
from distcomm.testing import run_threads

BACKENDS = ["threads", "gloo", "mpirun"]


def test_not_distributed() -> None:
    assert not axolotl.is_distributed() and axolotl.is_main_process()
    assert not distcomm.is_initialized()  # one process: nothing to initialise
    axolotl.barrier()
    assert axolotl.gather_scalar_from_all_ranks(lambda: 3) == [3]
    assert axolotl.gather_from_all_ranks(lambda: {"a": 1}) == [{"a": 1}]
    assert axolotl.compute_and_broadcast(lambda: torch.tensor(2.5)) == 2.5
    assert axolotl.reduce_and_broadcast(lambda: 4, sum) == 4
    with axolotl.zero_first(True), axolotl.zero_only() as main:
        assert main is True


def test_is_main_process_is_global_rank_zero(monkeypatch: pytest.MonkeyPatch) -> None:
    """axolotl tested LOCAL_RANK == 0: the first process of node 1 was a "main" too."""
    for name, value in {"RANK": "4", "WORLD_SIZE": "8", "LOCAL_RANK": "0"}.items():
        monkeypatch.setenv(name, value)
    assert not axolotl.is_main_process()


def test_first_use_initialises_under_a_launch() -> None:
    def body() -> tuple[bool, bool]:
        return axolotl.is_distributed(), distcomm.is_initialized()

    assert run_threads(body, 2) == [(True, True)] * 2


def test_zero_only_as_a_decorator_runs_on_main_only() -> None:
    calls: list[int] = []

    @axolotl.zero_only
    def save(x: int) -> int:
        calls.append(distcomm.get_rank())
        return x

    @axolotl.zero_only()
    def log() -> str:
        return "logged"

    def body() -> tuple[Any, Any]:
        return save(5), log()

    assert run_threads(body, 3) == [(5, "logged"), (None, None), (None, None)]
    assert calls == [0]
    with pytest.raises(ValueError, match="it decorates one function"):
        axolotl.zero_only()(5)


# -- scenarios, on every backend ----------------------------------------------------------------
@scenario
def axolotl_helpers(workdir: str) -> dict[str, Any]:
    rank = distcomm.get_rank()
    seen: dict[str, Any] = {"distributed": axolotl.is_distributed()}
    seen["main"] = axolotl.is_main_process()
    with axolotl.zero_only() as main:
        seen["zero_only"] = main
    axolotl.barrier()
    big = 2**53 + 1  # not a float32, not even a float64
    seen["scalars"] = axolotl.gather_scalar_from_all_ranks(lambda: big + rank if rank else 0.5)
    seen["objects"] = axolotl.gather_from_all_ranks(lambda: {"rank": rank}, world_size=1)
    seen["computed"] = axolotl.compute_and_broadcast(lambda: rank + 41)
    seen["reduced"] = axolotl.reduce_and_broadcast(lambda: rank + 1, lambda xs: sum(xs) / len(xs))
    return seen


@scenario
def axolotl_faults(workdir: str) -> dict[str, Any]:
    rank = distcomm.get_rank()

    def fails_on(bad: int) -> Any:
        def fn() -> int:
            if rank == bad:
                raise ValueError(f"bad value on {bad}")
            return rank

        return fn

    def zero_first() -> None:
        with axolotl.zero_first(axolotl.is_main_process()):
            if rank == 0:
                raise OSError("download failed")

    return {
        "gather": caught(axolotl.gather_scalar_from_all_ranks, fails_on(1)),
        "compute": caught(axolotl.compute_and_broadcast, fails_on(0)),
        "reduce": caught(axolotl.reduce_and_broadcast, fails_on(3), sum),
        "zero_first": caught(zero_first),
    }


@pytest.mark.parametrize("backend", BACKENDS)
def test_helpers_on_four_ranks(backend: str, scenario_worlds: Any) -> None:
    results = scenario_worlds(backend)[outcome(axolotl_helpers)]
    big = 2**53 + 1
    for rank, seen in enumerate(results):
        assert seen["distributed"] and seen["main"] == seen["zero_only"] == (rank == 0)
        assert seen["computed"] == 41 and seen["reduced"] == 2.5
        if rank == 0:
            assert seen["scalars"] == [0.5, big + 1, big + 2, big + 3]
            assert all(type(v) is int for v in seen["scalars"][1:])
            assert seen["objects"] == [{"rank": r} for r in range(4)]  # the real world size
        else:
            assert seen["scalars"] is None and seen["objects"] is None


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_failing_fn_never_leaves_ranks_waiting(backend: str, scenario_worlds: Any) -> None:
    results = scenario_worlds(backend)[outcome(axolotl_faults)]
    gather = [r["gather"] for r in results]
    assert gather == [
        ("RankFailedError", 1),
        ("ValueError", "bad value on 1"),
        ("ok", None),
        ("ok", None),
    ]
    compute = [r["compute"] for r in results]
    assert compute == [("ValueError", "bad value on 0"), *[("RankFailedError", 0)] * 3]
    reduce = [r["reduce"] for r in results]
    assert reduce == [*[("RankFailedError", 3)] * 3, ("ValueError", "bad value on 3")]
    zero_first = [r["zero_first"] for r in results]
    assert zero_first == [("OSError", "download failed"), *[("RankFailedError", 0)] * 3]


def test_a_collective_in_a_zero_only_function_is_stopped() -> None:
    @axolotl.zero_only
    def log() -> None:
        distcomm.barrier()  # only main runs this

    def body() -> tuple[str, Any]:
        return caught(log)

    kind, message = run_threads(body, 2)[0]
    assert kind == "MainOnlyCollectiveError" and "inside zero_only 'test_a_collective" in message
