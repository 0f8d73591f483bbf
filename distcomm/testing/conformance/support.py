"""Helpers of the conformance checks: arrays of any library and dtype, inputs, expectations.

Inputs are small integers (or halves) chosen from the rank and the element index, so every result
is exact in every dtype and the expected values are computed here in plain Python. The checks
assert with :func:`expect` and :func:`expect_values` rather than ``assert`` so that they still check
under ``python -O``.
"""

from __future__ import annotations

import functools
import importlib.util
import math
import operator
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import distcomm
from distcomm.backend import aborts
from distcomm.backend.specs import DTYPE_NAMES, FLOAT_DTYPES
from distcomm.protocol import Communicator, ReduceOp

__all__ = [
    "FLOATS",
    "cases",
    "check_policy",
    "comm",
    "empty",
    "expect",
    "expect_values",
    "has_numpy",
    "has_torch",
    "libraries",
    "make",
    "ops_for",
    "pattern",
    "raises",
    "reduction_input",
    "reduction_result",
    "timeouts_raise",
    "values_of",
]

FLOATS = FLOAT_DTYPES
SIGNED = frozenset({"int8", "int16", "int32", "int64"}) | FLOATS
_BITWISE = (ReduceOp.BAND, ReduceOp.BOR, ReduceOp.BXOR)


def comm() -> Communicator:
    """The default communicator of this rank."""
    return distcomm.get_communicator()


def p2p_tag(tag: int) -> int:
    """``tag``, or 0 where the backend does not match messages by tag (``p2p_tags`` False:
    NCCL), where a check's messages then arrive in the order they were sent."""
    return tag if comm().capabilities.p2p_tags else 0


def timeouts_raise() -> bool:
    """Whether an operation past its timeout raises DistTimeoutError here: the backend has
    timeouts, and ``DISTCOMM_ON_TIMEOUT`` is not ``abort`` (which ends the job instead)."""
    return bool(comm().capabilities.timeouts) and aborts.on_timeout() == "raise"


def has_torch() -> bool:
    """Whether torch can be imported here."""
    return importlib.util.find_spec("torch") is not None


def has_numpy() -> bool:
    """Whether numpy can be imported here."""
    return importlib.util.find_spec("numpy") is not None


def libraries() -> list[str]:
    """The array libraries to check: numpy when the backend moves CPU memory, torch; if present."""
    libs = ["numpy"] if has_numpy() and "cpu" in _devices() else []
    if has_torch():
        libs.append("torch")
    return libs


def cases(dtypes: Callable[[str], bool] | None = None) -> Iterator[tuple[str, str]]:
    """Every (library, dtype) pair to check, optionally filtered on the dtype.

    bfloat16 exists in torch only.
    """
    for lib in libraries():
        for dtype in DTYPE_NAMES:
            if (lib == "torch" or dtype != "bfloat16") and (dtypes is None or dtypes(dtype)):
                yield lib, dtype


def ops_for(dtype: str) -> list[ReduceOp]:
    """The reduce ops defined on ``dtype``: AVG on floats only, bitwise ops on ints and bool."""
    if dtype in FLOATS:
        return [op for op in ReduceOp if op not in _BITWISE]
    return [op for op in ReduceOp if op is not ReduceOp.AVG]


def make(lib: str, dtype: str, values: Sequence[Any], shape: Sequence[int] | None = None) -> Any:
    """A new array of ``lib`` (``"numpy"`` or ``"torch"``) holding ``values``, of ``shape``."""
    shape = tuple(shape) if shape is not None else (len(values),)
    if lib == "torch":
        import torch

        return torch.tensor(
            list(values), dtype=getattr(torch, dtype), device=_torch_device()
        ).reshape(shape)
    import numpy

    return numpy.array(list(values), dtype=dtype).reshape(shape)


def empty(lib: str, dtype: str, shape: Sequence[int]) -> Any:
    """A zero-filled array to receive into."""
    return make(lib, dtype, [0] * math.prod(shape), shape)


def values_of(x: Any) -> list[Any]:
    """``x``'s elements as a flat list of Python values, in row-major order."""
    if type(x).__module__.startswith("torch"):
        return list(x.detach().cpu().reshape(-1).tolist())
    return list(x.reshape(-1).tolist())


def pattern(dtype: str, seed: int, n: int) -> list[Any]:
    """``n`` values of ``dtype`` that differ between seeds 0..99 (the rank, or rank and root)."""
    values: list[Any] = []
    for i in range(n):
        k = (seed * 7 + i * 3 + 1) % 100
        if dtype == "bool":
            values.append((seed + i) % 3 == 0)
        elif dtype in FLOATS:
            values.append(k - 50 + 0.5)
        else:
            values.append(k - 50 if dtype in SIGNED else k)
    return values


def reduction_input(op: ReduceOp, dtype: str, rank: int, world: int, n: int) -> list[Any]:
    """Rank ``rank``'s ``n`` inputs to reducing with ``op``: exact in ``dtype`` for any world.

    Results stay exact up to 24 ranks at least (bfloat16 partial sums of AVG set the limit).
    """
    signed = dtype in SIGNED
    values: list[Any] = []
    for i in range(n):
        k = rank + i
        if dtype == "bool":
            v: Any = k % 3 != 0
        elif op is ReduceOp.SUM:
            v = k % 3 - (1 if signed else 0)
        elif op is ReduceOp.PRODUCT:
            v = 2 if k % 4 == 0 and rank < 16 else (-1 if signed and k % 4 == 1 else 1)
        elif op in (ReduceOp.MIN, ReduceOp.MAX):
            v = (rank * 5 + i * 3) % 7 - (3 if signed else 0)
        elif op is ReduceOp.AVG:
            v = 2 * (i % 3) + 2 * rank - (world - 1)  # deviations cancel: the mean is 2 * (i % 3)
        elif op is ReduceOp.BAND:
            v = (127 ^ (1 << (k % 7))) - (128 if signed else 0)
        elif op is ReduceOp.BOR:
            v = 1 << (k % 7)
        else:
            v = (rank * 37 + i * 11) % 128 - (64 if signed else 0)
        values.append(v)
    return values


def reduction_result(op: ReduceOp, dtype: str, world: int, n: int) -> list[Any]:
    """The exact result of reducing every rank's :func:`reduction_input` with ``op``."""
    inputs = [reduction_input(op, dtype, r, world, n) for r in range(world)]
    return [_reduce_column(op, dtype, [row[i] for row in inputs]) for i in range(n)]


def _reduce_column(op: ReduceOp, dtype: str, column: list[Any]) -> Any:
    if dtype == "bool":
        if op in (ReduceOp.SUM, ReduceOp.MAX, ReduceOp.BOR):
            return any(column)
        if op in (ReduceOp.PRODUCT, ReduceOp.MIN, ReduceOp.BAND):
            return all(column)
        return sum(column) % 2 == 1
    if op is ReduceOp.SUM:
        return sum(column)
    if op is ReduceOp.AVG:
        return sum(column) / len(column)
    if op is ReduceOp.PRODUCT:
        return math.prod(column)
    if op is ReduceOp.MIN:
        return min(column)
    if op is ReduceOp.MAX:
        return max(column)
    bitwise = {
        ReduceOp.BAND: operator.and_,
        ReduceOp.BOR: operator.or_,
        ReduceOp.BXOR: operator.xor,
    }
    return functools.reduce(bitwise[op], column)


def expect(condition: bool, message: str) -> None:
    """Raise AssertionError(``message``) unless ``condition``."""
    if not condition:
        raise AssertionError(message)


def expect_values(x: Any, expected: Sequence[Any], what: str) -> None:
    """Raise AssertionError unless ``x``'s elements equal ``expected`` (flat, row-major)."""
    got = values_of(x)
    if got != list(expected):
        raise AssertionError(f"{what}: expected {list(expected)}, got {got}")


def raises(
    exc_type: type[BaseException], fn: Callable[..., Any], *args: Any, **kwargs: Any
) -> BaseException:
    """Call ``fn(*args, **kwargs)``; return the ``exc_type`` it raises, or raise AssertionError."""
    try:
        fn(*args, **kwargs)
    except exc_type as exc:
        return exc
    name = getattr(fn, "__name__", repr(fn))
    raise AssertionError(f"{name}{args!r} did not raise {exc_type.__name__}")


def _devices() -> frozenset[str]:
    return frozenset(getattr(comm(), "devices", frozenset({"cpu"})))


def _torch_device() -> str:
    if "cpu" in _devices():
        return "cpu"
    import torch

    return f"cuda:{torch.cuda.current_device()}"


@contextmanager
def check_policy(name: str, c: Any = None) -> Iterator[Any]:
    """Run the block with the mismatch check policy ``name`` on ``c`` (default: the default
    communicator), if it has one, and restore the policy after; yields the communicator."""
    c = comm() if c is None else c
    before = getattr(c, "debug", None)
    if before is not None:
        c.debug = name
    try:
        yield c
    finally:
        if before is not None:
            c.debug = before
