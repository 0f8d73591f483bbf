"""Tests of distcomm._runtime.lists on fakelink thread-ranks: ``all_gather_v`` as one call of
the variable-size all-gather primitive, and ``reduce_scatter`` with entries of different sizes
(torchcomms' ``reduce_scatter_v``) through the reductions pipeline and the default
``_reduce_scatter_v`` (fakelink's engine has no ``all_gather_v`` nor ``reduce_scatter_v``: the
kit's defaults run)."""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
import pytest

import distcomm
from distcomm.backend import BaseCommunicator
from distcomm.errors import CollectiveMismatchError, InvalidArgumentError
from distcomm.testing import run_threads


@pytest.fixture
def gathers(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, list[int], str]]:
    """Every ``_all_gather_v`` call of fakelink (the kit's default: its engine has none): (rank,
    sizes, the arrays' dtype)."""
    calls: list[tuple[int, list[int], str]] = []
    lock = threading.Lock()
    plain = BaseCommunicator._all_gather_v

    def recorded(self: Any, output: Any, sizes: list[int], tensor: Any, async_op: bool) -> Any:
        with lock:
            calls.append((self.rank, list(sizes), str(tensor.dtype)))
        return plain(self, output, sizes, tensor, async_op)

    monkeypatch.setattr(BaseCommunicator, "_all_gather_v", recorded)
    return calls


@pytest.mark.parametrize("given", [False, True], ids=["found", "given"])
def test_all_gather_v_is_one_variable_size_all_gather_of_elements(
    gathers: list[tuple[int, list[int], str]], given: bool
) -> None:
    rows = [2, 0, 3]

    def body() -> tuple[int, list[Any]]:
        comm: Any = distcomm.get_communicator()
        rank = comm.rank
        mine = np.arange(rows[rank] * 3, dtype=np.float16).reshape(rows[rank], 3) + 10 * rank
        before = comm.seq
        got = distcomm.all_gather_v(mine, rows if given else None)
        return comm.seq - before, got

    results = run_threads(body, 3)
    for counted, got in results:
        assert counted == 1, "one collective (the exchange of shapes, if any, is part of it)"
        for r, part in enumerate(got):
            assert part.dtype == np.float16 and part.shape == (rows[r], 3)
            want = np.arange(rows[r] * 3, dtype=np.float16).reshape(rows[r], 3) + 10 * r
            np.testing.assert_array_equal(part, want)
    assert sorted(gathers) == [(r, [6, 0, 9], "float16") for r in range(3)], "element counts"


def test_all_gather_v_in_a_world_of_one_is_a_copy() -> None:
    mine = np.arange(6, dtype=np.int32).reshape(2, 3)
    (got,) = run_threads(lambda: distcomm.all_gather_v(mine, [2]), 1)
    assert len(got) == 1 and got[0].shape == (2, 3)
    np.testing.assert_array_equal(got[0], mine)
    assert not np.shares_memory(got[0], mine)


@pytest.mark.parametrize("async_op", [False, True], ids=["blocking", "async"])
@pytest.mark.parametrize(
    ("op", "dtype"),
    [("sum", "int64"), ("product", "int32"), ("min", "float32"), ("avg", "float64")],
)
def test_reduce_scatter_of_entries_of_different_sizes(op: str, dtype: str, async_op: bool) -> None:
    sizes = [2, 0, 3]
    combine = {"sum": sum, "product": np.prod, "min": min, "avg": lambda v: sum(v) / len(v)}

    def body() -> tuple[list[Any], list[list[Any]]]:
        rank = distcomm.get_rank()
        parts = [np.arange(n, dtype=dtype) + rank + 1 for n in sizes]
        out = np.full(sizes[rank], -1, dtype=dtype)
        work = distcomm.reduce_scatter(out, parts, op=op, async_op=async_op)
        if async_op:
            assert work is not None and work.wait() is True
        else:
            assert work is None
        return out.tolist(), [p.tolist() for p in parts]

    results = run_threads(body, 3)
    for rank, (out, parts) in enumerate(results):
        want = [combine[op]([i + q + 1 for q in range(3)]) for i in range(sizes[rank])]
        assert out == pytest.approx(want), f"rank {rank}"
        assert parts == [[i + rank + 1 for i in range(n)] for n in sizes], "inputs left alone"


def test_reduce_scatter_of_entries_of_different_sizes_on_torch() -> None:
    torch = pytest.importorskip("torch")
    sizes = [1, 4]

    def body() -> list[bool]:
        rank = distcomm.get_rank()
        parts = [torch.full((n,), rank == 1) for n in sizes]  # bool: any, as torch's MAX
        out = torch.zeros(sizes[rank], dtype=torch.bool)
        distcomm.reduce_scatter(out, parts, op="max")
        return [bool(v) for v in out.tolist()]

    assert run_threads(body, 2) == [[True], [True] * 4]


def test_reduce_scatter_refuses_an_output_unlike_this_ranks_entry() -> None:
    def body() -> str:
        rank = distcomm.get_rank()
        parts = [np.ones(n) for n in (1, 2)]
        with pytest.raises(InvalidArgumentError) as info:
            distcomm.reduce_scatter(np.zeros(3), parts)
        with pytest.raises(InvalidArgumentError, match=r"input_list\[1\] has dtype 'float32'"):
            distcomm.reduce_scatter(np.zeros(rank + 1), [np.ones(1), np.ones(2, np.float32)])
        return str(info.value)

    for rank, message in enumerate(run_threads(body, 2)):
        assert f"output has 3 elements but input_list[{rank}]" in message
        assert "[1, 2]" in message and "HINT" in message


def test_ranks_passing_different_sizes_to_reduce_scatter_raise_a_mismatch() -> None:
    def body() -> str:
        comm: Any = distcomm.get_communicator()
        comm.debug = "check"
        rank = comm.rank
        sizes = [1, 3] if rank == 0 else [0, 4]  # 4 elements in all, cut differently
        with pytest.raises(CollectiveMismatchError) as info:
            distcomm.reduce_scatter(np.zeros(sizes[rank]), [np.ones(n) for n in sizes])
        out = np.zeros(1)
        distcomm.all_reduce(out)  # still usable
        return str(info.value.op)

    assert run_threads(body, 2) == ["reduce_scatter"] * 2
