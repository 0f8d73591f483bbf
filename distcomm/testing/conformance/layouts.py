"""Checks of non-contiguous tensors (transposes, strided and offset views) and of ``async_op``.

A non-contiguous input must give the same result as a contiguous one, and an in-place result must
land in the caller's view (and nowhere else in the underlying array).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import distcomm
from distcomm.protocol import ReduceOp, Work
from distcomm.testing.conformance.registry import check
from distcomm.testing.conformance.support import (
    cases,
    check_policy,
    empty,
    expect,
    expect_values,
    make,
    p2p_tag,
    pattern,
    reduction_input,
    reduction_result,
    values_of,
)

#: (label, shape of the underlying array, the view); each view works in numpy and torch alike.
VIEWS: list[tuple[str, tuple[int, ...], Callable[[Any], Any]]] = [
    (".T", (4, 3), lambda x: x.T),
    ("[::2]", (12,), lambda x: x[::2]),
    ("[:, 1:]", (3, 4), lambda x: x[:, 1:]),
]
N = 12


def _layout_cases() -> list[tuple[str, str]]:
    return list(cases(lambda d: d in ("bool", "int32", "float32", "bfloat16")))


def _touched(lib: str, shape: tuple[int, ...], view: Callable[[Any], Any]) -> list[int]:
    """The flat indices of the underlying array that ``view`` shows, in the view's order."""
    return [int(i) for i in values_of(view(make(lib, "int64", range(N), shape)))]


@check
def noncontiguous_all_reduce() -> None:
    """all_reduce of non-contiguous views, blocking and async, writes the view only."""
    rank, world = distcomm.get_rank(), distcomm.get_world_size()
    op = ReduceOp.SUM
    for lib, dtype in _layout_cases():
        mine, result = (
            reduction_input(op, dtype, rank, world, N),
            reduction_result(op, dtype, world, N),
        )
        for label, shape, view in VIEWS:
            touched = set(_touched(lib, shape, view))
            expected = [result[j] if j in touched else mine[j] for j in range(N)]
            for async_op in (False, True):
                base = make(lib, dtype, mine, shape)
                work = distcomm.all_reduce(view(base), op=op, async_op=async_op)
                if async_op:
                    expect(
                        isinstance(work, Work) and work.wait() is True,
                        f"async all_reduce returned {work!r}",
                    )
                expect_values(
                    base, expected, f"all_reduce of {lib} {dtype} x{label} async_op={async_op}"
                )


@check
def noncontiguous_broadcast_and_reduce() -> None:
    """broadcast into, and reduce from, non-contiguous views."""
    rank, world = distcomm.get_rank(), distcomm.get_world_size()
    root = world - 1
    for lib, dtype in _layout_cases():
        mine, theirs = pattern(dtype, rank, N), pattern(dtype, root, N)
        for label, shape, view in VIEWS:
            order = _touched(lib, shape, view)
            touched = set(order)
            base = make(lib, dtype, mine, shape)
            distcomm.broadcast(view(base), src=root)
            expected = [theirs[j] if j in touched else mine[j] for j in range(N)]
            expect_values(base, expected, f"broadcast into {lib} {dtype} x{label}")

            inputs = reduction_input(ReduceOp.MAX, dtype, rank, world, N)
            base = make(lib, dtype, inputs, shape)
            distcomm.reduce(view(base), dst=root, op=ReduceOp.MAX)
            if rank == root:
                result = reduction_result(ReduceOp.MAX, dtype, world, N)
                expected = [result[j] if j in touched else inputs[j] for j in range(N)]
                expect_values(base, expected, f"reduce into {lib} {dtype} x{label}")


@check
def noncontiguous_gather_inputs() -> None:
    """all_gather, all_gather_into_tensor, reduce_scatter_tensor read non-contiguous inputs."""
    rank, world = distcomm.get_rank(), distcomm.get_world_size()
    for lib, dtype in _layout_cases():
        for label, shape, view in VIEWS:
            order = _touched(lib, shape, view)
            n = len(order)
            per_rank = [[pattern(dtype, r, N)[j] for j in order] for r in range(world)]
            src = view(make(lib, dtype, pattern(dtype, rank, N), shape))
            out = empty(lib, dtype, (world * n,))
            distcomm.all_gather_into_tensor(out, src)
            expect_values(
                out,
                [v for part in per_rank for v in part],
                f"all_gather_into_tensor of {lib} {dtype} x{label}",
            )
            parts = [empty(lib, dtype, tuple(src.shape)) for _ in range(world)]
            distcomm.all_gather(parts, src)
            for r, part in enumerate(parts):
                expect_values(part, per_rank[r], f"all_gather of {lib} {dtype} x{label} entry {r}")

        # reduce_scatter_tensor: world chunks of a transposed (n, world) input.
        n = 2
        op = ReduceOp.MAX
        flat = reduction_input(op, dtype, rank, world, n * world)
        inp = make(
            lib, dtype, [flat[c * n + i] for i in range(n) for c in range(world)], (n, world)
        ).T
        out = empty(lib, dtype, (n,))
        distcomm.reduce_scatter_tensor(out, inp, op=op)
        expected = reduction_result(op, dtype, world, n * world)[rank * n : (rank + 1) * n]
        expect_values(out, expected, f"reduce_scatter_tensor of a transposed {lib} {dtype}")


def _wait(work: Any, what: str) -> None:
    expect(isinstance(work, Work), f"{what}(async_op=True) returned {work!r}, not a Work")
    expect(work.wait() is True, f"{what}: Work.wait() must return True")
    expect(work.is_completed() is True, f"{what}: Work.is_completed() is not True after wait()")


@check
def async_collectives() -> None:
    """Every collective with async_op=True returns a Work; results are in place after wait()."""
    rank, world = distcomm.get_rank(), distcomm.get_world_size()
    n = 4
    for lib, dtype in cases(lambda d: d in ("bool", "int64", "float32", "bfloat16")):
        _async_in_place(lib, dtype, rank, world, n)
        mine = make(lib, dtype, pattern(dtype, rank, n))
        _async_all_gathers_and_reduce_scatter(lib, dtype, mine, rank, world, n)
        _async_rooted_and_all_to_all(lib, dtype, mine, rank, world, n)


def _async_in_place(lib: str, dtype: str, rank: int, world: int, n: int) -> None:
    """async all_reduce, broadcast and reduce of one tensor, each result checked after wait()."""
    what = f"{lib} {dtype}"
    t = make(lib, dtype, reduction_input(ReduceOp.SUM, dtype, rank, world, n))
    _wait(distcomm.all_reduce(t, async_op=True), f"all_reduce {what}")
    expect_values(t, reduction_result(ReduceOp.SUM, dtype, world, n), f"async all_reduce {what}")

    t = make(lib, dtype, pattern(dtype, rank, n))
    _wait(distcomm.broadcast(t, src=world - 1, async_op=True), f"broadcast {what}")
    expect_values(t, pattern(dtype, world - 1, n), f"async broadcast {what}")

    t = make(lib, dtype, reduction_input(ReduceOp.MIN, dtype, rank, world, n))
    _wait(distcomm.reduce(t, dst=0, op=ReduceOp.MIN, async_op=True), f"reduce {what}")
    if rank == 0:
        expect_values(t, reduction_result(ReduceOp.MIN, dtype, world, n), f"async reduce {what}")


def _async_all_gathers_and_reduce_scatter(
    lib: str, dtype: str, mine: Any, rank: int, world: int, n: int
) -> None:
    """async all_gather (of ``mine``), all_gather_into_tensor and reduce_scatter_tensor, each
    result checked after wait()."""
    what = f"{lib} {dtype}"
    everyone = [v for r in range(world) for v in pattern(dtype, r, n)]
    parts = [empty(lib, dtype, (n,)) for _ in range(world)]
    _wait(distcomm.all_gather(parts, mine, async_op=True), f"all_gather {what}")
    expect_values(
        make(lib, dtype, [v for p in parts for v in values_of(p)]),
        everyone,
        f"async all_gather {what}",
    )

    out = empty(lib, dtype, (world * n,))
    _wait(
        distcomm.all_gather_into_tensor(out, mine, async_op=True),
        f"all_gather_into_tensor {what}",
    )
    expect_values(out, everyone, f"async all_gather_into_tensor {what}")

    inp = make(lib, dtype, reduction_input(ReduceOp.SUM, dtype, rank, world, n * world))
    out = empty(lib, dtype, (n,))
    _wait(distcomm.reduce_scatter_tensor(out, inp, async_op=True), f"reduce_scatter_tensor {what}")
    expected = reduction_result(ReduceOp.SUM, dtype, world, n * world)[rank * n : (rank + 1) * n]
    expect_values(out, expected, f"async reduce_scatter_tensor {what}")


def _async_rooted_and_all_to_all(
    lib: str, dtype: str, mine: Any, rank: int, world: int, n: int
) -> None:
    """async gather (of ``mine``), scatter and all_to_all_single, each result checked after
    wait()."""
    what = f"{lib} {dtype}"
    gathered = [empty(lib, dtype, (n,)) for _ in range(world)] if rank == 0 else None
    _wait(distcomm.gather(mine, gathered, dst=0, async_op=True), f"gather {what}")
    if gathered is not None:
        expect(
            [values_of(p) for p in gathered] == [pattern(dtype, r, n) for r in range(world)],
            f"async gather {what}: got {[values_of(p) for p in gathered]}",
        )

    pieces = (
        [make(lib, dtype, pattern(dtype, 50 + r, n)) for r in range(world)] if rank == 0 else None
    )
    t = empty(lib, dtype, (n,))
    _wait(distcomm.scatter(t, pieces, src=0, async_op=True), f"scatter {what}")
    expect_values(t, pattern(dtype, 50 + rank, n), f"async scatter {what}")

    inp = make(lib, dtype, [v for r in range(world) for v in pattern(dtype, rank * world + r, 1)])
    out = empty(lib, dtype, (world,))
    _wait(distcomm.all_to_all_single(out, inp, async_op=True), f"all_to_all_single {what}")
    expect_values(
        out,
        [pattern(dtype, s * world + rank, 1)[0] for s in range(world)],
        f"async all_to_all_single {what}",
    )


@check
def outputs_over_their_inputs() -> None:
    """all_to_all_single whose output is its input (even, and uneven with the same split
    sizes), and reduce_scatter_tensor whose output is this rank's chunk of its input (NCCL's
    in-place form), blocking and async: the right result. The first round runs under the
    communicator's check policy; the next ones with the check off, after a call of the same
    kind on arrays of their own, so that an engine's plan for the kind is reached (it must
    leave such a call to the pipeline, which hands the engine a copy of the input)."""
    rank, world = distcomm.get_rank(), distcomm.get_world_size()
    for lib, dtype in cases(lambda d: d == "float32"):  # (aliasing is no matter of dtype)
        for step in range(3):
            if step == 0:
                _over_inputs(lib, dtype, rank, world, step)
                continue
            with check_policy("off"):
                _over_inputs(lib, dtype, rank, world, step)


def _over_inputs(lib: str, dtype: str, rank: int, world: int, step: int) -> None:
    """One round of :func:`outputs_over_their_inputs`."""
    what = f"{lib} {dtype} (round {step})"
    n = 2  # elements a chunk (even), a row (uneven)

    def chunks(pairs: list[tuple[int, int]]) -> list[Any]:
        return [v for seed, rows in pairs for v in pattern(dtype, seed, n * rows)]

    even = chunks([(rank * world + r, 1) for r in range(world)])
    want = chunks([(s * world + rank, 1) for s in range(world)])
    distcomm.all_to_all_single(empty(lib, dtype, (world * n,)), make(lib, dtype, even))
    for async_op in (False, True):
        x = make(lib, dtype, even)
        work = distcomm.all_to_all_single(x, x, async_op=async_op)
        if work is not None:
            _wait(work, f"all_to_all_single {what}")
        expect_values(x, want, f"all_to_all_single(x, x, async_op={async_op}) {what}")

    splits = [1 + (rank + s) % 2 for s in range(world)]  # what rank s expects of this one too
    sent = chunks([(rank * world + s, splits[s]) for s in range(world)])
    want = chunks([(s * world + rank, splits[s]) for s in range(world)])
    rows = (sum(splits), n)
    out = empty(lib, dtype, rows)
    distcomm.all_to_all_single(out, make(lib, dtype, sent, rows), splits, splits)
    x = make(lib, dtype, sent, rows)
    distcomm.all_to_all_single(x, x, splits, splits)
    expect_values(x, want, f"uneven all_to_all_single(x, x) {what}")

    full = reduction_input(ReduceOp.SUM, dtype, rank, world, n * world)
    want = reduction_result(ReduceOp.SUM, dtype, world, n * world)[rank * n : (rank + 1) * n]
    distcomm.reduce_scatter_tensor(empty(lib, dtype, (n,)), make(lib, dtype, full))
    for async_op in (False, True):
        inp = make(lib, dtype, full)
        mine = inp[rank * n : (rank + 1) * n]
        work = distcomm.reduce_scatter_tensor(mine, inp, async_op=async_op)
        if work is not None:
            _wait(work, f"reduce_scatter_tensor {what}")
        expect_values(mine, want, f"in-place reduce_scatter_tensor(async_op={async_op}) {what}")


@check
def async_outstanding_works() -> None:
    """Several async collectives may be outstanding; waiting in reverse order gives every result."""
    rank, world = distcomm.get_rank(), distcomm.get_world_size()
    for lib, dtype in cases(lambda d: d == "float32"):
        ops = (ReduceOp.SUM, ReduceOp.MAX, ReduceOp.MIN)
        tensors = [make(lib, dtype, reduction_input(op, dtype, rank, world, 5)) for op in ops]
        works = [
            distcomm.all_reduce(t, op=op, async_op=True) for t, op in zip(tensors, ops, strict=True)
        ]
        for work in reversed(works):
            expect(work.wait(timeout=600.0) is True, "Work.wait(timeout=600) must return True")
        for t, op in zip(tensors, ops, strict=True):
            expect_values(
                t,
                reduction_result(op, dtype, world, 5),
                f"outstanding async all_reduce {op.name} {lib}",
            )
        expect(all(w.is_completed() for w in works), "a waited Work is not completed")


@check
def zero_dim_and_empty_tensors() -> None:
    """0-d tensors and tensors without elements pass through every collective."""
    rank, world = distcomm.get_rank(), distcomm.get_world_size()
    for lib, dtype in cases(lambda d: d in ("int64", "float32")):
        scalar = make(lib, dtype, [rank + 1], ())
        distcomm.all_reduce(scalar)
        expect(tuple(scalar.shape) == (), f"all_reduce changed a 0-d {lib} tensor's shape")
        expect_values(scalar, [world * (world + 1) // 2], f"all_reduce of a 0-d {lib} {dtype}")
        scalar = make(lib, dtype, [rank], ())
        distcomm.broadcast(scalar, src=world - 1)
        expect_values(scalar, [world - 1], f"broadcast of a 0-d {lib} {dtype}")
        out = empty(lib, dtype, (world,))
        distcomm.all_gather_into_tensor(out, make(lib, dtype, [rank], ()))
        expect_values(out, list(range(world)), f"all_gather_into_tensor of 0-d {lib} {dtype}")

        what = f"{lib} {dtype} without elements"
        none = functools.partial(empty, lib, dtype, (0,))
        t = none()
        distcomm.all_reduce(t)
        distcomm.broadcast(t, src=world - 1)
        distcomm.reduce(t, dst=0)
        parts = [none() for _ in range(world)]
        distcomm.all_gather(parts, t)
        distcomm.all_gather_into_tensor(none(), t)
        distcomm.reduce_scatter_tensor(none(), t)
        distcomm.all_to_all_single(none(), t)
        distcomm.gather(t, [none() for _ in range(world)] if rank == 0 else None, dst=0)
        distcomm.scatter(t, [none() for _ in range(world)] if rank == 0 else None, src=0)
        if world > 1 and distcomm.get_communicator().capabilities.p2p:
            send = distcomm.isend(t, (rank + 1) % world, tag=p2p_tag(51))
            got = distcomm.recv(none(), (rank - 1) % world, tag=p2p_tag(51))
            send.wait()
            expect(got == (rank - 1) % world, f"{what}: recv returned {got}")
        expect(all(values_of(x) == [] for x in [t, *parts]), f"{what}: elements appeared")


@check
def tensors_requiring_grad() -> None:
    """torch tensors that require grad (parameters) are updated in place, keeping requires_grad."""
    rank, world = distcomm.get_rank(), distcomm.get_world_size()
    for lib, dtype in cases(lambda d: d in ("float32", "bfloat16")):
        if lib != "torch":
            continue
        import torch

        param = torch.nn.Parameter(make(lib, dtype, pattern(dtype, rank, 6), (2, 3)))
        distcomm.broadcast(param, src=world - 1)
        expect_values(param, pattern(dtype, world - 1, 6), f"broadcast of a {dtype} parameter")
        inputs = reduction_input(ReduceOp.SUM, dtype, rank, world, 6)
        param = torch.nn.Parameter(make(lib, dtype, inputs, (3, 2)))
        distcomm.all_reduce(param.T)
        expect_values(
            param,
            reduction_result(ReduceOp.SUM, dtype, world, 6),
            f"all_reduce of a transposed {dtype} parameter",
        )
        expect(
            param.requires_grad and param.grad is None and param.grad_fn is None,
            "all_reduce changed the parameter's autograd state",
        )
