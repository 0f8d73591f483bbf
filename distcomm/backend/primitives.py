"""The engine primitives a backend overrides, and correct (slower) defaults for the optional ones.

BaseCommunicator's public methods call these with contiguous arrays of a native dtype on a
native device. With ``async_op=True`` a primitive may return a Work; None means it is complete.

Required: ``_all_reduce``, ``_broadcast``, ``_all_gather_into``, ``_isend``, ``_irecv``, ``_split``.
Optional (defaults built on the required ones): ``_reduce``, ``_reduce_scatter``,
``_reduce_scatter_v``, ``_gather``, ``_scatter``, ``_all_to_all``, ``_all_to_all_v``,
``_all_gather_v``, ``_barrier``, ``_adopt``, ``_finalize``; and ``_plan``, the engine's plan for
a kind of call the pipeline took before (no default: every call takes the pipeline).
Not a primitive but overridable the same way: ``_native_call``, the engine's own API for an
operation, which ``distcomm bench --compare raw`` times beside distcomm's.

Every backend moves uint8 natively: object collectives, ``new_group`` and ``split`` travel as bytes.
"""

from __future__ import annotations

from collections.abc import Callable
from itertools import accumulate
from typing import TYPE_CHECKING, Any, ClassVar, NamedTuple

from distcomm.backend.arrays import adapter_for
from distcomm.backend.work import AllOf, BaseWork, WrappedWork
from distcomm.errors import NotSupportedError
from distcomm.protocol import ReduceOp, Work

if TYPE_CHECKING:
    from distcomm.backend.specs import Capabilities
    from distcomm.protocol import Communicator, NonMember

__all__ = ["INTERNAL_TAG", "PLANNED", "CallKind", "NotPlanned", "Primitives", "offsets"]

#: The tag the default ``_all_to_all`` uses; user tags stay below it.
INTERNAL_TAG = 2**30


class NotPlanned(Exception):
    """Raised by a plan, before it moved anything, for a call of its kind that it cannot move as
    it is (its memory is not contiguous, say): the kit then takes the call through the
    pipeline, which stages it."""


class CallKind(NamedTuple):
    """The kind of call an engine is asked to plan (:meth:`~distcomm.backend.primitives.
    Primitives._plan`): every later call of the kind has an ``x`` of ``array``'s class, dtype
    and byte size, and the same root and tag."""

    #: The operation: one of :data:`PLANNED`.
    op: str
    #: The first call's array (the tensor; for all_gather_into_tensor, reduce_scatter_tensor and
    #: all_to_all_single the input): an example of the kind, not to be kept; a placeholder for
    #: the barrier, whose kind is its op alone.
    array: Any
    #: The root (broadcast's src, reduce's and gather's dst, scatter's src), a message's peer
    #: (None: a receive from any rank), None for the others.
    root: int | None
    #: A message's tag (0 for collectives).
    tag: int = 0


#: The operations an engine may plan; the rest always take the pipeline.
PLANNED = frozenset(
    {
        "all_reduce",
        "broadcast",
        "reduce",
        "all_gather_into_tensor",
        "reduce_scatter_tensor",
        "all_to_all_single",
        "gather",
        "scatter",
        "send",
        "recv",
        "barrier",
    }
)


class Primitives:
    """Mixin of BaseCommunicator holding the primitives (see the module docstring)."""

    _kit_rank: int
    _kit_world_size: int
    backend_name: ClassVar[str]
    capabilities: ClassVar[Capabilities]

    #: Optional: the engine's plan for a kind of blocking call the pipeline took once,
    #: ``_plan(kind) -> run`` or None (no plan: every call of the kind takes the pipeline).
    #: ``kind`` is a :class:`~distcomm.backend.CallKind` (op, an example array, root, tag) of
    #: an op in ``distcomm.backend.PLANNED``, with a dtype the engine moves (sums as it is, for
    #: the reductions); reductions are SUM (all_reduce in place); the barrier's array is a
    #: placeholder (its ``None``: the kit runs ``_barrier``); a ``_plan`` that raises counts as
    #: None, with a warning. ``run(x, y)`` moves one call of the kind: ``x`` the tensor (the
    #: input where the op has an output), ``y`` the output, gather's and scatter's list (on the
    #: root; None elsewhere), or None; ``recv``'s returns the sender's rank where its kind's root
    #: is None (any rank). The kit calls it inside the call's ``seq`` and "blocked in" mark and
    #: turns ``engine_errors`` into EngineError; it has checked that ``x`` is of the kind and
    #: ``y`` fits (class, dtype, size; the list's length), so a plan looks only at what its
    #: engine needs: memory that is contiguous and on a device it moves, else it raises
    #: :class:`~distcomm.backend.NotPlanned` before moving anything and the pipeline stages the
    #: call. Results are the pipeline's: entry r of a gathered list is rank r's tensor.
    _plan: Callable[[CallKind], Callable[[Any, Any], Any] | None] | None = None
    #: Whether large object payloads may go through node memory when every rank is a process
    #: of one node (:mod:`distcomm.backend._pipeline.node_memory`). An engine whose own transfer
    #: is as fast on one node (MPI's shared-memory transport: a 16 MiB broadcast_object at 2
    #: ranks took 2.5 ms through it, 3.9 ms through node memory) sets it False.
    _node_memory: ClassVar[bool] = True
    #: The tag of distcomm's own messages (:meth:`_control_isend`): never a user's. An engine
    #: with fewer tags sets it to one of them that it refuses to users (MPI: its largest).
    _vote_tag: int = INTERNAL_TAG + 1

    def _missing(self, name: str) -> NotImplementedError:
        return NotImplementedError(
            f"backend {self.backend_name!r} ({type(self).__qualname__}) does not implement the "
            f"primitive {name}(); every backend must (see distcomm.backend.primitives)"
        )

    # -- required ----------------------------------------------------------------------------
    def _all_reduce(self, tensor: Any, op: ReduceOp, async_op: bool) -> Work | None:
        """Reduce ``tensor`` in place on every rank (bool data comes with MAX/MIN/BXOR only)."""
        raise self._missing("_all_reduce")

    def _broadcast(self, tensor: Any, src: int, async_op: bool) -> Work | None:
        """Copy ``src``'s ``tensor`` into every rank's."""
        raise self._missing("_broadcast")

    def _all_gather_into(self, output: Any, tensor: Any, async_op: bool) -> Work | None:
        """Concatenate every rank's ``tensor`` into ``output`` (world_size times larger)."""
        raise self._missing("_all_gather_into")

    def _isend(self, tensor: Any, dst: int, tag: int) -> Work:
        """Start sending ``tensor`` to ``dst``."""
        raise self._missing("_isend")

    def _irecv(self, tensor: Any, src: int | None, tag: int) -> Work:
        """Start receiving into ``tensor``; the Work has ``source`` once complete."""
        raise self._missing("_irecv")

    def _split(self, groups: list[tuple[int, ...]], index: int | None) -> Communicator | NonMember:
        """Create one communicator per group (ranks of this communicator, in member order).

        Called on every rank with the same ``groups``; ``index`` is this rank's group, or None.
        Return the new communicator, or NON_MEMBER when ``index`` is None.
        """
        raise self._missing("_split")

    # -- optional, with defaults -------------------------------------------------------------
    # Each honours async_op: it starts the required primitives and returns a Work that owns
    # the scratch buffers and finishes the result (a slice copied out) when it completes.
    def _reduce(self, tensor: Any, dst: int, op: ReduceOp, async_op: bool) -> Work | None:
        """Reduce into ``dst``'s ``tensor``. Default: all-reduce (a scratch copy off ``dst``)."""
        target = tensor if self._kit_rank == dst else adapter_for(tensor).clone(tensor)
        return self._then(self._all_reduce(target, op, async_op), None, target)

    def _reduce_scatter(self, output: Any, input: Any, op: ReduceOp, async_op: bool) -> Work | None:
        """Reduce ``input``; rank r gets chunk r. Default: all-reduce a copy, keep a slice."""
        adapter = adapter_for(input)
        scratch = adapter.clone(input)
        numel = adapter.numel(output)

        def keep_mine() -> None:
            mine = adapter.flat(scratch)[self._kit_rank * numel : (self._kit_rank + 1) * numel]
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
        padded = adapter.empty(input, width * self._kit_world_size)
        src, dst = adapter.flat(input), adapter.flat(padded)
        for r, (at, n) in enumerate(zip(offsets(sizes), sizes, strict=True)):
            adapter.copy_(dst[r * width : r * width + n], src[at : at + n])
            dst[r * width + n : (r + 1) * width] = 0  # numpy and torch alike
        mine = adapter.empty(input, width)
        n = sizes[self._kit_rank]

        def keep_mine() -> None:
            adapter.copy_(output, adapter.flat(mine)[:n])

        work = self._reduce_scatter(mine, padded, op, async_op)
        return self._then(work, keep_mine, padded, mine, output)

    def _gather(self, output: Any | None, tensor: Any, dst: int, async_op: bool) -> Work | None:
        """Concatenate every rank's ``tensor`` into ``dst``'s ``output``. Default: all-gather."""
        adapter = adapter_for(tensor)
        if output is None:
            output = adapter.empty(tensor, adapter.numel(tensor) * self._kit_world_size)
        return self._then(self._all_gather_into(output, tensor, async_op), None, output, tensor)

    def _scatter(self, output: Any, full: Any | None, src: int, async_op: bool) -> Work | None:
        """Rank r gets chunk r of ``src``'s ``full``. Default: broadcast ``full``, keep a slice."""
        adapter = adapter_for(output)
        numel = adapter.numel(output)
        if full is None:
            full = adapter.empty(output, numel * self._kit_world_size)

        def keep_mine() -> None:
            mine = adapter.flat(full)[self._kit_rank * numel : (self._kit_rank + 1) * numel]
            adapter.copy_(output, mine)

        return self._then(self._broadcast(full, src, async_op), keep_mine, full, output)

    def _control_isend(self, payload: bytearray, dst: int) -> Work:
        """Start sending ``payload`` (a few bytes to a few KiB) to member ``dst``, out of the
        way of every collective and of the program's own messages: distcomm's votes (the
        mismatch check before a new kind of call, in finalize, at a barrier that settles split
        tables). Sends and
        receives between two members match in order. The Work must complete by
        ``is_completed()`` polling alone, and a receive that never completes must leave the
        engine usable. Default: :meth:`_isend` on :attr:`_vote_tag`; an engine whose messages
        need a blocking wait (Gloo's) sends them another way (torch's store)."""
        return self._isend(payload, dst, self._vote_tag)

    def _control_ready(self) -> bool:
        """Whether :meth:`_control_isend` and :meth:`_control_irecv` work here (default: this
        engine has point-to-point messages). Without them the mismatch check still runs at
        its check points and on the failure path, but not at barriers, in ``finalize`` nor
        before a new kind of call."""
        return bool(self.capabilities.p2p)

    def _control_irecv(self, payload: bytearray, src: int) -> Work:
        """Start receiving into ``payload`` the next message :meth:`_control_isend` sent from
        member ``src`` to this one (it is at most ``len(payload)`` bytes)."""
        return self._irecv(payload, src, self._vote_tag)

    def _all_to_all(self, output: Any, input: Any, async_op: bool) -> Work | None:
        """Chunk r of ``input`` goes to rank r. Default: point-to-point with INTERNAL_TAG."""
        adapter = adapter_for(input)
        size = self._kit_world_size
        chunk = adapter.numel(input) // size
        src_flat, out_flat = adapter.flat(input), adapter.flat(output)
        peers = [r for r in range(size) if r != self._kit_rank]
        works = [self._irecv(out_flat[r * chunk : (r + 1) * chunk], r, INTERNAL_TAG) for r in peers]
        works += [
            self._isend(src_flat[r * chunk : (r + 1) * chunk], r, INTERNAL_TAG) for r in peers
        ]
        me = slice(self._kit_rank * chunk, (self._kit_rank + 1) * chunk)
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
        me = self._kit_rank
        adapter.copy_(
            dst[at_out[me] : at_out[me] + output_splits[me]],
            src[at_in[me] : at_in[me] + input_splits[me]],
        )
        peers = [r for r in range(self._kit_world_size) if r != me]
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
        size = self._kit_world_size
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
        adapter.copy_(adapter.flat(send)[: sizes[self._kit_rank]], tensor)
        padded = adapter.empty(tensor, width * self._kit_world_size)

        def unpad() -> None:
            src, dst = adapter.flat(padded), adapter.flat(output)
            for r, (at, n) in enumerate(zip(offsets(sizes), sizes, strict=True)):
                adapter.copy_(dst[at : at + n], src[r * width : r * width + n])

        return self._then(self._all_gather_into(padded, send, async_op), unpad, padded, send)

    def _barrier(self, async_op: bool) -> Work | None:
        """Wait for every rank. Default: all-gather one byte."""
        out, one = bytearray(self._kit_world_size), bytearray(1)
        return self._then(self._all_gather_into(out, one, async_op), None, out, one)

    def _adopt(self, native: Any) -> Communicator | NonMember:
        """Wrap a group the engine's own API made. Default: NotSupportedError."""
        raise NotSupportedError(
            f"the {self.backend_name} backend cannot use {type(native).__name__!r} as a group. "
            "HINT: make the group with distcomm.new_group(ranks) instead."
        )

    def _finalize(self) -> None:
        """Free the engine's resources for this communicator. Default: nothing to free."""

    def _native_call(self, op: str, args: tuple[Any, ...]) -> Callable[[], object] | None:
        """A zero-argument callable that runs the engine's own API for the distcomm operation
        ``op`` on ``args``, for ``distcomm bench --compare raw``; None (the default) where the
        engine has none. ``op`` and ``args`` are as distcomm's method takes them, the rest left
        at its defaults (src and dst 0, SUM): ``all_reduce (x,)``, ``broadcast (x,)``,
        ``all_gather (out, x)`` (into one tensor), ``reduce_scatter (out, x)``, ``all_to_all
        (out, x)``, ``all_gather_object (obj,)``, ``broadcast_object (obj,)``, ``gather_object
        (obj,)``, ``scatter_object (objs,)`` (objs is None off rank 0), ``barrier ()``,
        ``sendrecv (x, y)`` (a ping-pong: rank 0 sends ``x`` to rank 1 and receives into ``y``,
        rank 1 receives then sends, the others idle). Convert ``args`` to the engine's types
        here, outside the callable: only the callable is timed."""
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
