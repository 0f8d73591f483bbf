"""The catalogue's rows that apply to every backend, as conformance checks (docs/errors.md):
on fakelink thread-ranks here, and on the linklink stand-in in one call in a warm world of 2
processes.

gloo and mpi run the same checks in test_gloo_errors.py and test_mpi_errors.py; every backend's
full conformance run includes them too.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import error_rows
import pytest

import distcomm
from distcomm.testing import WarmWorld, run_threads
from distcomm.testing.conformance import CHECKS, run_all

STANDIN = Path(__file__).resolve().parents[2] / "backends/distcomm-linklink/tests/standin"


def test_the_catalogue_names_registered_checks() -> None:
    assert set(error_rows.ERROR_CHECKS) <= set(CHECKS)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_checks_on_fakelink_threads(world_size: int) -> None:
    results = run_threads(run_all, world_size, error_rows.ERROR_CHECKS, timeout=45)
    assert results == [list(error_rows.ERROR_CHECKS)] * world_size


@pytest.fixture
def standin(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The linklink stand-in importable here and in the ranks (they take this sys.path)."""
    pytest.importorskip("distcomm_linklink")
    monkeypatch.syspath_prepend(str(STANDIN))
    for name in ("linklink", "spring", "spring.linklink"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    yield
    sys.modules.pop("linklink", None)


def linklink_rank() -> dict[str, error_rows.Outcome]:
    """Each linklink rank: the checks, init again, and the finalized communicator (row 8)."""
    comm = distcomm.get_communicator()
    rows = error_rows.running_rows("linklink")
    rows.update(error_rows.finalized_rows(comm))
    return rows


@pytest.mark.timeout(150)
@pytest.mark.usefixtures("standin")
def test_rows_on_the_linklink_stand_in(warm_world: Callable[..., WarmWorld]) -> None:
    for rank, rows in enumerate(warm_world(2, "linklink").run(linklink_rank, timeout=120)):
        error_rows.expect_row(rows, "conformance", "returned", repr(list(error_rows.ERROR_CHECKS)))
        error_rows.expect_row(rows, "init again, same arguments", "returned", "True")
        error_rows.expect_row(
            rows, "init again, another backend", "AlreadyInitializedError", "(running: 'linklink')"
        )
        error_rows.expect_row(
            rows,
            "finalized comm.all_reduce",
            "DistcommError",
            "communicator linklink 'world' (2 ranks) can no longer be used: finalized. HINT:",
        )
        error_rows.expect_row(
            rows, "all_reduce after finalize", "NotInitializedError", f"rank {rank} of 2"
        )


VALID_DTYPES = "bfloat16, bool, float16, float32, float64, int16, int32, int64, int8, uint8"
CONVERT = "HINT: convert the tensor to one of these (complex data: view it as real pairs)."
#: The exact messages of docs/errors.md for the rows the conformance checks cover, on rank 0 of
#: 2 fakelink thread-ranks (the checks assert their essentials on every backend).
EXACT = {
    "all_reduce(op='summ')": (
        "unknown reduce op 'summ'; valid ops: SUM, PRODUCT, MIN, MAX, AVG, BAND, BOR, BXOR, given "
        "as a distcomm.ReduceOp member, by name in any case ('sum', 'SUM'), by the aliases 'prod' "
        "(PRODUCT), 'mean' (AVG), 'average' (AVG), or as a torch.distributed.ReduceOp member of "
        "those names. HINT: did you mean 'sum'?"
    ),
    "numpy complex64": f"unsupported dtype dtype('complex64'); distcomm moves {VALID_DTYPES}. "
    + CONVERT,
    "numpy object": f"unsupported dtype dtype('O'); distcomm moves {VALID_DTYPES}. " + CONVERT,
    "torch complex64": f"unsupported dtype torch.complex64; distcomm moves {VALID_DTYPES}. "
    + CONVERT,
    "a list": (
        "tensor must be a torch.Tensor or numpy.ndarray, got list ([1, 2]). HINT: wrap Python "
        "numbers with torch.tensor(...) or numpy.asarray(...); all_reduce also takes a plain int "
        "or float and returns the result."
    ),
    "broadcast(src=2)": (
        "src=2 is not a rank of fakelink 'world' (2 ranks): valid ranks are 0..1. HINT: ranks "
        "are ranks of the communicator in use; map a world rank with "
        "comm.global_ranks.index(world_rank)."
    ),
    "send(dst=-1)": (
        "dst=-1 is not a rank of fakelink 'world' (2 ranks): valid ranks are 0..1. HINT: ranks "
        "are ranks of the communicator in use; map a world rank with "
        "comm.global_ranks.index(world_rank)."
    ),
    "scatter 1 of 2": (
        "scatter_list must be a list of 2 tensors (one per rank of fakelink 'world' (2 ranks)), "
        "got 1. HINT: [torch.empty_like(t) for _ in range(world_size)]."
    ),
    "scatter_object 1 of 2": (
        "scatter_object: the source rank must pass a list of 2 objects (one per rank), got 1. "
        "HINT: on src, pass one object per rank, e.g. [obj_for(r) for r in range(world_size)]; "
        "other ranks may pass None."
    ),
}


def rank_zero_mistakes() -> dict[str, str]:
    """Rank 0 makes each mistake of EXACT (each raises before anything is sent)."""
    import numpy as np
    import torch

    if distcomm.get_rank() != 0:
        return {}
    t = np.ones(1)
    calls = {
        "all_reduce(op='summ')": lambda: distcomm.all_reduce(t, op="summ"),
        "numpy complex64": lambda: distcomm.all_reduce(np.ones(2, dtype=np.complex64)),
        "numpy object": lambda: distcomm.all_reduce(np.array([1, "a"], dtype=object)),
        "torch complex64": lambda: distcomm.broadcast(torch.ones(2, dtype=torch.complex64)),
        "a list": lambda: distcomm.all_reduce([1, 2]),
        "broadcast(src=2)": lambda: distcomm.broadcast(t, src=2),
        "send(dst=-1)": lambda: distcomm.send(t, -1),
        "scatter 1 of 2": lambda: distcomm.scatter(t, [t], src=0),
        "scatter_object 1 of 2": lambda: distcomm.scatter_object([1], src=0),
    }
    return {name: error_rows.caught(call)[1] for name, call in calls.items()}


@pytest.mark.timeout(60)
def test_exact_messages_on_threads() -> None:
    pytest.importorskip("torch")
    assert run_threads(rank_zero_mistakes, 2, timeout=45)[0] == EXACT
