"""The reductions pipeline: all_reduce, reduce, reduce_scatter_tensor, and the uneven
reduce-scatter of ``reduce_scatter``'s list form (torchcomms' ``reduce_scatter_v``).

Beyond the common steps: op names are normalised to :class:`~distcomm.protocol.ReduceOp`, bool
data reduces as logical or / and, AVG is emulated (SUM, then a division) where the engine lacks
it, an op the engine lacks altogether is computed from an all-gather, and a Python number is
gathered as an object and reduced exactly (:func:`reduce_numbers`). The commonest call, a
blocking SUM like the calls before it (the same class, dtype and size: nothing new for the
mismatch check to record), and a blocking SUM ``reduce`` or ``reduce_scatter_tensor`` like
the calls before it, run the engine's plan for their kind
(:mod:`~distcomm.backend._pipeline.plans`).
"""

from __future__ import annotations

import functools
import math
import operator
from collections.abc import Callable
from typing import Any

from distcomm.backend._pipeline import object_transport as objects
from distcomm.backend._pipeline.defaults import offsets
from distcomm.backend._pipeline.observing import observed
from distcomm.backend._pipeline.staging import Staged
from distcomm.backend._pipeline.steps import DONE, Steps
from distcomm.backend.arrays import (
    Adapter,
    adapter_for,
    cached_adapter,
    check_op_dtype,
    normalise_bool_op,
)
from distcomm.errors import InvalidArgumentError
from distcomm.protocol import ReduceOp, Work

__all__ = ["Reductions", "reduce_numbers"]

_SUM = ReduceOp.SUM
# Tuples, not sets: `in` finds enum members by identity, without Enum's Python-level __hash__.
_TYPED_OPS = (ReduceOp.AVG, ReduceOp.BAND, ReduceOp.BOR, ReduceOp.BXOR)


class Reductions(Steps):
    """all_reduce, reduce, reduce_scatter_tensor (module docstring)."""

    def all_reduce(self, tensor: Any, op: Any = _SUM, async_op: bool = False) -> Any:
        """Reduce ``tensor`` across ranks, in place on every rank.

        A plain int or float is reduced and the result returned (exactly, through objects).
        """
        if op is _SUM and not async_op and self._planned("all_reduce", tensor):
            return None
        return self._all_reduce_steps(tensor, op, async_op)

    @observed
    def _all_reduce_steps(self, tensor: Any, op: Any = _SUM, async_op: bool = False) -> Any:
        """all_reduce past its plan (what hooks wrap: every call is numbered in _count)."""
        op = op if op.__class__ is ReduceOp else ReduceOp.coerce(op)
        adapter = cached_adapter(tensor)
        if adapter is None and isinstance(tensor, (int, float)):
            return self._all_reduce_number(tensor, op)
        adapter, dtype = self._begin(tensor, "tensor", adapter, written=True)
        if op in _TYPED_OPS:
            check_op_dtype(op, dtype)
        self._count("all_reduce", tensor, adapter, None, op)
        if self._solo:
            return DONE if async_op else None
        if (
            dtype in self._direct_dtypes
            and adapter.is_plain(tensor, self.devices, self.bound_device)
            and op in self._native_ops
        ):
            work = self._call(self._all_reduce, async_op, tensor, op)
            return self._complete(work, async_op, tensor)
        staged, engine_op, divide = self._stage_reduction(adapter, tensor, dtype, op)
        if engine_op in self._native_ops:
            work = self._call(self._all_reduce, async_op, staged.engine, engine_op)
        else:
            self._reduce_by_gathering(staged.engine, engine_op)
            work = None
        return self._finish(work, async_op, staged, divide)

    def reduce(
        self, tensor: Any, dst: int = 0, op: Any = _SUM, async_op: bool = False
    ) -> Work | None:
        """Reduce ``tensor`` across ranks into ``dst``'s ``tensor``; others' are unspecified."""
        if op is _SUM and not async_op and self._planned("reduce", tensor, dst):
            return None
        return self._reduce_steps(tensor, dst, op, async_op)

    @observed
    def _reduce_steps(self, tensor: Any, dst: int, op: Any, async_op: bool) -> Work | None:
        """reduce past its plan (every call is numbered; the hooks see it)."""
        op = op if op.__class__ is ReduceOp else ReduceOp.coerce(op)
        adapter, dtype = self._begin(tensor, "tensor")
        check_op_dtype(op, dtype)
        self._check_rank(dst, "dst")
        if self._rank == dst:
            self._check_written(adapter, tensor, "tensor")
        self._count("reduce", tensor, adapter, dst, op)
        if self._solo:
            return DONE if async_op else None
        staged, engine_op, divide = self._stage_reduction(adapter, tensor, dtype, op)
        if engine_op in self._native_ops:
            work = self._call(self._reduce, async_op, staged.engine, dst, engine_op)
        else:  # off dst on a copy: the tensor there is read, never written (it may be read-only)
            mine = staged.engine if self._rank == dst else adapter.clone(staged.engine)
            self._reduce_by_gathering(mine, engine_op)
            work = None
        if self._rank != dst:
            staged.copied, divide = False, None
        return self._finish(work, async_op, staged, divide)

    def reduce_scatter_tensor(
        self, output: Any, input: Any, op: Any = _SUM, async_op: bool = False
    ) -> Work | None:
        """Reduce ``input`` (world_size chunks) across ranks; rank r gets chunk r in ``output``."""
        if (
            op is _SUM
            and not async_op
            and self._planned("reduce_scatter_tensor", input, None, output)
        ):
            return None
        return self._reduce_scatter_tensor_steps(output, input, op, async_op)

    @observed
    def _reduce_scatter_tensor_steps(
        self, output: Any, input: Any, op: Any, async_op: bool
    ) -> Work | None:
        """reduce_scatter_tensor past its plan (every call is numbered; the hooks see it)."""
        op = op if op.__class__ is ReduceOp else ReduceOp.coerce(op)
        adapter, dtype = self._begin(input, "input")
        check_op_dtype(op, dtype)
        self._check_pair(output, "output", adapter, dtype, None, written=True)
        if adapter.numel(input) != adapter.numel(output) * self._world_size:
            raise self._size_error(
                "input",
                adapter.numel(input),
                "world_size x output's",
                adapter.numel(output) * self._world_size,
            )
        self._count("reduce_scatter_tensor", input, adapter, None, op)
        return self._scatter_reduced(output, input, adapter, dtype, op, None, async_op)

    def _uneven_reduce_scatter(
        self, output: Any, input: Any, sizes: list[int], op: Any, async_op: bool
    ) -> Work | None:
        """The uneven reduce-scatter of ``reduce_scatter``'s list form (torchcomms'
        ``reduce_scatter_v``): ``input`` holds one chunk per rank in rank order, rank r's
        ``sizes[r]`` elements, and rank r gets its chunk reduced in ``output``. The sizes are
        in the mismatch check's signature: ranks passing different ones are caught."""
        op = op if op.__class__ is ReduceOp else ReduceOp.coerce(op)
        adapter, dtype = self._begin(input, "input")
        check_op_dtype(op, dtype)
        self._count("reduce_scatter", input, adapter, None, op, layout=tuple(sizes))
        return self._scatter_reduced(output, input, adapter, dtype, op, sizes, async_op)

    def _scatter_reduced(
        self,
        output: Any,
        input: Any,
        adapter: Adapter,
        dtype: str,
        op: ReduceOp,
        sizes: list[int] | None,
        async_op: bool,
    ) -> Work | None:
        """A reduce-scatter past its checks and count: chunks of one size (``sizes`` None:
        ``_reduce_scatter``) or of ``sizes`` (``_reduce_scatter_v``), staged, with the
        emulations (AVG, an op the engine lacks)."""
        if self._solo:
            adapter.copy_(output, input)
            return DONE if async_op else None
        staged_in, engine_op, _ = self._stage_reduction(adapter, input, dtype, op, output)
        staged_out = self._stage(adapter, output, dtype, "output")
        divide = self._world_size if op is ReduceOp.AVG and not self._native_avg else None
        out, full = staged_out.engine, staged_in.engine
        if engine_op not in self._native_ops:
            scratch = adapter.clone(full)
            self._reduce_by_gathering(scratch, engine_op)
            numel, rank = adapter.numel(output), self._rank
            at = rank * numel if sizes is None else offsets(sizes)[rank]
            adapter.copy_(out, adapter.flat(scratch)[at : at + numel])
            work = None
        elif sizes is None:
            work = self._call(self._reduce_scatter, async_op, out, full, engine_op)
        else:
            work = self._call(self._reduce_scatter_v, async_op, out, sizes, full, engine_op)
        return self._finish(work, async_op, staged_out, divide, staged_in)

    # -- the emulations --------------------------------------------------------------------------
    def _stage_reduction(
        self, adapter: Adapter, x: Any, dtype: str, op: ReduceOp, apart_from: Any = None
    ) -> tuple[Staged, ReduceOp, int | None]:
        """Stage ``x`` (copied where it may share memory with the output ``apart_from``);
        return it with the op the engine runs and the divisor of an emulated AVG (None when
        the engine averages itself)."""
        staged = self._stage(adapter, x, dtype, apart_from=apart_from)
        if dtype == "bool":
            op = normalise_bool_op(op)
        divide = None
        if op is ReduceOp.AVG and not self._native_avg:
            op, divide = ReduceOp.SUM, self._world_size
        return staged, op, divide

    def _reduce_by_gathering(self, engine: Any, op: ReduceOp) -> None:
        """Reduce with an op the engine lacks: all-gather every rank's data, combine locally."""
        adapter = adapter_for(engine)
        numel = adapter.numel(engine)
        gathered = adapter.empty(engine, numel * self._world_size)
        self._call(self._all_gather_into, False, gathered, engine)
        flat = adapter.flat(gathered)
        result = adapter.clone(flat[0:numel])
        for r in range(1, self._world_size):
            adapter.combine_(result, flat[r * numel : (r + 1) * numel], op)
        adapter.copy_(engine, result)

    def _all_reduce_number(self, value: int | float, op: ReduceOp) -> int | float:
        """Reduce a Python number exactly: gathered as an object, combined locally."""
        self._check_usable()
        channel = self._objects("all_reduce")
        if channel is None:  # a world of 1: the same rules (bools, bitwise ops of floats)
            return reduce_numbers([value], op)
        return reduce_numbers(objects.all_gather_object(channel, value), op)


def reduce_numbers(values: list[Any], op: ReduceOp) -> int | float:
    """Reduce Python numbers exactly (ints stay ints; bools follow the logical rules)."""
    if all(isinstance(v, bool) for v in values):
        if op is ReduceOp.AVG:
            raise InvalidArgumentError("ReduceOp.AVG needs numbers, got bools. HINT: use SUM.")
        if op is ReduceOp.BXOR:
            return bool(functools.reduce(operator.xor, values))
        return any(values) if op in (ReduceOp.SUM, ReduceOp.MAX, ReduceOp.BOR) else all(values)
    if op in (ReduceOp.BAND, ReduceOp.BOR, ReduceOp.BXOR) and any(
        isinstance(v, float) for v in values
    ):
        raise InvalidArgumentError(
            f"ReduceOp.{op.name} needs ints or bools, got {values!r}. HINT: convert the values "
            "with int(), or use SUM, PRODUCT, MIN, MAX or AVG."
        )
    result: int | float = _NUMBER_OPS[op](values)
    return result


_NUMBER_OPS: dict[ReduceOp, Callable[[list[Any]], Any]] = {
    ReduceOp.SUM: sum,
    ReduceOp.AVG: lambda values: sum(values) / len(values),
    ReduceOp.PRODUCT: math.prod,
    ReduceOp.MIN: min,
    ReduceOp.MAX: max,
    ReduceOp.BAND: lambda values: functools.reduce(operator.and_, values),
    ReduceOp.BOR: lambda values: functools.reduce(operator.or_, values),
    ReduceOp.BXOR: lambda values: functools.reduce(operator.xor, values),
}
