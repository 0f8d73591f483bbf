"""Checks of the reductions: all_reduce, reduce and reduce_scatter_tensor.

Every op on every dtype where it is defined, every spelling of an op, Python numbers, and the
errors for ops that have no meaning on a dtype.
"""

from __future__ import annotations

import importlib

import distcomm
from distcomm.errors import InvalidArgumentError
from distcomm.protocol import ReduceOp
from distcomm.testing.conformance.registry import check
from distcomm.testing.conformance.support import (
    FLOATS,
    cases,
    expect,
    expect_values,
    has_torch,
    make,
    ops_for,
    raises,
    reduction_input,
    reduction_result,
)

SHAPE = (2, 3)
N = 6


@check
def all_reduce_every_op_and_dtype() -> None:
    """all_reduce with every ReduceOp on every dtype where it is defined, numpy and torch."""
    rank, world = distcomm.get_rank(), distcomm.get_world_size()
    for lib, dtype in cases():
        for op in ops_for(dtype):
            t = make(lib, dtype, reduction_input(op, dtype, rank, world, N), SHAPE)
            distcomm.all_reduce(t, op=op)
            expect_values(
                t, reduction_result(op, dtype, world, N), f"all_reduce {op.name} {lib} {dtype}"
            )


@check
def all_reduce_op_spellings() -> None:
    """Ops given as names in any case, the aliases 'prod' and 'mean', and torch's ReduceOp."""
    rank, world = distcomm.get_rank(), distcomm.get_world_size()
    spellings: list[tuple[object, ReduceOp]] = [
        ("sum", ReduceOp.SUM),
        ("SUM", ReduceOp.SUM),
        ("Max", ReduceOp.MAX),
        ("prod", ReduceOp.PRODUCT),
        ("product", ReduceOp.PRODUCT),
        ("mean", ReduceOp.AVG),
        ("avg", ReduceOp.AVG),
        ("min", ReduceOp.MIN),
        (ReduceOp.MAX, ReduceOp.MAX),
    ]
    torch_ops = (
        getattr(importlib.import_module("torch.distributed"), "ReduceOp", None)
        if has_torch()
        else None
    )
    if torch_ops is not None:  # absent where torch is built without distributed support
        spellings += [(getattr(torch_ops, op.name), op) for op in ReduceOp]
    for lib, dtype in cases(lambda d: d in ("float32", "int32")):
        for spelling, op in spellings:
            if op not in ops_for(dtype):
                continue
            t = make(lib, dtype, reduction_input(op, dtype, rank, world, N), SHAPE)
            distcomm.all_reduce(t, op=spelling)
            expect_values(
                t,
                reduction_result(op, dtype, world, N),
                f"all_reduce op={spelling!r} {lib} {dtype}",
            )


@check
def reduce_op_errors() -> None:
    """AVG on integers and bool, bitwise ops on floats and unknown ops raise, locally."""
    for lib, dtype in cases():
        t = make(lib, dtype, [1] * N, SHAPE)
        for op in ReduceOp:
            if op in ops_for(dtype):
                continue
            for fn in (distcomm.all_reduce, distcomm.reduce):
                exc = raises(InvalidArgumentError, fn, t, op=op)
                expect(
                    dtype in str(exc),
                    f"{fn.__name__} {op.name} on {dtype}: message does not name the dtype: {exc}",
                )
        for bad in ("avgg", "", 3, None):
            exc = raises(InvalidArgumentError, distcomm.all_reduce, t, op=bad)
            expect(
                all(m.name in str(exc) for m in ReduceOp),
                f"op={bad!r}: message does not list the valid ops: {exc}",
            )
    expect(
        isinstance(raises(ValueError, distcomm.all_reduce, 1, op="nope"), InvalidArgumentError),
        "an unknown op on a number must raise InvalidArgumentError",
    )


@check
def all_reduce_numbers() -> None:
    """all_reduce of a Python int or float returns the reduced number, exactly."""
    rank, world = distcomm.get_rank(), distcomm.get_world_size()
    big = 2**62
    cases_: list[tuple[object, object, object]] = [
        (2**55 + rank, "sum", world * 2**55 + world * (world - 1) // 2),
        (big + rank, "max", big + world - 1),
        (big + rank, ReduceOp.MIN, big),
        (2, "prod", 2**world),
        (rank + 0.5, "sum", world * world / 2),
        (float(2 * rank), "avg", float(world - 1)),
        (rank * 3 + 1, "bor", _or_all([r * 3 + 1 for r in range(world)])),
    ]
    for value, op, expected in cases_:
        got = distcomm.all_reduce(value, op=op)
        expect(
            got == expected and type(got) is type(expected),
            f"all_reduce({value!r}, op={op!r}) returned {got!r}, expected {expected!r}",
        )


def _or_all(values: list[int]) -> int:
    result = 0
    for v in values:
        result |= v
    return result


@check
def all_reduce_multidimensional() -> None:
    """Reductions see every element of 1-, 3- and 4-dimensional tensors."""
    rank, world = distcomm.get_rank(), distcomm.get_world_size()
    for lib, dtype in cases(lambda d: d in ("int64", "float32")):
        for shape in ((24,), (2, 3, 4), (1, 2, 3, 4)):
            t = make(lib, dtype, reduction_input(ReduceOp.SUM, dtype, rank, world, 24), shape)
            distcomm.all_reduce(t)
            expect(
                tuple(t.shape) == shape, f"all_reduce changed the shape {shape} to {tuple(t.shape)}"
            )
            expect_values(
                t,
                reduction_result(ReduceOp.SUM, dtype, world, 24),
                f"all_reduce {lib} {dtype} {shape}",
            )


@check
def reduce_every_dst() -> None:
    """reduce into every dst; only dst's tensor is specified."""
    rank, world = distcomm.get_rank(), distcomm.get_world_size()
    for lib, dtype in cases(lambda d: d in ("bool", "int64", "float32")):
        for dst in range(world):
            for op in (ReduceOp.SUM, ReduceOp.MAX):
                t = make(lib, dtype, reduction_input(op, dtype, rank, world, N), SHAPE)
                distcomm.reduce(t, dst=dst, op=op)
                if rank == dst:
                    expect_values(
                        t,
                        reduction_result(op, dtype, world, N),
                        f"reduce {op.name} dst={dst} {lib} {dtype}",
                    )


@check
def reduce_every_op_and_dtype() -> None:
    """reduce with every op on every dtype, into the last rank."""
    rank, world = distcomm.get_rank(), distcomm.get_world_size()
    dst = world - 1
    for lib, dtype in cases():
        for op in ops_for(dtype):
            t = make(lib, dtype, reduction_input(op, dtype, rank, world, N), SHAPE)
            distcomm.reduce(t, dst, op)
            if rank == dst:
                expect_values(
                    t, reduction_result(op, dtype, world, N), f"reduce {op.name} {lib} {dtype}"
                )


@check
def reduce_scatter_tensor() -> None:
    """reduce_scatter_tensor with SUM and MAX on every dtype, and AVG on floats."""
    rank, world = distcomm.get_rank(), distcomm.get_world_size()
    n = 3
    for lib, dtype in cases():
        ops = [ReduceOp.SUM, ReduceOp.MAX] + ([ReduceOp.AVG] if dtype in FLOATS else [])
        for op in ops:
            inp = make(lib, dtype, reduction_input(op, dtype, rank, world, n * world), (world, n))
            out = make(lib, dtype, [0] * n, (n,))
            distcomm.reduce_scatter_tensor(out, inp, op=op)
            expected = reduction_result(op, dtype, world, n * world)[rank * n : (rank + 1) * n]
            expect_values(out, expected, f"reduce_scatter_tensor {op.name} {lib} {dtype}")
            expect_values(
                inp,
                reduction_input(op, dtype, rank, world, n * world),
                f"reduce_scatter_tensor {op.name} {lib} {dtype} modified its input",
            )
