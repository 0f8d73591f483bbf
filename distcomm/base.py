"""`BaseCommunicator`: the public collectives, written once over a few engine primitives.

A backend derives from :class:`BaseCommunicator` and overrides the ``_primitive`` methods. The
public methods validate arguments, convert op names, accept torch tensors and numpy arrays,
answer worlds of 1 locally, stage CUDA tensors through host memory for CPU-only engines, bridge
dtypes the engine lacks through wider ones, emulate AVG, and copy results back into
non-contiguous tensors. A primitive receives contiguous arrays of a native dtype on a native device
and, with ``async_op=True``, may return a :class:`~distcomm.protocol.Work` (None means done).

The primitives, which ones a backend must write and the defaults of the others, are in
:mod:`distcomm.primitives`; argument checks in :mod:`distcomm.checks`. A contiguous CPU tensor of
a native dtype (the common case) goes to the primitive as it is, with no copy and no wrapper.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

from distcomm import objects
from distcomm.arrays import Adapter, adapter_for, cached_adapter, check_op_dtype, normalise_bool_op
from distcomm.checks import ArgumentChecks
from distcomm.errors import (
    DistcommError,
    DistcommWarning,
    InvalidArgumentError,
    NotSupportedError,
)
from distcomm.failures import Failures
from distcomm.primitives import Primitives
from distcomm.protocol import Communicator, NonMember, ReduceOp, Work
from distcomm.specs import Capabilities
from distcomm.staging import Staged, stage
from distcomm.work import BaseWork, CompletedWork, PendingWorks, retained

if TYPE_CHECKING:
    from distcomm.environment import LaunchInfo

__all__ = ["BaseCommunicator"]

_DONE = CompletedWork()
# Tuples, not sets: `in` finds enum members by identity, without Enum's Python-level __hash__.
_TYPED_OPS = (ReduceOp.AVG, ReduceOp.BAND, ReduceOp.BOR, ReduceOp.BXOR)


class BaseCommunicator(ArgumentChecks, Failures, Primitives):
    """Template for backends; see the module docstring.

    ``seq`` counts the collectives called on this communicator that passed validation (object
    collectives, ``new_group`` and ``split`` count once each; point-to-point messages do not):
    it is the same on every member, and timeouts and failures name operations by it. ``op`` is
    the name of the latest of them.

    Args:
        rank: this process's rank in the communicator.
        world_size: the number of ranks.
        launch: how the job was launched.
        global_ranks: the world rank of each member (default: ``range(world_size)``).
        timeout: seconds an operation may block.
        name: a label for messages (``"world"``, ``"group 1"``).
    """

    backend_name: ClassVar[str] = "base"
    capabilities: ClassVar[Capabilities] = Capabilities()
    #: The devices whose memory the engine moves (an instance may widen it, e.g. CUDA-aware MPI).
    devices: frozenset[str] = frozenset({"cpu"})
    #: Why the engine moves no GPU memory, for the one staging warning (e.g. what MPI said).
    cpu_only_reason: str = ""

    def __init__(
        self,
        *,
        rank: int,
        world_size: int,
        launch: LaunchInfo,
        global_ranks: Sequence[int] | None = None,
        timeout: float = 1800.0,
        name: str = "world",
    ) -> None:
        self._rank = rank
        self._world_size = world_size
        self._launch = launch
        self._global_ranks = (
            tuple(global_ranks) if global_ranks is not None else tuple(range(world_size))
        )
        self.timeout = float(timeout)
        self.name = name
        self.seq = 0
        self.op = ""
        self.unusable: str | None = None
        #: The Works handed to the caller that may not have completed.
        self._pending = PendingWorks()
        self._warned_staging = False
        self._native_dtypes = self.capabilities.dtypes
        self._native_ops = tuple(op for op in ReduceOp if op.name in self.capabilities.reduce_ops)
        self._native_avg = ReduceOp.AVG in self._native_ops
        self._direct_dtypes = self._native_dtypes - {"bool"}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "uint8" not in cls.capabilities.dtypes:
            raise TypeError(
                f"{cls.__qualname__}.capabilities.dtypes must include 'uint8': object "
                "collectives, new_group and split travel as bytes"
            )

    # -- identity ----------------------------------------------------------------------------
    @property
    def rank(self) -> int:
        return self._rank

    @property
    def world_size(self) -> int:
        return self._world_size

    @property
    def global_ranks(self) -> tuple[int, ...]:
        return self._global_ranks

    @property
    def backend(self) -> str:
        return self.backend_name

    @property
    def native(self) -> Any:
        """The engine's own handle (None for engines without one)."""
        return None

    @property
    def launch(self) -> LaunchInfo:
        return self._launch

    def __repr__(self) -> str:
        return (
            f"<{type(self).__name__} {self.backend_name} {self.name!r} "
            f"rank {self._rank} of {self._world_size}>"
        )

    def describe(self) -> str:
        """A short label for messages: backend, name and size."""
        ranks = "rank" if self._world_size == 1 else "ranks"
        return f"{self.backend_name} {self.name!r} ({self._world_size} {ranks})"

    # -- tensor collectives ------------------------------------------------------------------
    def all_reduce(self, tensor: Any, op: Any = ReduceOp.SUM, async_op: bool = False) -> Any:
        """Reduce ``tensor`` across ranks, in place on every rank.

        A plain int or float is reduced and the result returned (exactly, through objects).
        """
        op = op if op.__class__ is ReduceOp else ReduceOp.coerce(op)
        adapter = cached_adapter(tensor)
        if adapter is None and isinstance(tensor, (int, float)):
            return self._all_reduce_number(tensor, op)
        adapter, dtype = self._begin(tensor, "tensor", adapter)
        if op in _TYPED_OPS:
            check_op_dtype(op, dtype)
        self.seq += 1
        self.op = "all_reduce"
        if self._world_size == 1:
            return _DONE if async_op else None
        if (
            dtype in self._direct_dtypes
            and adapter.is_plain(tensor, self.devices)
            and op in self._native_ops
        ):
            return self._complete(self._all_reduce(tensor, op, async_op), async_op, tensor)
        staged, engine_op, divide = self._stage_reduction(adapter, tensor, dtype, op)
        if engine_op in self._native_ops:
            work = self._all_reduce(staged.engine, engine_op, async_op)
        else:
            self._reduce_by_gathering(staged.engine, engine_op)
            work = None
        return self._finish(work, async_op, staged, divide)

    def broadcast(self, tensor: Any, src: int = 0, async_op: bool = False) -> Work | None:
        """Copy ``src``'s ``tensor`` into ``tensor`` on every rank."""
        adapter, dtype = self._begin(tensor, "tensor")
        self._check_rank(src, "src")
        self._count("broadcast")
        if self._world_size == 1:
            return _DONE if async_op else None
        if dtype in self._native_dtypes and adapter.is_plain(tensor, self.devices):
            return self._complete(self._broadcast(tensor, src, async_op), async_op, tensor)
        staged = self._stage(adapter, tensor, dtype)
        work = self._broadcast(staged.engine, src, async_op)
        return self._finish(work, async_op, staged)

    def reduce(
        self, tensor: Any, dst: int = 0, op: Any = ReduceOp.SUM, async_op: bool = False
    ) -> Work | None:
        """Reduce ``tensor`` across ranks into ``dst``'s ``tensor``; others' are unspecified."""
        op = op if op.__class__ is ReduceOp else ReduceOp.coerce(op)
        adapter, dtype = self._begin(tensor, "tensor")
        check_op_dtype(op, dtype)
        self._check_rank(dst, "dst")
        self._count("reduce")
        if self._world_size == 1:
            return _DONE if async_op else None
        staged, engine_op, divide = self._stage_reduction(adapter, tensor, dtype, op)
        if engine_op in self._native_ops:
            work = self._reduce(staged.engine, dst, engine_op, async_op)
        else:
            self._reduce_by_gathering(staged.engine, engine_op)
            work = None
        if self._rank != dst:
            staged.copied, divide = False, None
        return self._finish(work, async_op, staged, divide)

    def all_gather(
        self, tensor_list: list[Any], tensor: Any, async_op: bool = False
    ) -> Work | None:
        """Gather every rank's ``tensor`` into ``tensor_list`` (one per rank) on every rank."""
        adapter, dtype = self._begin(tensor, "tensor")
        self._check_list(tensor_list, "tensor_list", adapter, dtype, adapter.numel(tensor))
        self._count("all_gather")
        if self._world_size == 1:
            adapter.copy_(tensor_list[0], tensor)
            return _DONE if async_op else None
        staged = self._stage(adapter, tensor, dtype)
        out = adapter.empty(staged.engine, adapter.numel(tensor) * self._world_size)
        work = self._all_gather_into(out, staged.engine, async_op)
        return self._finish_split(work, async_op, staged, out, tensor_list)

    def all_gather_into_tensor(
        self, output_tensor: Any, input_tensor: Any, async_op: bool = False
    ) -> Work | None:
        """Gather every rank's ``input_tensor`` into ``output_tensor`` (world_size times larger)."""
        adapter, dtype = self._begin(input_tensor, "input_tensor")
        self._check_pair(
            output_tensor,
            "output_tensor",
            adapter,
            dtype,
            adapter.numel(input_tensor) * self._world_size,
        )
        self._count("all_gather_into_tensor")
        if self._world_size == 1:
            adapter.copy_(output_tensor, input_tensor)
            return _DONE if async_op else None
        staged_in = self._stage(adapter, input_tensor, dtype, "input_tensor")
        staged_out = self._stage(adapter, output_tensor, dtype, "output_tensor")
        work = self._all_gather_into(staged_out.engine, staged_in.engine, async_op)
        return self._finish(work, async_op, staged_out, None, staged_in)

    def reduce_scatter_tensor(
        self, output: Any, input: Any, op: Any = ReduceOp.SUM, async_op: bool = False
    ) -> Work | None:
        """Reduce ``input`` (world_size chunks) across ranks; rank r gets chunk r in ``output``."""
        op = op if op.__class__ is ReduceOp else ReduceOp.coerce(op)
        adapter, dtype = self._begin(input, "input")
        check_op_dtype(op, dtype)
        self._check_pair(output, "output", adapter, dtype, None)
        if adapter.numel(input) != adapter.numel(output) * self._world_size:
            raise self._size_error(
                "input",
                adapter.numel(input),
                "world_size x output's",
                adapter.numel(output) * self._world_size,
            )
        self._count("reduce_scatter_tensor")
        if self._world_size == 1:
            adapter.copy_(output, input)
            return _DONE if async_op else None
        staged_in, engine_op, _ = self._stage_reduction(adapter, input, dtype, op)
        staged_out = self._stage(adapter, output, dtype, "output")
        divide = self._world_size if op is ReduceOp.AVG and not self._native_avg else None
        if engine_op in self._native_ops:
            work = self._reduce_scatter(staged_out.engine, staged_in.engine, engine_op, async_op)
        else:
            scratch = adapter.clone(staged_in.engine)
            self._reduce_by_gathering(scratch, engine_op)
            numel = adapter.numel(output)
            chunk = adapter.flat(scratch)[self._rank * numel : (self._rank + 1) * numel]
            adapter.copy_(staged_out.engine, chunk)
            work = None
        return self._finish(work, async_op, staged_out, divide, staged_in)

    def gather(
        self,
        tensor: Any,
        gather_list: list[Any] | None = None,
        dst: int = 0,
        async_op: bool = False,
    ) -> Work | None:
        """Gather every rank's ``tensor`` into ``gather_list`` on ``dst`` (None elsewhere)."""
        adapter, dtype = self._begin(tensor, "tensor")
        self._check_rank(dst, "dst")
        self._check_root_list(
            gather_list, "gather_list", dst, "dst", adapter, dtype, adapter.numel(tensor)
        )
        self._count("gather")
        if self._world_size == 1:
            assert gather_list is not None
            adapter.copy_(gather_list[0], tensor)
            return _DONE if async_op else None
        staged = self._stage(adapter, tensor, dtype)
        if gather_list is None:
            staged.copied = False  # nothing comes back to a rank that is not dst
            return self._finish(self._gather(None, staged.engine, dst, async_op), async_op, staged)
        out = adapter.empty(staged.engine, adapter.numel(tensor) * self._world_size)
        work = self._gather(out, staged.engine, dst, async_op)
        return self._finish_split(work, async_op, staged, out, gather_list)

    def scatter(
        self,
        tensor: Any,
        scatter_list: list[Any] | None = None,
        src: int = 0,
        async_op: bool = False,
    ) -> Work | None:
        """Give rank r ``scatter_list[r]`` from ``src``, in ``tensor``."""
        adapter, dtype = self._begin(tensor, "tensor")
        self._check_rank(src, "src")
        self._check_root_list(
            scatter_list, "scatter_list", src, "src", adapter, dtype, adapter.numel(tensor)
        )
        self._count("scatter")
        if self._world_size == 1:
            assert scatter_list is not None
            adapter.copy_(tensor, scatter_list[0])
            return _DONE if async_op else None
        staged = self._stage(adapter, tensor, dtype)
        full = None
        if scatter_list is not None:
            numel = adapter.numel(tensor)
            full = adapter.empty(staged.engine, numel * self._world_size)
            flat = adapter.flat(full)
            for r, part in enumerate(scatter_list):
                adapter.copy_(flat[r * numel : (r + 1) * numel], part)
        work = self._scatter(staged.engine, full, src, async_op)
        return self._finish(work, async_op, staged, None, full)

    def all_to_all_single(self, output: Any, input: Any, async_op: bool = False) -> Work | None:
        """Split ``input`` into world_size chunks; chunk r goes to rank r's ``output`` slot."""
        adapter, dtype = self._begin(input, "input")
        numel = adapter.numel(input)
        if numel % self._world_size:
            raise self._size_error("input", numel, "a multiple of world_size", self._world_size)
        self._check_pair(output, "output", adapter, dtype, numel)
        self._count("all_to_all_single")
        if self._world_size == 1:
            adapter.copy_(output, input)
            return _DONE if async_op else None
        staged_in = self._stage(adapter, input, dtype, "input")
        staged_out = self._stage(adapter, output, dtype, "output")
        work = self._all_to_all(staged_out.engine, staged_in.engine, async_op)
        return self._finish(work, async_op, staged_out, None, staged_in)

    def barrier(self, async_op: bool = False) -> Work | None:
        """Wait until every rank has reached the barrier."""
        self._check_usable()
        self._count("barrier")
        if self._world_size == 1:
            return _DONE if async_op else None
        return self._complete(self._barrier(async_op), async_op)

    # -- point to point ----------------------------------------------------------------------
    def send(self, tensor: Any, dst: int, tag: int = 0) -> None:
        """Send ``tensor`` to ``dst`` (a rank of this communicator)."""
        self.isend(tensor, dst, tag).wait()

    def recv(self, tensor: Any, src: int | None = None, tag: int = 0) -> int:
        """Receive into ``tensor`` from ``src`` (None: any rank); return the sender's rank."""
        work = self.irecv(tensor, src, tag)
        work.wait()
        source = getattr(work, "source", None)
        return int(source) if source is not None else int(src or 0)

    def isend(self, tensor: Any, dst: int, tag: int = 0) -> Work:
        """Start sending ``tensor`` to ``dst``; don't modify it before the Work completes."""
        adapter, dtype = self._begin(tensor, "tensor")
        self._check_rank(dst, "dst")
        self._check_tag(tag)
        self._check_p2p("isend")
        staged = self._stage(adapter, tensor, dtype)
        return self._handed(self._isend(staged.engine, dst, tag), (tensor, staged.engine), None)

    def irecv(self, tensor: Any, src: int | None = None, tag: int = 0) -> Work:
        """Start receiving into ``tensor``; the Work's ``source`` is the sender once complete."""
        adapter, dtype = self._begin(tensor, "tensor")
        if src is not None:
            self._check_rank(src, "src")
        elif not self.capabilities.any_source:
            raise InvalidArgumentError(
                f"backend {self.backend_name!r} cannot receive from any source (src=None). "
                "HINT: pass the sender's rank as src."
            )
        self._check_tag(tag)
        self._check_p2p("irecv")
        staged = self._stage(adapter, tensor, dtype)
        work = self._irecv(staged.engine, src, tag)
        after = staged.write_back if staged.copied else None
        return self._handed(work, (tensor, staged.engine), after)

    # -- objects -----------------------------------------------------------------------------
    def broadcast_object(self, obj: Any, src: int = 0) -> Any:
        """Return ``src``'s ``obj`` on every rank (pickle protocol 5, out-of-band buffers)."""
        self._check_usable()
        self._check_rank(src, "src")
        channel = self._objects("broadcast_object")
        return obj if channel is None else objects.broadcast_object(channel, obj, src)

    def all_gather_object(self, obj: Any) -> list[Any]:
        """Return every rank's ``obj``, in rank order, on every rank."""
        self._check_usable()
        channel = self._objects("all_gather_object")
        return [obj] if channel is None else objects.all_gather_object(channel, obj)

    def gather_object(self, obj: Any, dst: int = 0) -> list[Any] | None:
        """Return every rank's ``obj`` on ``dst``; None elsewhere."""
        self._check_usable()
        self._check_rank(dst, "dst")
        channel = self._objects("gather_object")
        return [obj] if channel is None else objects.gather_object(channel, obj, dst)

    def scatter_object(self, objs: Sequence[Any] | None, src: int = 0) -> Any:
        """Return ``objs[rank]`` from ``src`` (``objs`` is read on ``src`` only)."""
        self._check_usable()
        self._check_rank(src, "src")
        if self._rank == src:
            objects.check_scatter_list(objs, self._world_size)
        channel = self._objects("scatter_object")
        if channel is None:
            assert objs is not None
            return objs[0]
        return objects.scatter_object(channel, objs, src)

    def _object_channel(self) -> BaseCommunicator:
        """The communicator object bytes travel on (a GPU engine returns a CPU side channel)."""
        return self

    def _objects(self, op: str) -> BaseCommunicator | None:
        """Count object collective ``op`` here (and on the object channel); return the channel
        its bytes travel on, or None in a world of 1."""
        self._count(op)
        if self._world_size == 1:
            return None
        channel = self._object_channel()
        if channel is not self:
            channel._check_usable()
            channel._count(op)
        return channel

    # -- groups ------------------------------------------------------------------------------
    def new_group(self, ranks: Sequence[int]) -> Communicator | NonMember:
        """Make a sub-communicator of ``ranks``; collective over this communicator.

        Members are numbered in ascending order of their rank here; other ranks get
        :data:`~distcomm.NON_MEMBER`. Every rank must pass the same ranks.
        """
        self._check_usable()
        members = self._check_members(ranks)
        channel = self._objects("new_group")
        seen = [members] if channel is None else objects.all_gather_object(channel, members)
        for r, other in enumerate(seen):
            if other != members:
                raise InvalidArgumentError(
                    f"new_group: rank {self._rank} passed ranks {list(members)} but rank {r} "
                    f"passed {list(other)}. HINT: every rank calls new_group with the same ranks."
                )
        index = 0 if self._rank in members else None
        return self._split([members], index)

    def split(self, color: int | None, key: int | None = None) -> Communicator | NonMember:
        """Split into sub-communicators by ``color`` (None: not a member), ordered by ``key``."""
        self._check_usable()
        if color is not None and (
            not isinstance(color, int) or isinstance(color, bool) or color < 0
        ):
            raise InvalidArgumentError(
                f"split: color {color!r} must be a non-negative int, or None to stay out. "
                "HINT: ranks with equal colors form one group."
            )
        if key is not None and (not isinstance(key, int) or isinstance(key, bool)):
            raise InvalidArgumentError(f"split: key {key!r} must be an int or None (None: by rank)")
        mine = (color, self._rank if key is None else key)
        channel = self._objects("split")
        entries = [mine] if channel is None else objects.all_gather_object(channel, mine)
        colors = sorted({c for c, _ in entries if c is not None})
        groups = [
            tuple(
                sorted(
                    (r for r, (c, _) in enumerate(entries) if c == col),
                    key=lambda r: (entries[r][1], r),
                )
            )
            for col in colors
        ]
        index = None if color is None else colors.index(color)
        return self._split(groups, index)

    def adopt(self, native: Any) -> Communicator | NonMember:
        """A communicator over a group the engine's own API made (a torch ProcessGroup ...).

        For code that mixes distcomm with groups made by the engine directly. Backends that
        support it override this; the group stays its creator's (``finalize`` leaves it).
        NON_MEMBER where this rank is not in the group.

        Raises:
            NotSupportedError: this backend cannot wrap engine groups.
        """
        raise NotSupportedError(
            f"the {self.backend_name} backend cannot use {type(native).__name__!r} as a group. "
            "HINT: make the group with distcomm.new_group(ranks) instead."
        )

    def finalize(self) -> None:
        """Release the engine's resources for this communicator. Idempotent.

        Waits (up to the timeout) for the Works handed out that have not completed; if one
        still has not, the engine may yet use its memory and the communicator, so both are
        kept until the process exits instead of freed (with a warning).
        """
        if self.unusable == "finalized":
            return
        left = self._pending.settle(self.timeout if self.unusable is None else 0.0)
        if left:
            retained().append(self)
            warnings.warn(
                f"finalize: {len(left)} operation(s) on {self.describe()} had not completed "
                f"({', '.join(map(repr, left))}); the engine may still use their memory, so the "
                "communicator and their buffers are kept until the process exits. HINT: wait() "
                "for every Work before finalize().",
                DistcommWarning,
                stacklevel=2,
            )
        else:
            self._finalize()
        self.unusable = "finalized"

    # -- helpers -----------------------------------------------------------------------------
    def _check_usable(self) -> None:
        if self.unusable is not None:
            raise DistcommError(
                f"communicator {self.describe()} can no longer be used: {self.unusable}. "
                "HINT: create a new one with distcomm.init() after distcomm.finalize()."
            )

    def _begin(self, x: Any, what: str, adapter: Adapter | None = None) -> tuple[Adapter, str]:
        if self.unusable is not None:
            self._check_usable()
        if adapter is None:
            adapter = adapter_for(x, what)
        return adapter, adapter.dtype(x)

    def _count(self, op: str) -> None:
        """Count collective ``op``, which passed validation (see the class docstring)."""
        self.seq += 1
        self.op = op

    def _stage(self, adapter: Adapter, x: Any, dtype: str, what: str = "tensor") -> Staged:
        return stage(
            adapter,
            x,
            dtype,
            native_dtypes=self._native_dtypes,
            devices=self.devices,
            backend=self.backend_name,
            warn_staging=self._warn_staging,
            what=what,
        )

    def _reduce_by_gathering(self, engine: Any, op: ReduceOp) -> None:
        """Reduce with an op the engine lacks: all-gather every rank's data, combine locally."""
        adapter = adapter_for(engine)
        numel = adapter.numel(engine)
        gathered = adapter.empty(engine, numel * self._world_size)
        self._complete(self._all_gather_into(gathered, engine, False), False)
        flat = adapter.flat(gathered)
        result = adapter.clone(flat[0:numel])
        for r in range(1, self._world_size):
            adapter.combine_(result, flat[r * numel : (r + 1) * numel], op)
        adapter.copy_(engine, result)

    def _stage_reduction(
        self, adapter: Adapter, x: Any, dtype: str, op: ReduceOp
    ) -> tuple[Staged, ReduceOp, int | None]:
        staged = self._stage(adapter, x, dtype)
        if dtype == "bool":
            op = normalise_bool_op(op)
        divide = None
        if op is ReduceOp.AVG and not self._native_avg:
            op, divide = ReduceOp.SUM, self._world_size
        return staged, op, divide

    def _complete(self, work: Work | None, async_op: bool, *keep: Any) -> Work | None:
        """A primitive's outcome for the caller: waited for, or (async) a Work owning ``keep``."""
        if not async_op:
            if work is not None:
                work.wait()
            return None
        return self._handed(work, keep, None)

    def _finish(
        self,
        work: Work | None,
        async_op: bool,
        staged: Staged,
        divide: int | None = None,
        *keep: Any,
    ) -> Work | None:
        """As :meth:`_complete`, then copy the result back into the caller's tensor where it was
        staged (and divide an emulated AVG)."""
        after: Callable[[], None] | None = None
        if divide is not None:
            engine, adapter = staged.engine, staged.adapter

            def after() -> None:
                adapter.divide_(engine, divide)
                staged.write_back()

        elif staged.copied:
            after = staged.write_back
        if async_op:
            return self._handed(work, (staged.user, staged.engine, *keep), after)
        if work is not None:
            work.wait()
        if after is not None:
            after()
        return None

    def _finish_split(
        self, work: Work | None, async_op: bool, staged: Staged, out: Any, parts: list[Any]
    ) -> Work | None:
        """As :meth:`_complete`, then copy the chunks of ``out`` into ``parts``."""
        adapter = staged.adapter

        def after() -> None:
            flat = adapter.flat(out)
            numel = adapter.numel(out) // len(parts)
            for r, part in enumerate(parts):
                adapter.copy_(part, flat[r * numel : (r + 1) * numel])

        if async_op:
            return self._handed(work, (staged.user, staged.engine, out, *parts), after)
        if work is not None:
            work.wait()
        after()
        return None

    def _handed(
        self, work: Work | None, keep: tuple[Any, ...], after: Callable[[], None] | None
    ) -> BaseWork:
        """The Work the caller gets: it owns ``keep``, runs ``after`` once complete, and is
        remembered until it completes."""
        handed = self._then(work, after, *keep)
        if handed is None:
            return _DONE
        self._pending.add(handed)
        return handed

    def _check_p2p(self, op: str) -> None:
        if not self.capabilities.p2p:
            raise NotSupportedError(
                f"{op}: backend {self.backend_name!r} has no point-to-point messages. HINT: use "
                "collectives (broadcast, all_gather, ...), or a backend with them (gloo, mpi)."
            )

    def _warn_staging(self, device: str) -> None:
        if not self._warned_staging:
            self._warned_staging = True
            why = f" ({self.cpu_only_reason})" if self.cpu_only_reason else ""
            warnings.warn(
                f"backend {self.backend_name!r} moves CPU memory only{why}: {device} tensors are "
                "copied through host memory (slower). HINT: use a GPU backend such as nccl.",
                DistcommWarning,
                stacklevel=4,
            )

    def _all_reduce_number(self, value: int | float, op: ReduceOp) -> int | float:
        self._check_usable()
        channel = self._objects("all_reduce")
        if channel is None:
            return value / 1 if op is ReduceOp.AVG else value
        return objects.reduce_numbers(objects.all_gather_object(channel, value), op)
