"""all_reduce_coalesced: many tensors in a few all-reduces, on fakelink thread-ranks and gloo."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch

import distcomm
from distcomm.errors import InvalidArgumentError
from distcomm.testing import WarmWorld, run_threads


def mixed(rank: int) -> list[Any]:
    """Tensors of several libraries, dtypes and shapes, a non-contiguous view, a 0-d one."""
    grid = torch.full((4, 6), float(rank + 1))
    return [
        torch.full((3,), rank + 1.0),
        np.full((2, 2), rank + 1, dtype=np.int64),
        grid[:, ::2],  # a non-contiguous view: the result lands in grid
        torch.tensor(rank + 1.0, dtype=torch.float64),
        np.full(5, rank + 1.0, dtype=np.float32),
        torch.ones(2, dtype=torch.int32) * (rank + 1),
    ]


def reduce_mixed(bucket_bytes: int, op: str = "sum") -> list[list[float]]:
    seen: list[str] = []
    comm = distcomm.get_communicator()
    with distcomm.add_hook(before=lambda e: seen.append(e.op) if e.group is comm else None):
        tensors = mixed(distcomm.get_rank())
        distcomm.all_reduce_coalesced(tensors, op=op, bucket_bytes=bucket_bytes)
    values = [np.asarray(t, dtype=np.float64).reshape(-1).tolist() for t in tensors]
    return [*values, [float(len(seen))]]


@pytest.mark.parametrize(("bucket_bytes", "calls"), [(1 << 20, 5), (8, 6)])
def test_every_tensor_is_reduced_in_one_call_per_bucket(bucket_bytes: int, calls: int) -> None:
    # 5 groups (torch float32 twice, numpy int64, torch float64, numpy float32, torch int32);
    # 8-byte buckets split the 12-byte float32 tensors from each other: 6 calls
    for values in run_threads(reduce_mixed, 3, bucket_bytes):
        assert values[:-1] == [
            [6.0] * 3,
            [6.0] * 4,
            [6.0] * 12,
            [6.0],
            [6.0] * 5,
            [6.0] * 2,
        ]
        assert values[-1] == [float(calls)]


def test_other_ops_and_the_grid_behind_a_view() -> None:
    def body() -> tuple[list[float], list[float]]:
        grid = torch.full((2, 4), float(distcomm.get_rank()))
        plain = torch.full((3,), float(distcomm.get_rank()))
        distcomm.all_reduce_coalesced([grid[:, 1::2], plain], op="max")
        return grid.reshape(-1).tolist(), plain.tolist()

    grid, plain = run_threads(body, 3)[0]
    assert grid == [0.0, 2.0, 0.0, 2.0] * 2 and plain == [2.0] * 3


def test_nothing_to_reduce_and_bad_input() -> None:
    def body() -> list[str]:
        distcomm.all_reduce_coalesced([])
        errors = []
        calls: list[tuple[Any, int]] = [(np.ones(2), 1), ([np.ones(2), 3], 1), ([np.ones(2)], 0)]
        for tensors, bucket_bytes in calls:
            try:
                distcomm.all_reduce_coalesced(tensors, bucket_bytes=bucket_bytes)
            except InvalidArgumentError as exc:
                errors.append(str(exc))
        return errors

    errors = run_threads(body, 2)[0]
    assert "tensors must be a list or tuple of tensors, got ndarray" in errors[0]
    assert "tensors[1] must be a torch.Tensor or numpy.ndarray, got int" in errors[1]
    assert "bucket_bytes=0 must be a positive int" in errors[2] and "HINT" in errors[2]


def many_small() -> bool:
    rank = distcomm.get_rank()
    tensors = [torch.full((256,), float(rank + i)) for i in range(300)]
    distcomm.all_reduce_coalesced(tensors, bucket_bytes=64 * 1024)
    return all(torch.equal(t, torch.full((256,), 2.0 * i + 1)) for i, t in enumerate(tensors))


@pytest.mark.timeout(120)
def test_on_gloo(warm_world: Callable[..., WarmWorld]) -> None:
    assert warm_world(2).run(many_small, timeout=100) == [True, True]


def repeated() -> bool:
    """One dtype per call (the fast grouping), shapes of several dimensions, an empty tensor,
    and the flattening buffer reused by calls of growing and shrinking size."""
    rank = distcomm.get_rank()
    for count, make in ((50, torch.full), (200, torch.full), (10, np.full), (300, np.full)):
        tensors = [make((2, 3, i % 3 + 1), float(rank + i)) for i in range(count)]
        distcomm.all_reduce_coalesced([*tensors, make((0,), 1.0)], bucket_bytes=4096)
        for i, t in enumerate(tensors):
            if not (np.asarray(t) == 2.0 * i + 1).all():
                return False
    return True


def test_repeated_calls_reuse_their_buffer() -> None:
    assert run_threads(repeated, 2) == [True, True]


@pytest.mark.parametrize("enabled", [True, False])
def test_the_garbage_collector_is_left_as_it_was(enabled: bool) -> None:
    """The collector is paused during the call (its views die by reference count), then left
    as the caller had it: on, or off."""
    import gc

    def body() -> tuple[bool, bool]:
        seen: list[bool] = []
        with distcomm.add_hook(before=lambda e: seen.append(gc.isenabled())):
            distcomm.all_reduce_coalesced([torch.ones(3), torch.ones(4)])
        return seen == [False], gc.isenabled()

    was = gc.isenabled()
    try:
        gc.enable() if enabled else gc.disable()
        assert run_threads(body, 1) == [(True, enabled)]
    finally:
        gc.enable() if was else gc.disable()


def test_views_of_one_buffer_are_reduced_where_they_are(monkeypatch: pytest.MonkeyPatch) -> None:
    """Consecutive contiguous views of one buffer (as flat.split gives, some reshaped), from an
    offset into it: one all-reduce of their memory, no flattening (patched to fail), and the
    buffer outside them untouched."""
    from distcomm.backend._pipeline import coalesced

    def no_copy(*args: Any) -> None:
        raise AssertionError("views of one buffer were flattened")

    monkeypatch.setattr(coalesced, "_flatten", no_copy)

    def body() -> tuple[list[float], list[int | None]]:
        rank = distcomm.get_rank()
        base = torch.full((20,), float(rank + 1))
        a, b, c = base[2:15].split([3, 4, 6])
        seen: list[int | None] = []
        comm = distcomm.get_communicator()
        with distcomm.add_hook(before=lambda e: seen.append(e.numel) if e.group is comm else None):
            distcomm.all_reduce_coalesced([a, b.view(2, 2), c.view(3, 2)])
        return base.tolist(), seen

    for rank, (values, seen) in enumerate(run_threads(body, 2)):
        mine = rank + 1.0
        assert values == [mine] * 2 + [3.0] * 13 + [mine] * 5, values
        assert seen == [13], f"expected one all-reduce of the 13 elements, saw {seen}"


def test_views_that_are_not_end_to_end_are_copied() -> None:
    """Views out of order, with a gap, strided, repeated, or of a tensor that requires grad take
    the copying path, with right results."""

    def body() -> list[list[float]]:
        rank = distcomm.get_rank()
        out = []
        for case in ("order", "gap", "strided", "twice", "grad"):
            base = torch.arange(12, dtype=torch.float32) + 100 * rank
            if case == "grad":
                base.requires_grad_(True)
            views = {
                "order": [base[6:12], base[0:6]],
                "gap": [base[0:5], base[6:12]],
                "strided": [base[0:2], base[2:10:2]],
                "twice": [base[0:6], base[0:6]],
                "grad": [base[0:6], base[6:12]],
            }[case]
            distcomm.all_reduce_coalesced(views)
            out.append(base.detach().tolist())
        return out

    reduced = [2.0 * i + 100 for i in range(12)]
    for rank, (order, gap, strided, twice, grad) in enumerate(run_threads(body, 2)):
        mine = [i + 100.0 * rank for i in range(12)]
        assert order == reduced and grad == reduced
        assert gap == [*reduced[:5], mine[5], *reduced[6:]], gap
        picked = (0, 1, 2, 4, 6, 8)
        assert strided == [reduced[i] if i in picked else mine[i] for i in range(12)], strided
        assert twice == [*reduced[:6], *mine[6:]], twice


def test_views_on_one_rank_and_separate_tensors_on_another() -> None:
    def body() -> list[float]:
        rank = distcomm.get_rank()
        if rank == 0:
            tensors = list(torch.ones(8).split(4))
        else:
            tensors = [torch.full((4,), 2.0), torch.full((4,), 2.0)]
        distcomm.all_reduce_coalesced(tensors)
        return torch.cat(tensors).tolist()

    assert run_threads(body, 2) == [[3.0] * 8, [3.0] * 8]


def test_shapes_that_change_between_calls_of_the_same_sizes() -> None:
    """The scratch's shaped views are kept while the shapes repeat: shapes (2, 3) then (3, 2)
    then (6,), of the same sizes, all right."""

    def body() -> bool:
        rank = distcomm.get_rank()
        for shape in ((2, 3), (3, 2), (6,), (2, 3)):
            tensors = [torch.arange(6.0).reshape(shape) + rank + i for i in range(4)]
            distcomm.all_reduce_coalesced(tensors)
            for i, t in enumerate(tensors):
                want = (2 * torch.arange(6.0) + 1 + 2 * i).reshape(shape)
                if not torch.equal(t, want):
                    return False
        return True

    assert run_threads(body, 2) == [True, True]
