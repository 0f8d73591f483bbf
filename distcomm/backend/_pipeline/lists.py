"""The list forms of torch.distributed, ``all_to_all(output_list, input_list)`` and
``reduce_scatter(output, input_list)``, and the uneven all-gather ``all_gather_v(tensor)``, over
the single-tensor operations.

The list's tensors are copied into one contiguous buffer (and the received ones out of it when
the operation completes), so that each is one engine call: ``all_to_all`` is the uneven
all-to-all of ``all_to_all_single`` (its tensors may differ in size from rank to rank, as
torch's), ``reduce_scatter`` is ``reduce_scatter_tensor``. ``all_gather_v`` gathers tensors
whose first dimension differs from rank to rank (given, or found with one exchange of shapes) as
one ``all_gather_into_tensor`` of chunks padded to the largest, and returns each rank's tensor
unpadded (views of one buffer).
"""

from __future__ import annotations

from typing import Any

from distcomm.backend._pipeline import splits
from distcomm.backend._pipeline.steps import Steps
from distcomm.backend.arrays import adapter_for
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
            if not isinstance(given, (list, tuple)) or len(given) != self._kit_world_size:
                self._kit_check_list(given, what, None, "", None)  # type: ignore[arg-type]
        first = input_list[0]
        adapter, dtype = self._kit_begin(first, "input_list[0]")
        self._kit_check_list(input_list, "input_list", adapter, dtype, None)
        self._kit_check_list(output_list, "output_list", adapter, dtype, None)
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

    def reduce_scatter(
        self, output: Any, input_list: list[Any], op: Any = ReduceOp.SUM, async_op: bool = False
    ) -> Work | None:
        """Reduce ``input_list[r]`` across ranks into rank r's ``output``."""
        adapter, dtype = self._kit_begin(output, "output")
        numel = adapter.numel(output)
        self._kit_check_list(input_list, "input_list", adapter, dtype, numel)
        joined = adapter.empty(output, numel * self._kit_world_size)
        flat = adapter.flat(joined)
        for r, t in enumerate(input_list):
            adapter_for(t).copy_(flat[r * numel : (r + 1) * numel], t)
        comm: Any = self
        return comm.reduce_scatter_tensor(output, joined, op, async_op)  # type: ignore[no-any-return]

    def all_gather_v(self, tensor: Any, sizes: list[int] | None = None) -> list[Any]:
        """Every rank's ``tensor``, whose first dimension may differ from rank to rank; a list
        in rank order, each unpadded. ``sizes``: the rows of every rank's tensor, when known
        (None: found with one exchange of shapes)."""
        adapter, _ = self._kit_begin(tensor, "tensor")
        shape = tuple(tensor.shape)
        rows, row = splits.rows_of(shape, "tensor")
        comm: Any = self
        world, rank = self._kit_world_size, self._kit_rank
        if sizes is None:
            shapes = comm.all_gather_object(shape)
            if any(tuple(s[1:]) != shape[1:] for s in shapes):
                raise InvalidArgumentError(
                    f"all_gather_v: the ranks' tensors differ beyond the first dimension: "
                    f"{[tuple(s) for s in shapes]}. HINT: only the first dimension may differ."
                )
            rows_of = [int(s[0]) for s in shapes]
        else:
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
        width = max(rows_of) * row
        mine = adapter.empty(tensor, width)
        adapter.copy_(adapter.flat(mine)[: rows * row], tensor)
        every = adapter.empty(tensor, width * world)
        comm.all_gather_into_tensor(every, mine)
        flat = adapter.flat(every)
        return [
            flat[r * width : r * width + n * row].reshape((n, *shape[1:]))
            for r, n in enumerate(rows_of)
        ]


def _ints(values: Any) -> bool:
    """A list or tuple of ints (not bools)."""
    return isinstance(values, (list, tuple)) and all(
        isinstance(v, int) and not isinstance(v, bool) for v in values
    )
