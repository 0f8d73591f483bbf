"""The list forms of torch.distributed, ``all_to_all(output_list, input_list)`` and
``reduce_scatter(output, input_list)``, and the uneven all-gather ``all_gather_v(tensor)``, over
the single-tensor operations and the engine's uneven primitives.

The list's tensors are copied into one contiguous buffer (and the received ones out of it when
the operation completes), so that each is one engine call: ``all_to_all`` is the uneven
all-to-all of ``all_to_all_single`` (its tensors may differ in size from rank to rank, as
torch's); ``reduce_scatter`` is ``reduce_scatter_tensor`` when its entries have one size, else
the uneven reduce-scatter (torchcomms' ``reduce_scatter_v``: rank r's output has entry r's
size) of the reductions pipeline. ``all_gather_v`` gathers tensors whose first dimension differs
from rank to rank (given, or found with one exchange of shapes) as one variable-size all-gather
(the ``_all_gather_v`` primitive: MPI's ``Allgatherv``; by default chunks padded to the
largest), and returns each rank's tensor unpadded (views of one buffer).
"""

from __future__ import annotations

from typing import Any

from distcomm.backend._pipeline import object_transport as objects
from distcomm.backend._pipeline import routing
from distcomm.backend._pipeline.defaults import offsets
from distcomm.backend._pipeline.observing import observed
from distcomm.backend._pipeline.steps import Steps
from distcomm.errors import InvalidArgumentError
from distcomm.protocol import ReduceOp, Work

__all__ = ["ListForms"]


class ListForms(Steps):
    """all_to_all, reduce_scatter (module docstring)."""

    def all_to_all(
        self, output_list: list[Any], input_list: list[Any], async_op: bool = False
    ) -> Work | None:
        """``input_list[r]`` goes to rank r; ``output_list[s]`` receives rank s's tensor for
        this rank. Sizes may differ between entries: what rank r sends s must fit s's entry."""
        for what, given in (("input_list", input_list), ("output_list", output_list)):
            if not isinstance(given, (list, tuple)) or len(given) != self._world_size:
                self._check_list(given, what, None, "", None)  # type: ignore[arg-type]
        first = input_list[0]
        adapter, dtype = self._begin(first, "input_list[0]")
        self._check_list(input_list, "input_list", adapter, dtype, None)
        self._check_list(output_list, "output_list", adapter, dtype, None, written=True)
        sent = [adapter.numel(t) for t in input_list]
        expected = [adapter.numel(t) for t in output_list]
        joined_in = adapter.empty(first, sum(sent))
        joined_out = adapter.empty(first, sum(expected))
        flat_in, flat_out = adapter.flat(joined_in), adapter.flat(joined_out)
        at = 0
        for t, n in zip(input_list, sent, strict=True):
            adapter.copy_(flat_in[at : at + n], t)
            at += n

        def copy_out() -> None:
            start = 0
            for t, n in zip(output_list, expected, strict=True):
                adapter.copy_(t, flat_out[start : start + n])
                start += n

        comm: Any = self  # a BaseCommunicator: the single-tensor operations are its
        work = comm.all_to_all_single(joined_out, joined_in, expected, sent, async_op=async_op)
        if work is None:
            copy_out()
            return None
        work.then(copy_out)
        return work  # type: ignore[no-any-return]

    @observed
    def reduce_scatter(
        self, output: Any, input_list: list[Any], op: Any = ReduceOp.SUM, async_op: bool = False
    ) -> Work | None:
        """Reduce ``input_list[r]`` across ranks into rank r's ``output``. The entries may
        differ in size (torchcomms' ``reduce_scatter_v``): every rank passes the same sizes,
        and ``output`` has this rank's entry's."""
        adapter, dtype = self._begin(output, "output", written=True)
        self._check_list(input_list, "input_list", adapter, dtype, None)
        sizes = [adapter.numel(t) for t in input_list]
        rank, numel = self._rank, adapter.numel(output)
        if sizes[rank] != numel:
            raise InvalidArgumentError(
                f"reduce_scatter: output has {numel} elements but input_list[{rank}] (this "
                f"rank's entry) has {sizes[rank]}; the entries' sizes are {sizes}. HINT: rank "
                "r's output has input_list[r]'s size, and every rank passes the same sizes."
            )
        joined = adapter.empty(output, sum(sizes))
        flat = adapter.flat(joined)
        for at, n, t in zip(offsets(sizes), sizes, input_list, strict=True):
            adapter.copy_(flat[at : at + n], t)
        comm: Any = self  # a BaseCommunicator: the reductions pipeline is its
        if min(sizes) == max(sizes):
            work: Work | None = comm.reduce_scatter_tensor(output, joined, op, async_op)
        else:
            work = comm._uneven_reduce_scatter(output, joined, sizes, op, async_op)
        return work

    @observed
    def all_gather_v(self, tensor: Any, sizes: list[int] | None = None) -> list[Any]:
        """Every rank's ``tensor``, whose first dimension may differ from rank to rank; a list
        in rank order, each unpadded. ``sizes``: the rows of every rank's tensor, when known
        (None: found with one exchange of shapes). One variable-size all-gather, whose
        element counts the mismatch check compares (ranks passing different ``sizes`` raise
        CollectiveMismatchError)."""
        adapter, dtype = self._begin(tensor, "tensor")
        shape = tuple(tensor.shape)
        rows, row = routing.rows_of(shape, "tensor")
        if sizes is None:  # one operation: the exchange of shapes is part of it
            self._count("all_gather_v", tensor, adapter, varies=True)
            rows_of = [rows] if self._solo else _rows_found(self, shape)
            counts = [n * row for n in rows_of]
        else:
            rows_of = _rows_given(self, shape, rows, sizes)
            counts = [n * row for n in rows_of]
            self._count("all_gather_v", tensor, adapter, layout=tuple(counts))
        if self._solo:
            return [adapter.clone(tensor)]
        staged = self._stage(adapter, tensor, dtype)
        out = adapter.empty(staged.engine, sum(counts))
        self._call(self._all_gather_v, False, out, counts, staged.engine)
        if staged.dtype != dtype or adapter.device(out) != adapter.device(tensor):
            staged_out, out = out, adapter.empty(tensor, sum(counts))
            adapter.copy_(out, staged_out)  # back to the caller's dtype and device
        flat = adapter.flat(out)
        return [
            flat[at : at + n * row].reshape((n, *shape[1:]))
            for at, n in zip(offsets(counts), rows_of, strict=True)
        ]


def _rows_found(comm: Steps, shape: tuple[int, ...]) -> list[int]:
    """The rows of every rank's tensor, found with one exchange of shapes (on the object
    channel: part of the all_gather_v counted already)."""
    shapes = objects.all_gather_object(comm._object_channel(), shape)
    if any(tuple(s[1:]) != shape[1:] for s in shapes):
        raise InvalidArgumentError(
            f"all_gather_v: the ranks' tensors differ beyond the first dimension: "
            f"{[tuple(s) for s in shapes]}. HINT: only the first dimension may differ."
        )
    return [int(s[0]) for s in shapes]


def _rows_given(comm: Steps, shape: tuple[int, ...], rows: int, sizes: list[int]) -> list[int]:
    """all_gather_v's ``sizes`` checked against this rank's tensor (of ``shape``, ``rows``
    rows)."""
    world, rank = comm._world_size, comm._rank
    if not (_ints(sizes) and len(sizes) == world and min(sizes) >= 0):
        raise InvalidArgumentError(
            f"all_gather_v: sizes={sizes!r} must be {world} non-negative ints, the rows "
            "of each rank's tensor. HINT: pass None to find them (one exchange)."
        )
    rows_of = [int(n) for n in sizes]
    if rows_of[rank] != rows:
        raise InvalidArgumentError(
            f"all_gather_v: sizes[{rank}]={rows_of[rank]} but this rank's tensor has "
            f"{rows} rows (shape {shape}). HINT: sizes lists every rank's rows."
        )
    return rows_of


def _ints(values: Any) -> bool:
    """A list or tuple of ints (not bools)."""
    return isinstance(values, (list, tuple)) and all(
        isinstance(v, int) and not isinstance(v, bool) for v in values
    )
