"""The data-movement pipeline: broadcast, all_gather, all_gather_into_tensor, all_to_all_single
and barrier: every rank ends with data (or, for the barrier, the knowledge) of the others."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from distcomm.backend._pipeline import observing, p2p_vote, recording, routing, routing_ledger
from distcomm.backend._pipeline.observing import observed
from distcomm.backend._pipeline.plans import NO_ARRAY
from distcomm.backend._pipeline.recording import COMPLETED, ISSUED
from distcomm.backend._pipeline.steps import DONE, Steps
from distcomm.backend.arrays import cached_adapter
from distcomm.backend.engine import NotPlanned
from distcomm.errors import InvalidArgumentError
from distcomm.protocol import Work

__all__ = ["Movement"]


class Movement(Steps):
    """broadcast, the all-gathers, all_to_all_single, barrier (module docstring)."""

    def broadcast(self, tensor: Any, src: int = 0, async_op: bool = False) -> Work | None:
        """Copy ``src``'s ``tensor`` into ``tensor`` on every rank."""
        if not async_op and self._planned("broadcast", tensor, src):
            return None
        return self._broadcast_steps(tensor, src, async_op)

    @observed
    def _broadcast_steps(self, tensor: Any, src: int, async_op: bool) -> Work | None:
        """broadcast past its plan (every call is numbered; the hooks see it)."""
        adapter, dtype = self._begin(tensor, "tensor")
        self._check_rank(src, "src")
        if self._rank != src:
            self._check_written(adapter, tensor, "tensor")
        self._count("broadcast", tensor, adapter, src)
        if self._solo:
            return DONE if async_op else None
        plain = adapter.is_plain(tensor, self.devices, self.bound_device)
        if dtype in self._native_dtypes and plain:
            work = self._call(self._broadcast, async_op, tensor, src)
            return self._complete(work, async_op, tensor)
        staged = self._stage(adapter, tensor, dtype)
        if self._rank == src:
            staged.copied = False  # the source is read, never written (it may be read-only)
        work = self._call(self._broadcast, async_op, staged.engine, src)
        return self._finish(work, async_op, staged)

    @observed
    def all_gather(
        self, tensor_list: list[Any], tensor: Any, async_op: bool = False
    ) -> Work | None:
        """Gather every rank's ``tensor`` into ``tensor_list`` (one per rank) on every rank."""
        adapter, dtype = self._begin(tensor, "tensor")
        numel = adapter.numel(tensor)
        self._check_list(tensor_list, "tensor_list", adapter, dtype, numel, written=True)
        self._count("all_gather", tensor, adapter)
        if self._solo:
            adapter.copy_(tensor_list[0], tensor)
            return DONE if async_op else None
        staged = self._stage(adapter, tensor, dtype)
        out = adapter.empty(staged.engine, adapter.numel(tensor) * self._world_size)
        work = self._call(self._all_gather_into, async_op, out, staged.engine)
        return self._finish_split(work, async_op, staged, out, tensor_list)

    def all_gather_into_tensor(
        self, output_tensor: Any, input_tensor: Any, async_op: bool = False
    ) -> Work | None:
        """Gather every rank's ``input_tensor`` into ``output_tensor`` (world_size times larger)."""
        if not async_op and self._planned(
            "all_gather_into_tensor", input_tensor, None, output_tensor
        ):
            return None
        return self._all_gather_into_tensor_steps(output_tensor, input_tensor, async_op)

    @observed
    def _all_gather_into_tensor_steps(
        self, output_tensor: Any, input_tensor: Any, async_op: bool
    ) -> Work | None:
        """all_gather_into_tensor past its plan (every call is numbered; the hooks see it)."""
        adapter, dtype = self._begin(input_tensor, "input_tensor")
        expected = adapter.numel(input_tensor) * self._world_size
        self._check_pair(output_tensor, "output_tensor", adapter, dtype, expected, written=True)
        self._count("all_gather_into_tensor", input_tensor, adapter)
        if self._solo:
            adapter.copy_(output_tensor, input_tensor)
            return DONE if async_op else None
        staged_in = self._stage(adapter, input_tensor, dtype, "input_tensor")
        staged_out = self._stage(adapter, output_tensor, dtype, "output_tensor")
        work = self._call(self._all_gather_into, async_op, staged_out.engine, staged_in.engine)
        return self._finish(work, async_op, staged_out, None, staged_in)

    def all_to_all_single(
        self,
        output: Any,
        input: Any,
        output_split_sizes: Sequence[int] | None = None,
        input_split_sizes: Sequence[int] | None = None,
        async_op: bool = False,
    ) -> Work | None:
        """Split ``input`` into world_size chunks; chunk r goes to rank r's ``output`` slot.

        With split sizes (rows of the first dimension, as torch's), the chunks may differ:
        ``input_split_sizes[r]`` rows go to rank r, ``output_split_sizes[s]`` come from rank s.
        A blocking call like the ones before it runs the engine's plan for its kind (uneven: of
        its class and dtype, :meth:`_uneven_planned`).
        """
        if input_split_sizes is None and output_split_sizes is None:
            if not async_op and self._planned("all_to_all_single", input, None, output):
                return None
        elif (
            input_split_sizes is not None
            and not async_op
            and self._uneven_planned(output, input, output_split_sizes, input_split_sizes)
        ):
            return None
        return self._all_to_all_single_steps(
            output, input, output_split_sizes, input_split_sizes, async_op
        )

    def _uneven_planned(self, output: Any, input: Any, expected: Any, sent: Any) -> bool:
        """Run a blocking uneven all-to-all of a class and dtype the pipeline took before (and
        the ranks agreed on), outside the check points, when its arguments need nothing more
        than a look (:func:`~distcomm.backend._pipeline.routing.row_of_plain`): through the
        engine's plan for the kind (``y = (output, output_splits, input_splits)`` in elements),
        else its ``_all_to_all_v``; the split tables kept in the ledger once it ran. Returns
        whether it ran; False: nothing was sent, and the pipeline takes the call (and explains
        what is wrong)."""
        seq = self.seq + 1
        if seq >= self._next_check or observing.registered:  # hooks: the pipeline's event
            return False
        try:
            entry = self._plans.find_uneven(input)
        except (AttributeError, TypeError):  # not an array, or a dtype that is no key
            return False
        h = self._mismatch_check
        if entry is None or (h is not None and not h.unchecked(entry[1], "all_to_all_single")):
            return False
        row = routing.row_of_plain(self, output, input, expected, sent)
        if row < 0:
            return False
        self.op = "all_to_all_single"
        self.seq = seq
        if h is not None and entry[1] != h.run_fp:
            h.start_run(seq, entry[1])
        record = None
        if self._recorder is not None:
            record = self._open_entry("all_to_all_single", seq, input, cached_adapter(input))
        times = row.__mul__  # (map, not a comprehension: no frame of its own)
        splits = list(map(times, expected)), list(map(times, sent))
        plan = entry[0]
        if plan is None:
            self._call(self._all_to_all_v, False, output, splits[0], input, splits[1])
        else:
            self.blocked_seq = seq
            try:
                if record is not None:
                    record[ISSUED] = recording.stamp(self._entry_device)
                plan(input, (output, *splits))
            except NotPlanned:
                return self._plan_declined(seq, record, None)
            except BaseException as exc:
                raise self._plan_failed("all_to_all_single", seq, exc, record, None)  # noqa: B904
            finally:
                self.blocked_seq = 0
            if record is not None:
                record[COMPLETED] = recording.stamp(self._entry_device)
        if h is not None:
            routing.keep(self, h, sent, expected)
        return True

    @observed
    def _all_to_all_single_steps(
        self,
        output: Any,
        input: Any,
        output_split_sizes: Sequence[int] | None = None,
        input_split_sizes: Sequence[int] | None = None,
        async_op: bool = False,
    ) -> Work | None:
        """all_to_all_single past its plan and the uneven shortcut (what hooks wrap: every call
        is numbered)."""
        if output_split_sizes is not None or input_split_sizes is not None:
            return self._uneven_all_to_all(
                output, input, output_split_sizes, input_split_sizes, async_op
            )
        adapter, dtype = self._begin(input, "input")
        numel = adapter.numel(input)
        if numel % self._world_size:
            raise self._size_error("input", numel, "a multiple of world_size", self._world_size)
        self._check_pair(output, "output", adapter, dtype, numel, written=True)
        self._count("all_to_all_single", input, adapter)
        if self._solo:
            adapter.copy_(output, input)
            return DONE if async_op else None
        staged_in = self._stage(adapter, input, dtype, "input", apart_from=output)
        staged_out = self._stage(adapter, output, dtype, "output")
        work = self._call(self._all_to_all, async_op, staged_out.engine, staged_in.engine)
        return self._finish(work, async_op, staged_out, None, staged_in)

    def _uneven_all_to_all(
        self,
        output: Any,
        input: Any,
        output_split_sizes: Sequence[int] | None,
        input_split_sizes: Sequence[int] | None,
        async_op: bool,
    ) -> Work | None:
        """The uneven all-to-all (:mod:`~distcomm.backend._pipeline.routing`)."""
        adapter, dtype = self._begin(input, "input")
        self._check_pair(output, "output", adapter, dtype, None, written=True)
        world = self._world_size
        rows_in, row = routing.rows_of(tuple(input.shape), "input")
        rows_out, row_out = routing.rows_of(tuple(output.shape), "output")
        if row_out != row:
            raise InvalidArgumentError(
                f"output's rows hold {row_out} elements but input's hold {row} (shapes "
                f"{tuple(output.shape)} and {tuple(input.shape)}). HINT: only the first "
                "dimension may differ."
            )
        sent = routing.sizes(input_split_sizes, "input_split_sizes", rows_in, world)
        expected = routing.sizes(output_split_sizes, "output_split_sizes", rows_out, world)
        checked = self.seq + 1 >= self._next_check and self._mismatch_check is not None
        self._count("all_to_all_single", input, adapter, varies=True)
        if checked and world > 1:
            routing.agree(self, sent, expected)
        elif world > 1 and self._mismatch_check is not None:
            routing.keep(self, self._mismatch_check, sent, expected)
        elif world == 1 and sent != expected:
            raise InvalidArgumentError(
                f"all_to_all_single: in a world of 1 the only rank sends itself {sent[0]} rows "
                f"but expects {expected[0]}. HINT: input_split_sizes == output_split_sizes."
            )
        if self._solo:
            adapter.copy_(output, input)
            return DONE if async_op else None
        staged_in = self._stage(adapter, input, dtype, "input", apart_from=output)
        staged_out = self._stage(adapter, output, dtype, "output")
        args = ([n * row for n in expected], staged_in.engine, [n * row for n in sent])
        work = self._call(self._all_to_all_v, async_op, staged_out.engine, *args)
        return self._finish(work, async_op, staged_out, None, staged_in)

    def barrier(self, async_op: bool = False) -> Work | None:
        """Wait until every rank has reached the barrier.

        The engine's barrier. Under the mismatch check (unless the policy is off), the first
        barrier of a communicator is confirmed by a vote of the ranks first, as every new kind
        of call is; and a blocking barrier after uneven all-to-alls whose split tables have not
        been compared yet is a vote of point-to-point messages
        (:mod:`~distcomm.backend._pipeline.p2p_vote`) that confirms the ranks made the same
        calls, then compares the tables (:mod:`~distcomm.backend._pipeline.routing_ledger`).
        """
        if not async_op and self._planned("barrier", NO_ARRAY):
            return None
        return self._barrier_steps(async_op)

    @observed
    def _barrier_steps(self, async_op: bool) -> Work | None:
        """barrier past its plan (every call is numbered; the hooks see it)."""
        self._check_usable()
        self._count("barrier", NO_ARRAY)
        if self._solo:
            return DONE if async_op else None
        h = self._mismatch_check
        if h is not None and h.ledger:
            if async_op or not self._can_confirm():
                self._plans.drop_barrier()  # the tables still wait: no plan until settled
            else:
                p2p_vote.vote(self, p2p_vote.BARRIER)
                routing_ledger.settle(self, self.seq - 1, f"the barrier (operation #{self.seq})")
                if self._object_channel() is self:
                    return None
        return self._complete(self._call(self._barrier, async_op), async_op)
