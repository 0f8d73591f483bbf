"""The engine contract: what a backend's engine object provides (kit API 2).

A backend's factory returns an **engine**, an object of any class, and the kit's communicator
holds it: the engine never inherits from the kit, so its names are its own. The communicator
calls the engine's methods with contiguous arrays of a native dtype on a native device (CPU
torch tensors, numpy arrays or ``bytearray``; the kit stages the rest). With ``async_op=True``
a method may return an :class:`~distcomm.backend.EngineWork`; ``None`` means it is complete.

=================  ======================================================================
Required           ``all_reduce(tensor, op, async_op)``, ``broadcast(tensor, src, async_op)``,
                   ``all_gather_into(output, tensor, async_op)``, ``isend(tensor, dst, tag)``,
                   ``irecv(tensor, src, tag)``, ``split(groups, index)``
Optional methods   ``reduce``, ``reduce_scatter``, ``reduce_scatter_v``, ``gather``,
                   ``scatter``, ``all_to_all``, ``all_to_all_v``, ``all_gather_v``,
                   ``barrier``: an engine that has none, the kit builds it on the required
                   ones; ``plan(kind)``; ``bind(comm)``, ``finalize()``; ``timeout_of(exc)``,
                   ``peer_progress()``, ``peer_stacks(ranks)``, ``abort_job(message)``;
                   ``check_tag(tag)``, ``object_channel()``, ``adopt(native)``,
                   ``native_call(op, args)``; ``control_isend``, ``control_irecv``
Attributes         ``native``, ``devices``, ``cpu_only_reason``, ``engine_errors``, ``launch``
                   (optional)
=================  ======================================================================

Optional names are found by presence, once, when the communicator is made: an engine defines
what its engine does and nothing else (no method that "declines", no name to stay clear of).
:data:`REQUIRED`, :data:`OPTIONAL` and :data:`ATTRIBUTES` list them; :class:`Engine`
describes each. The backend declares the version of this contract it was written for
(``BackendSpec(kit_api=distcomm.backend.KIT_API)``); the guide is docs/plugins.md.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

if TYPE_CHECKING:
    from distcomm.backend.communicator import BaseCommunicator
    from distcomm.environment.info import LaunchInfo
    from distcomm.protocol import Communicator, NonMember, ReduceOp, Work

__all__ = [
    "ATTRIBUTES",
    "INTERNAL_TAG",
    "OPTIONAL",
    "PLANNED",
    "REQUIRED",
    "CallKind",
    "Engine",
    "NotPlanned",
]

#: The tag of the kit's own messages (the all-to-all it builds on point-to-point, its votes):
#: user tags stay below it.
INTERNAL_TAG = 2**30

#: What every engine defines.
REQUIRED = ("all_reduce", "broadcast", "all_gather_into", "isend", "irecv", "split")
#: What an engine may define, found by presence (:class:`Engine` describes each).
OPTIONAL = (
    "reduce",
    "reduce_scatter",
    "reduce_scatter_v",
    "gather",
    "scatter",
    "all_to_all",
    "all_to_all_v",
    "all_gather_v",
    "barrier",
    "plan",
    "bind",
    "finalize",
    "timeout_of",
    "peer_progress",
    "peer_stacks",
    "abort_job",
    "check_tag",
    "object_channel",
    "adopt",
    "native_call",
    "control_isend",
    "control_irecv",
)
#: The attributes an engine may set, and what the kit assumes without them.
ATTRIBUTES: dict[str, Any] = {
    "launch": None,
    "native": None,
    "devices": frozenset({"cpu"}),
    "cpu_only_reason": "",
    "engine_errors": (),
}


class NotPlanned(Exception):
    """Raised by a plan, before it moved anything, for a call of its kind that it cannot move as
    it is (its memory is not contiguous, say): the kit then takes the call through the
    pipeline, which stages it."""


class CallKind(NamedTuple):
    """The kind of call an engine is asked to plan (:meth:`Engine.plan`): every later call of
    the kind has an ``x`` of ``array``'s class, dtype and byte size (of its class and dtype
    only for ``all_to_all_v``, whose sizes vary), and the same root and tag."""

    #: The operation: one of :data:`PLANNED`.
    op: str
    #: The first call's array (the tensor; for all_gather_into_tensor, reduce_scatter_tensor,
    #: all_to_all_single and all_to_all_v the input): an example of the kind, not to be kept; a
    #: placeholder for the barrier, whose kind is its op alone.
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
        "all_to_all_v",
        "gather",
        "scatter",
        "send",
        "recv",
        "barrier",
    }
)


class Engine(Protocol):
    """The engine protocol: the required methods, then the optional ones (module docstring).

    Ranks are this communicator's (0 to ``world_size - 1``); arrays are contiguous, of a dtype
    in the capabilities, on a device in :attr:`devices`. Every method that takes ``async_op``
    either completes the operation and returns None, or (``async_op=True`` only) returns an
    :class:`~distcomm.backend.EngineWork`.
    """

    #: The engine's own handle (an mpi4py ``Comm``, a torch ProcessGroup), the communicator's
    #: ``native``; None for engines without one.
    native: Any
    #: The devices whose memory the engine moves (default ``{"cpu"}``); the kit stages the
    #: others through host memory. An engine bound to one accelerator lists it by index
    #: (``{"cuda:0"}``, NCCL): tensors on another device of its type are refused.
    devices: frozenset[str]
    #: Why the engine moves no GPU memory, for the one staging warning (what MPI said).
    cpu_only_reason: str
    #: The engine's own exceptions that mean it failed (``MPI.Exception``): raised by a method,
    #: they become :class:`~distcomm.errors.EngineError`.
    engine_errors: tuple[type[BaseException], ...]
    #: A world engine's launch where the factory settled on another than it was given (torch
    #: under MPI derives the rendezvous address, which ``init`` exports): the world's
    #: communicator takes it (its rank and world size too).
    launch: LaunchInfo

    # -- required ----------------------------------------------------------------------------------
    def all_reduce(self, tensor: Any, op: ReduceOp, async_op: bool) -> Work | None:
        """Reduce ``tensor`` in place on every rank with ``op``, one of the capabilities'
        ``reduce_ops`` (bool data comes with MAX, MIN or BXOR only)."""

    def broadcast(self, tensor: Any, src: int, async_op: bool) -> Work | None:
        """Copy ``src``'s ``tensor`` into every rank's."""

    def all_gather_into(self, output: Any, tensor: Any, async_op: bool) -> Work | None:
        """Concatenate every rank's ``tensor`` into ``output`` (world_size times larger), in
        rank order."""

    def isend(self, tensor: Any, dst: int, tag: int) -> Work:
        """Start sending ``tensor`` to ``dst`` with ``tag``. An engine without point-to-point
        messages says so in its capabilities (``p2p=False``: the kit refuses users' messages
        before they reach it) and raises NotSupportedError here; it then defines
        ``all_to_all`` (the kit's is built on messages)."""

    def irecv(self, tensor: Any, src: int | None, tag: int) -> Work:
        """Start receiving into ``tensor`` from ``src`` (None: any rank) with ``tag``; the
        Work's ``source`` is the sender once complete. The kit sends its own messages (votes,
        the all-to-all it builds) with tags from :data:`INTERNAL_TAG` up, refused to users."""

    def split(self, groups: list[tuple[int, ...]], index: int | None) -> Any:
        """Make one group per entry of ``groups`` (ranks of this communicator, in member
        order); called on every rank with the same ``groups``. Return this rank's group's
        engine (``groups[index]``), or None when ``index`` is None (this rank is in none): the
        kit makes the communicator around it."""

    # -- optional: operations (the kit builds each on the required ones) ---------------------------
    def reduce(self, tensor: Any, dst: int, op: ReduceOp, async_op: bool) -> Work | None:
        """Reduce into ``dst``'s ``tensor`` (the others' are left as they were or used as
        scratch)."""

    def reduce_scatter(self, output: Any, input: Any, op: ReduceOp, async_op: bool) -> Work | None:
        """Reduce ``input`` (world_size chunks) across ranks; rank r gets chunk r in
        ``output``."""

    def reduce_scatter_v(
        self, output: Any, sizes: list[int], input: Any, op: ReduceOp, async_op: bool
    ) -> Work | None:
        """As ``reduce_scatter``, chunk r holding ``sizes[r]`` elements (MPI's
        ``Reduce_scatter``)."""

    def gather(self, output: Any | None, tensor: Any, dst: int, async_op: bool) -> Work | None:
        """Concatenate every rank's ``tensor`` into ``dst``'s ``output`` (None elsewhere)."""

    def scatter(self, output: Any, full: Any | None, src: int, async_op: bool) -> Work | None:
        """Rank r gets chunk r of ``src``'s ``full`` (None elsewhere) in ``output``."""

    def all_to_all(self, output: Any, input: Any, async_op: bool) -> Work | None:
        """Chunk r of ``input`` goes to rank r; chunk s of ``output`` comes from rank s."""

    def all_to_all_v(
        self,
        output: Any,
        output_splits: list[int],
        input: Any,
        input_splits: list[int],
        async_op: bool,
    ) -> Work | None:
        """The uneven all-to-all of flat arrays: ``input`` holds ``input_splits[r]`` elements
        for each rank r in turn; ``output`` receives ``output_splits[s]`` from each rank s."""

    def all_gather_v(
        self, output: Any, sizes: list[int], tensor: Any, async_op: bool
    ) -> Work | None:
        """Concatenate every rank's flat ``tensor`` (rank r's holds ``sizes[r]`` elements)
        into ``output``, in rank order (MPI's ``Allgatherv``)."""

    def barrier(self, async_op: bool) -> Work | None:
        """Return once every rank has called it."""

    # -- optional: the fast path -------------------------------------------------------------------
    def plan(self, kind: CallKind) -> Callable[[Any, Any], Any] | None:
        """The engine's plan for a kind of blocking call the pipeline took once, or None (every
        call of the kind takes the pipeline; a plan that raises counts as None, with a warning).

        ``kind`` is a :class:`CallKind` of an op in :data:`PLANNED`, with a dtype the engine
        moves (sums as it is, for the reductions); reductions are SUM (all_reduce in place);
        the barrier's array is a placeholder. ``run(x, y)`` moves one call of the kind: ``x``
        the tensor (the input where the op has an output), ``y`` the output, gather's and
        scatter's list (on the root; None elsewhere), or None; ``recv``'s returns the sender's
        rank where its kind's root is None. The kit calls it inside the call's ``seq`` and
        "blocked in" mark and turns ``engine_errors`` into EngineError; it has checked that
        ``x`` is of the kind and ``y`` fits (class, dtype, size; the list's length), so a plan
        looks only at what its engine needs: memory that is contiguous and on a device it
        moves, else it raises :class:`NotPlanned` before moving anything. Results are the
        pipeline's: entry r of a gathered list is rank r's tensor.

        ``all_to_all_v`` is the uneven ``all_to_all_single`` (split sizes given), planned per
        class and dtype: ``x`` is the input and ``y`` is ``(output, output_splits,
        input_splits)``, the caller's arrays (of any shape) and the splits in elements, as
        :meth:`all_to_all_v` counts them. The kit has checked the call as for
        ``all_to_all_v`` (both arrays contiguous on a device the engine moves, not sharing
        memory, the output writable, the splits ints summing to the arrays' elements). An
        engine that does not know an op of :data:`PLANNED` returns None for it.
        """

    # -- optional: life ----------------------------------------------------------------------------
    def bind(self, comm: BaseCommunicator) -> None:
        """Called once with the communicator that holds this engine, before any operation:
        what an engine keeps to make Works (:class:`~distcomm.backend.EngineWork`), name
        itself in messages (``comm.describe()``) or watch its calls (``comm.blocked_seq``)."""

    def finalize(self) -> None:
        """Free the engine's resources for this communicator (called once)."""

    # -- optional: failures ------------------------------------------------------------------------
    def timeout_of(self, exc: BaseException) -> str | None:
        """Whether the engine's exception ``exc`` says the operation ran out of time: None, it
        does not (an engine failure); ``""``, the engine's own timeout ran out; or why the
        operation can never complete (fakelink: every rank waits). The kit then raises the
        communicator's DistTimeoutError, naming the ranks that had not arrived."""

    def peer_progress(self) -> dict[int, int] | None:
        """Each member's sequence number (the latest collective it entered), found out of
        band; a member that could not be asked is left out. Called on the failing rank only."""

    def peer_stacks(self, ranks: list[int]) -> dict[int, str] | None:
        """Where each of ``ranks`` is: the text of :func:`distcomm.backend.stacks.answer` there,
        found out of band within a few seconds; a member that did not answer is left out.
        Called after a failure, and from a helper thread while a rank waits in a check."""

    def abort_job(self, message: str) -> None:
        """End the job after a timeout under ``DISTCOMM_ON_TIMEOUT=abort`` (default: print
        ``message`` and end the process; thread-ranks end their fabric instead)."""

    # -- optional: the engine's limits and its own API ---------------------------------------------
    def check_tag(self, tag: int) -> None:
        """Refuse a user's ``tag`` (already an int below :data:`INTERNAL_TAG`) that the engine
        cannot carry, with InvalidArgumentError naming its range."""

    def object_channel(self) -> Communicator:
        """The communicator object bytes travel on, where not this one (a GPU engine returns a
        CPU side channel of the same members)."""

    def adopt(self, native: Any) -> Communicator | NonMember:
        """A communicator over a group the engine's own API made (a torch ProcessGroup), or
        NON_MEMBER where this rank is not in it."""

    def native_call(self, op: str, args: tuple[Any, ...]) -> Callable[[], object] | None:
        """A zero-argument callable that runs the engine's own API for ``op`` on ``args``, for
        ``distcomm bench --compare raw`` (None where it has none). ``op`` and ``args`` are as
        distcomm's method takes them, the rest at its defaults: ``all_reduce (x,)``,
        ``broadcast (x,)``, ``all_gather (out, x)``, ``reduce_scatter (out, x)``,
        ``all_to_all (out, x)``, ``all_gather_object (obj,)``, ``broadcast_object (obj,)``,
        ``gather_object (obj,)``, ``scatter_object (objs,)``, ``barrier ()``, ``sendrecv (x,
        y)`` (rank 0 sends ``x`` to rank 1 and receives into ``y``, rank 1 receives then
        sends). Convert ``args`` outside the callable: only the callable is timed."""

    # -- optional: the kit's own messages ----------------------------------------------------------
    def control_isend(self, payload: bytearray, dst: int) -> Work:
        """Start sending ``payload`` (a few bytes to a few KiB, the kit's votes) to member
        ``dst``, out of the way of every collective and of the program's messages; sends and
        receives between two members match in order. The Work must complete by polling alone,
        and a receive that never completes must leave the engine usable. Default:
        :meth:`isend` with a tag from :data:`INTERNAL_TAG` up, where the capabilities say
        ``p2p``. An engine whose receives need a blocking wait (Gloo's) sends them another way
        (torch's store), or sets both to None: the mismatch check then runs at its check points
        only."""

    def control_irecv(self, payload: bytearray, src: int) -> Work:
        """Start receiving into ``payload`` the next message :meth:`control_isend` sent from
        ``src`` to this member (at most ``len(payload)`` bytes)."""
