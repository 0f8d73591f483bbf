"""The kit's own versions of the engine's optional methods, built on the required ones.

A communicator calls its engine's methods (:mod:`distcomm.backend.engine`) under the same names
with a ``_`` before them: ``self._all_reduce`` is the engine's ``all_reduce``, bound once when
the communicator is made. Where the engine has no method of a name, the communicator's is the
one here: correct, and slower than an engine's own. Each honours ``async_op``: it starts the
required methods and returns a Work that owns the scratch buffers and finishes the result (a
slice copied out) when it completes.
"""

from __future__ import annotations

from collections.abc import Callable
from itertools import accumulate
from typing import TYPE_CHECKING, Any

from distcomm.backend.arrays import adapter_for
from distcomm.backend.engine import INTERNAL_TAG
from distcomm.backend.work import AllOf, BaseWork, WrappedWork
from distcomm.errors import NotSupportedError
from distcomm.protocol import ReduceOp, Work

if TYPE_CHECKING:
    from distcomm.backend.engine import CallKind
    from distcomm.backend.specs import Capabilities
    from distcomm.protocol import Communicator, NonMember

__all__ = ["Defaults", "offsets"]


class Defaults:
    """Mixin of BaseCommunicator holding the defaults (see the module docstring)."""

    _rank: int
    _world_size: int
    backend_name: str
    capabilities: Capabilities

    #: The engine's plan (``plan``), or None where it has none: every call takes the pipeline.
    _plan: Callable[[CallKind], Callable[[Any, Any], Any] | None] | None = None

    # -- the operations ------------------------------------------------------------------------
    def _reduce(self, tensor: Any, dst: int, op: ReduceOp, async_op: bool) -> Work | None:
        """Reduce into ``dst``'s ``tensor``. Default: all-reduce (a scratch copy off ``dst``)."""
        target = tensor if self._rank == dst else adapter_for(tensor).clone(tensor)
        return self._then(self._all_reduce(target, op, async_op), None, target)

    def _reduce_scatter(self, output: Any, input: Any, op: ReduceOp, async_op: bool) -> Work | None:
        """Reduce ``input``; rank r gets chunk r. Default: all-reduce a copy, keep a slice."""
        adapter = adapter_for(input)
        scratch = adapter.clone(input)
        numel = adapter.numel(output)

        def keep_mine() -> None:
            mine = adapter.flat(scratch)[self._rank * numel : (self._rank + 1) * numel]
            adapter.copy_(output, mine)

        return self._then(self._all_reduce(scratch, op, async_op), keep_mine, scratch, output)

    def _reduce_scatter_v(
        self, output: Any, sizes: list[int], input: Any, op: ReduceOp, async_op: bool
    ) -> Work | None:
        """Reduce ``input``, the flat concatenation of one chunk per rank in rank order (rank
        r's holds ``sizes[r]`` elements), across ranks; rank r gets its reduced chunk in
        ``output`` (``sizes[r]`` elements): an uneven reduce-scatter (torchcomms'
        ``reduce_scatter_v``, MPI's ``Reduce_scatter``). Default: ``_reduce_scatter`` directly
        when the sizes are equal, else of chunks padded to the largest with zeros (the
        padding's result is discarded), this rank's chunk copied out when complete."""
        width = max(sizes)
        if min(sizes) == width:
            return self._reduce_scatter(output, input, op, async_op)
        adapter = adapter_for(input)
        padded = adapter.empty(input, width * self._world_size)
        src, dst = adapter.flat(input), adapter.flat(padded)
        for r, (at, n) in enumerate(zip(offsets(sizes), sizes, strict=True)):
            adapter.copy_(dst[r * width : r * width + n], src[at : at + n])
            dst[r * width + n : (r + 1) * width] = 0  # numpy and torch alike
        mine = adapter.empty(input, width)
        n = sizes[self._rank]

        def keep_mine() -> None:
            adapter.copy_(output, adapter.flat(mine)[:n])

        work = self._reduce_scatter(mine, padded, op, async_op)
        return self._then(work, keep_mine, padded, mine, output)

    def _gather(self, output: Any | None, tensor: Any, dst: int, async_op: bool) -> Work | None:
        """Concatenate every rank's ``tensor`` into ``dst``'s ``output``. Default: all-gather."""
        adapter = adapter_for(tensor)
        if output is None:
            output = adapter.empty(tensor, adapter.numel(tensor) * self._world_size)
        return self._then(self._all_gather_into(output, tensor, async_op), None, output, tensor)

    def _scatter(self, output: Any, full: Any | None, src: int, async_op: bool) -> Work | None:
        """Rank r gets chunk r of ``src``'s ``full``. Default: broadcast ``full``, keep a slice."""
        adapter = adapter_for(output)
        numel = adapter.numel(output)
        if full is None:
            full = adapter.empty(output, numel * self._world_size)

        def keep_mine() -> None:
            mine = adapter.flat(full)[self._rank * numel : (self._rank + 1) * numel]
            adapter.copy_(output, mine)

        return self._then(self._broadcast(full, src, async_op), keep_mine, full, output)

    def _control_isend(self, payload: bytearray, dst: int) -> Work:
        """The kit's vote to member ``dst`` (the engine's ``control_isend``): a message with
        the tag after :data:`~distcomm.backend.engine.INTERNAL_TAG`."""
        return self._isend(payload, dst, INTERNAL_TAG + 1)

    def _control_irecv(self, payload: bytearray, src: int) -> Work:
        """The next vote from member ``src`` (the engine's ``control_irecv``)."""
        return self._irecv(payload, src, INTERNAL_TAG + 1)

    def _all_to_all(self, output: Any, input: Any, async_op: bool) -> Work | None:
        """Chunk r of ``input`` goes to rank r. Default: point-to-point with INTERNAL_TAG."""
        adapter = adapter_for(input)
        size = self._world_size
        chunk = adapter.numel(input) // size
        src_flat, out_flat = adapter.flat(input), adapter.flat(output)
        peers = [r for r in range(size) if r != self._rank]
        works = [self._irecv(out_flat[r * chunk : (r + 1) * chunk], r, INTERNAL_TAG) for r in peers]
        works += [
            self._isend(src_flat[r * chunk : (r + 1) * chunk], r, INTERNAL_TAG) for r in peers
        ]
        me = slice(self._rank * chunk, (self._rank + 1) * chunk)
        adapter.copy_(out_flat[me], src_flat[me])
        return AllOf(self, works, input, output)  # type: ignore[arg-type]

    def _all_to_all_v(
        self,
        output: Any,
        output_splits: list[int],
        input: Any,
        input_splits: list[int],
        async_op: bool,
    ) -> Work | None:
        """The uneven all-to-all of flat arrays: ``input`` holds ``input_splits[r]`` elements
        for each rank r, one after the other; ``output`` receives ``output_splits[s]`` elements
        from each rank s, one after the other (the ranks agree: what r sends s is what s
        expects from r). Default: point-to-point messages with INTERNAL_TAG where the engine has
        them, else the even ``_all_to_all`` of chunks padded to the largest split of any rank
        (one all-gather of 8 bytes a rank finds it)."""
        if not self.capabilities.p2p:
            return self._all_to_all_padded(output, output_splits, input, input_splits, async_op)
        adapter = adapter_for(input)
        src, dst = adapter.flat(input), adapter.flat(output)
        at_in, at_out = offsets(input_splits), offsets(output_splits)
        me = self._rank
        adapter.copy_(
            dst[at_out[me] : at_out[me] + output_splits[me]],
            src[at_in[me] : at_in[me] + input_splits[me]],
        )
        peers = [r for r in range(self._world_size) if r != me]
        works = [
            self._irecv(dst[at_out[r] : at_out[r] + output_splits[r]], r, INTERNAL_TAG)
            for r in peers
            if output_splits[r]
        ]
        works += [
            self._isend(src[at_in[r] : at_in[r] + input_splits[r]], r, INTERNAL_TAG)
            for r in peers
            if input_splits[r]
        ]
        return AllOf(self, works, input, output)  # type: ignore[arg-type]

    def _all_to_all_padded(
        self,
        output: Any,
        output_splits: list[int],
        input: Any,
        input_splits: list[int],
        async_op: bool,
    ) -> Work | None:
        """The uneven all-to-all over the even one (see ``_all_to_all_v``)."""
        adapter = adapter_for(input)
        size = self._world_size
        mine = max(max(input_splits), max(output_splits)).to_bytes(8, "little")
        every = bytearray(8 * size)
        gathered = self._all_gather_into(every, bytearray(mine), False)
        if gathered is not None:
            gathered.wait()
        width = max(1, *(int.from_bytes(every[8 * r : 8 * r + 8], "little") for r in range(size)))
        padded_in = adapter.empty(input, width * size)
        padded_out = adapter.empty(input, width * size)
        src, dst = adapter.flat(input), adapter.flat(output)
        at_in, at_out = offsets(input_splits), offsets(output_splits)
        for r in range(size):
            n = input_splits[r]
            adapter.copy_(padded_in[r * width : r * width + n], src[at_in[r] : at_in[r] + n])

        def unpad() -> None:
            for r in range(size):
                n = output_splits[r]
                adapter.copy_(dst[at_out[r] : at_out[r] + n], padded_out[r * width : r * width + n])

        return self._then(
            self._all_to_all(padded_out, padded_in, async_op), unpad, padded_in, padded_out
        )

    def _all_gather_v(
        self, output: Any, sizes: list[int], tensor: Any, async_op: bool
    ) -> Work | None:
        """Concatenate every rank's flat array ``tensor`` (rank r's holds ``sizes[r]`` elements)
        into ``output``, a flat array of ``sum(sizes)`` elements of the same dtype, in rank
        order: a variable-size all-gather (MPI's ``Allgatherv``). ``all_gather_v`` uses it, and
        object collectives with byte buffers, whose elements are bytes. Default:
        ``_all_gather_into`` directly when the sizes are equal, else of chunks padded to the
        largest, copied out when complete."""
        width = max(sizes)
        if min(sizes) == width:
            return self._then(self._all_gather_into(output, tensor, async_op), None, output, tensor)
        adapter = adapter_for(tensor)
        send = adapter.empty(tensor, width)
        adapter.copy_(adapter.flat(send)[: sizes[self._rank]], tensor)
        padded = adapter.empty(tensor, width * self._world_size)

        def unpad() -> None:
            src, dst = adapter.flat(padded), adapter.flat(output)
            for r, (at, n) in enumerate(zip(offsets(sizes), sizes, strict=True)):
                adapter.copy_(dst[at : at + n], src[r * width : r * width + n])

        return self._then(self._all_gather_into(padded, send, async_op), unpad, padded, send)

    def _barrier(self, async_op: bool) -> Work | None:
        """Wait for every rank. Default: all-gather one byte."""
        out, one = bytearray(self._world_size), bytearray(1)
        return self._then(self._all_gather_into(out, one, async_op), None, out, one)

    def _adopt(self, native: Any) -> Communicator | NonMember:
        """Wrap a group the engine's own API made (its ``adopt``). Default: NotSupportedError."""
        raise NotSupportedError(
            f"the {self.backend_name} backend cannot use {type(native).__name__!r} as a group. "
            "HINT: make the group with distcomm.new_group(ranks) instead."
        )

    def _finalize(self) -> None:
        """Free the engine's resources for this communicator (its ``finalize``)."""

    def _native_call(self, op: str, args: tuple[Any, ...]) -> Callable[[], object] | None:
        """The engine's own API for ``op`` (its ``native_call``); None: it has none."""
        return None

    # -- for the defaults ----------------------------------------------------------------------
    def _then(
        self, work: Work | None, finish: Callable[[], None] | None, *buffers: Any
    ) -> BaseWork | None:
        """``work`` owning ``buffers`` and running ``finish`` once complete (at once, and None,
        when there is no Work: the primitive completed)."""
        if work is None:
            if finish is not None:
                finish()
            return None
        owner = work if isinstance(work, BaseWork) else WrappedWork(self, work)  # type: ignore[arg-type]
        owner.own(*buffers)
        if finish is not None:
            owner.then(finish)
        return owner


def offsets(splits: list[int]) -> list[int]:
    """Where each of ``splits`` starts, in a buffer that holds them one after the other (MPI's
    displacements of a ``v`` collective)."""
    starts = list(accumulate(splits, initial=0))
    starts.pop()
    return starts
