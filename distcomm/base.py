"""`BaseCommunicator`: the public collectives, written once over a few engine primitives.

A backend derives from :class:`BaseCommunicator` and overrides the ``_primitive`` methods. The
public methods validate arguments, convert op names, accept torch tensors and numpy arrays,
answer worlds of 1 locally, stage CUDA tensors through host memory for CPU-only engines, bridge
dtypes the engine lacks through wider ones, emulate AVG, and copy results back into
non-contiguous tensors. A primitive receives contiguous arrays of a native dtype on a native device
and, with ``async_op=True``, may return a :class:`~distcomm.protocol.Work` (None means done).

Primitives every backend implements: ``_all_reduce``, ``_broadcast``, ``_all_gather_into``,
``_send``, ``_recv``, ``_split``. The others have correct, slower defaults built on those:
``_reduce``, ``_reduce_scatter``, ``_gather``, ``_scatter``, ``_all_to_all``, ``_barrier``,
``_isend``, ``_irecv``, ``_finalize``.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

from distcomm import objects
from distcomm.arrays import Adapter, adapter_for, check_op_dtype, normalise_bool_op
from distcomm.errors import DistcommError, DistcommWarning, InvalidArgumentError
from distcomm.protocol import NON_MEMBER, Communicator, NonMember, ReduceOp, Work
from distcomm.specs import Capabilities
from distcomm.staging import Staged, stage
from distcomm.work import ChainedWork, CompletedWork

if TYPE_CHECKING:
    from distcomm.environment import LaunchInfo

__all__ = ["BaseCommunicator"]

_DONE = CompletedWork()


class BaseCommunicator:
    """Template for backends; see the module docstring.

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
    devices: ClassVar[frozenset[str]] = frozenset({"cpu"})

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
        self._global_ranks = tuple(global_ranks) if global_ranks is not None else tuple(range(world_size))
        self.timeout = float(timeout)
        self.name = name
        self.seq = 0
        self.unusable: str | None = None
        self._warned_staging = False
        self._native_dtypes = self.capabilities.dtypes
        self._native_avg = "AVG" in self.capabilities.reduce_ops

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
        return f"{self.backend_name} {self.name!r} ({self._world_size} ranks)"

    # -- tensor collectives ------------------------------------------------------------------
    def all_reduce(self, tensor: Any, op: Any = ReduceOp.SUM, async_op: bool = False) -> Any:
        """Reduce ``tensor`` across ranks, in place on every rank.

        A plain int or float is reduced and the result returned (exactly, through objects).
        """
        op = op if op.__class__ is ReduceOp else ReduceOp.coerce(op)
        if isinstance(tensor, (int, float)):
            return self._all_reduce_number(tensor, op)
        adapter, dtype = self._begin(tensor, "tensor")
        check_op_dtype(op, dtype)
        if self._world_size == 1:
            return _DONE if async_op else None
        staged, engine_op, divide = self._stage_reduction(adapter, tensor, dtype, op)
        work = self._all_reduce(staged.engine, engine_op, async_op)
        return self._finish(work, async_op, staged, divide)

    def broadcast(self, tensor: Any, src: int = 0, async_op: bool = False) -> Work | None:
        """Copy ``src``'s ``tensor`` into ``tensor`` on every rank."""
        adapter, dtype = self._begin(tensor, "tensor")
        self._check_rank(src, "src")
        if self._world_size == 1:
            return _DONE if async_op else None
        staged = self._stage(adapter, tensor, dtype)
        work = self._broadcast(staged.engine, src, async_op)
        return self._finish(work, async_op, staged)

    def reduce(
        self, tensor: Any, dst: int = 0, op: Any = ReduceOp.SUM, async_op: bool = False
    ) -> Work | None:
        """Reduce ``tensor`` across ranks into ``dst``'s ``tensor``; others' are left unspecified."""
        op = op if op.__class__ is ReduceOp else ReduceOp.coerce(op)
        adapter, dtype = self._begin(tensor, "tensor")
        check_op_dtype(op, dtype)
        self._check_rank(dst, "dst")
        if self._world_size == 1:
            return _DONE if async_op else None
        staged, engine_op, divide = self._stage_reduction(adapter, tensor, dtype, op)
        work = self._reduce(staged.engine, dst, engine_op, async_op)
        if self._rank != dst:
            staged.copied, divide = False, None
        return self._finish(work, async_op, staged, divide)

    def all_gather(self, tensor_list: list[Any], tensor: Any, async_op: bool = False) -> Work | None:
        """Gather every rank's ``tensor`` into ``tensor_list`` (one entry per rank) on every rank."""
        adapter, dtype = self._begin(tensor, "tensor")
        self._check_list(tensor_list, "tensor_list", adapter, dtype, adapter.numel(tensor))
        if self._world_size == 1:
            adapter.copy_(tensor_list[0], tensor)
            return _DONE if async_op else None
        staged = self._stage(adapter, tensor, dtype)
        out = adapter.empty(staged.engine, adapter.numel(tensor) * self._world_size)
        work = self._all_gather_into(out, staged.engine, async_op)
        return self._finish_split(work, async_op, adapter, out, tensor_list)

    def all_gather_into_tensor(
        self, output_tensor: Any, input_tensor: Any, async_op: bool = False
    ) -> Work | None:
        """Gather every rank's ``input_tensor`` into ``output_tensor`` (world_size times larger)."""
        adapter, dtype = self._begin(input_tensor, "input_tensor")
        self._check_pair(output_tensor, "output_tensor", adapter, dtype, adapter.numel(input_tensor) * self._world_size)
        if self._world_size == 1:
            adapter.copy_(output_tensor, input_tensor)
            return _DONE if async_op else None
        staged_in = self._stage(adapter, input_tensor, dtype, "input_tensor")
        staged_out = self._stage(adapter, output_tensor, dtype, "output_tensor")
        work = self._all_gather_into(staged_out.engine, staged_in.engine, async_op)
        return self._finish(work, async_op, staged_out)

    def reduce_scatter_tensor(
        self, output: Any, input: Any, op: Any = ReduceOp.SUM, async_op: bool = False
    ) -> Work | None:
        """Reduce ``input`` (world_size chunks) across ranks; rank r gets chunk r in ``output``."""
        op = op if op.__class__ is ReduceOp else ReduceOp.coerce(op)
        adapter, dtype = self._begin(input, "input")
        check_op_dtype(op, dtype)
        self._check_pair(output, "output", adapter, dtype, None)
        if adapter.numel(input) != adapter.numel(output) * self._world_size:
            raise self._size_error("input", adapter.numel(input), "world_size x output's", adapter.numel(output) * self._world_size)
        if self._world_size == 1:
            adapter.copy_(output, input)
            return _DONE if async_op else None
        staged_in, engine_op, _ = self._stage_reduction(adapter, input, dtype, op)
        staged_out = self._stage(adapter, output, dtype, "output")
        divide = self._world_size if op is ReduceOp.AVG and not self._native_avg else None
        work = self._reduce_scatter(staged_out.engine, staged_in.engine, engine_op, async_op)
        return self._finish(work, async_op, staged_out, divide)

    def gather(
        self, tensor: Any, gather_list: list[Any] | None = None, dst: int = 0, async_op: bool = False
    ) -> Work | None:
        """Gather every rank's ``tensor`` into ``gather_list`` on ``dst`` (None elsewhere)."""
        adapter, dtype = self._begin(tensor, "tensor")
        self._check_rank(dst, "dst")
        self._check_root_list(gather_list, "gather_list", dst, "dst", adapter, dtype, adapter.numel(tensor))
        if self._world_size == 1:
            assert gather_list is not None
            adapter.copy_(gather_list[0], tensor)
            return _DONE if async_op else None
        staged = self._stage(adapter, tensor, dtype)
        out = None
        if gather_list is not None:
            out = adapter.empty(staged.engine, adapter.numel(tensor) * self._world_size)
        work = self._gather(out, staged.engine, dst, async_op)
        if gather_list is None:
            return self._finish(work, async_op)
        return self._finish_split(work, async_op, adapter, out, gather_list)

    def scatter(
        self, tensor: Any, scatter_list: list[Any] | None = None, src: int = 0, async_op: bool = False
    ) -> Work | None:
        """Give rank r ``scatter_list[r]`` from ``src``, in ``tensor``."""
        adapter, dtype = self._begin(tensor, "tensor")
        self._check_rank(src, "src")
        self._check_root_list(scatter_list, "scatter_list", src, "src", adapter, dtype, adapter.numel(tensor))
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
        return self._finish(work, async_op, staged)

    def all_to_all_single(self, output: Any, input: Any, async_op: bool = False) -> Work | None:
        """Split ``input`` into world_size chunks; chunk r goes to rank r's ``output`` slot."""
        adapter, dtype = self._begin(input, "input")
        numel = adapter.numel(input)
        if numel % self._world_size:
            raise self._size_error("input", numel, "a multiple of world_size", self._world_size)
        self._check_pair(output, "output", adapter, dtype, numel)
        if self._world_size == 1:
            adapter.copy_(output, input)
            return _DONE if async_op else None
        staged_in = self._stage(adapter, input, dtype, "input")
        staged_out = self._stage(adapter, output, dtype, "output")
        work = self._all_to_all(staged_out.engine, staged_in.engine, async_op)
        return self._finish(work, async_op, staged_out)

    def barrier(self, async_op: bool = False) -> Work | None:
        """Wait until every rank has reached the barrier."""
        self._check_usable()
        if self._world_size == 1:
            return _DONE if async_op else None
        self.seq += 1
        return self._finish(self._barrier(async_op), async_op)

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
        staged = self._stage(adapter, tensor, dtype)
        return self._isend(staged.engine, dst, tag)

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
        staged = self._stage(adapter, tensor, dtype)
        work = self._irecv(staged.engine, src, tag)
        return ChainedWork(work, staged.write_back) if staged.copied else work

    # -- objects -----------------------------------------------------------------------------
    def broadcast_object(self, obj: Any, src: int = 0) -> Any:
        """Return ``src``'s ``obj`` on every rank (pickle protocol 5, out-of-band buffers)."""
        self._check_rank(src, "src")
        return obj if self._world_size == 1 else objects.broadcast_object(self._object_channel(), obj, src)

    def all_gather_object(self, obj: Any) -> list[Any]:
        """Return every rank's ``obj``, in rank order, on every rank."""
        self._check_usable()
        return [obj] if self._world_size == 1 else objects.all_gather_object(self._object_channel(), obj)

    def gather_object(self, obj: Any, dst: int = 0) -> list[Any] | None:
        """Return every rank's ``obj`` on ``dst``; None elsewhere."""
        self._check_rank(dst, "dst")
        return [obj] if self._world_size == 1 else objects.gather_object(self._object_channel(), obj, dst)

    def scatter_object(self, objs: Sequence[Any] | None, src: int = 0) -> Any:
        """Return ``objs[rank]`` from ``src`` (``objs`` is read on ``src`` only)."""
        self._check_rank(src, "src")
        if self._rank == src:
            objects.check_scatter_list(objs, self._world_size)
        if self._world_size == 1:
            assert objs is not None
            return objs[0]
        return objects.scatter_object(self._object_channel(), objs, src)

    def _object_channel(self) -> BaseCommunicator:
        """The communicator object bytes travel on (a GPU engine returns a CPU side channel)."""
        return self

    # -- groups ------------------------------------------------------------------------------
    def new_group(self, ranks: Sequence[int]) -> Communicator | NonMember:
        """Make a sub-communicator of ``ranks``; collective over this communicator.

        Members are numbered in ascending order of their rank here; other ranks get
        :data:`~distcomm.NON_MEMBER`. Every rank must pass the same ranks.
        """
        members = self._check_members(ranks)
        seen = self.all_gather_object(members)
        for r, other in enumerate(seen):
            if other != members:
                raise InvalidArgumentError(
                    f"new_group: rank {self._rank} passed ranks {list(members)} but rank {r} "
                    f"passed {list(other)}. HINT: every rank must call new_group with the same ranks."
                )
        index = 0 if self._rank in members else None
        return self._split([members], index)

    def split(self, color: int | None, key: int | None = None) -> Communicator | NonMember:
        """Split into sub-communicators by ``color`` (None: not a member), ordered by ``key``."""
        if color is not None and (not isinstance(color, int) or isinstance(color, bool) or color < 0):
            raise InvalidArgumentError(
                f"split: color {color!r} must be a non-negative int, or None to stay out. "
                "HINT: ranks with equal colors form one group."
            )
        if key is not None and (not isinstance(key, int) or isinstance(key, bool)):
            raise InvalidArgumentError(f"split: key {key!r} must be an int or None (None: by rank)")
        entries = self.all_gather_object((color, self._rank if key is None else key))
        colors = sorted({c for c, _ in entries if c is not None})
        groups = [
            tuple(sorted((r for r, (c, _) in enumerate(entries) if c == col), key=lambda r: (entries[r][1], r)))
            for col in colors
        ]
        index = None if color is None else colors.index(color)
        return self._split(groups, index)

    def finalize(self) -> None:
        """Release the engine's resources for this communicator. Idempotent."""
        if self.unusable != "finalized":
            self._finalize()
            self.unusable = "finalized"

    # -- engine primitives -------------------------------------------------------------------
    def _all_reduce(self, tensor: Any, op: ReduceOp, async_op: bool) -> Work | None:
        raise NotImplementedError

    def _broadcast(self, tensor: Any, src: int, async_op: bool) -> Work | None:
        raise NotImplementedError

    def _all_gather_into(self, output: Any, tensor: Any, async_op: bool) -> Work | None:
        raise NotImplementedError

    def _isend(self, tensor: Any, dst: int, tag: int) -> Work:
        raise NotImplementedError

    def _irecv(self, tensor: Any, src: int | None, tag: int) -> Work:
        """Receive into ``tensor``; the returned Work has ``source`` once complete."""
        raise NotImplementedError

    def _split(self, groups: list[tuple[int, ...]], index: int | None) -> Communicator | NonMember:
        """Create one communicator per group (ranks of this communicator, in member order).

        Called on every rank with the same ``groups``; ``index`` is this rank's group, or None.
        Return the new communicator, or NON_MEMBER when ``index`` is None.
        """
        raise NotImplementedError

    def _reduce(self, tensor: Any, dst: int, op: ReduceOp, async_op: bool) -> Work | None:
        target = tensor if self._rank == dst else adapter_for(tensor).clone(tensor)
        return self._all_reduce(target, op, async_op)

    def _reduce_scatter(self, output: Any, input: Any, op: ReduceOp, async_op: bool) -> Work | None:
        adapter = adapter_for(input)
        scratch = adapter.clone(input)
        _wait(self._all_reduce(scratch, op, async_op))
        numel = adapter.numel(output)
        adapter.copy_(output, adapter.flat(scratch)[self._rank * numel : (self._rank + 1) * numel])
        return None

    def _gather(self, output: Any | None, tensor: Any, dst: int, async_op: bool) -> Work | None:
        adapter = adapter_for(tensor)
        if output is None:
            output = adapter.empty(tensor, adapter.numel(tensor) * self._world_size)
        return self._all_gather_into(output, tensor, async_op)

    def _scatter(self, output: Any, full: Any | None, src: int, async_op: bool) -> Work | None:
        adapter = adapter_for(output)
        numel = adapter.numel(output)
        if full is None:
            full = adapter.empty(output, numel * self._world_size)
        _wait(self._broadcast(full, src, async_op))
        adapter.copy_(output, adapter.flat(full)[self._rank * numel : (self._rank + 1) * numel])
        return None

    def _all_to_all(self, output: Any, input: Any, async_op: bool) -> Work | None:
        adapter = adapter_for(input)
        chunk = adapter.numel(input) // self._world_size
        src_flat, out_flat = adapter.flat(input), adapter.flat(output)
        works = [
            self._irecv(out_flat[r * chunk : (r + 1) * chunk], r, _ALL_TO_ALL_TAG)
            for r in range(self._world_size)
            if r != self._rank
        ]
        works += [
            self._isend(src_flat[r * chunk : (r + 1) * chunk], r, _ALL_TO_ALL_TAG)
            for r in range(self._world_size)
            if r != self._rank
        ]
        me = slice(self._rank * chunk, (self._rank + 1) * chunk)
        adapter.copy_(out_flat[me], src_flat[me])
        for work in works:
            work.wait()
        return None

    def _barrier(self, async_op: bool) -> Work | None:
        return self._all_gather_into(bytearray(self._world_size), bytearray(1), async_op)

    def _finalize(self) -> None:
        """Free the engine's resources for this communicator."""

    # -- helpers -----------------------------------------------------------------------------
    def _check_usable(self) -> None:
        if self.unusable is not None:
            raise DistcommError(
                f"communicator {self.describe()} can no longer be used: {self.unusable}. "
                "HINT: create a new one with distcomm.init() after distcomm.finalize()."
            )

    def _begin(self, x: Any, what: str) -> tuple[Adapter, str]:
        self._check_usable()
        adapter = adapter_for(x, what)
        self.seq += 1
        return adapter, adapter.dtype(x)

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

    def _finish(
        self,
        work: Work | None,
        async_op: bool,
        staged: Staged | None = None,
        divide: int | None = None,
    ) -> Work | None:
        after: Callable[[], None] | None = None
        if divide is not None and staged is not None:
            engine, adapter = staged.engine, staged.adapter

            def after() -> None:
                adapter.divide_(engine, divide)
                staged.write_back()

        elif staged is not None and staged.copied:
            after = staged.write_back
        if async_op:
            inner = work if work is not None else _DONE
            return ChainedWork(inner, after) if after is not None else inner
        if work is not None:
            work.wait()
        if after is not None:
            after()
        return None

    def _finish_split(
        self, work: Work | None, async_op: bool, adapter: Adapter, out: Any, parts: list[Any]
    ) -> Work | None:
        def after() -> None:
            flat = adapter.flat(out)
            numel = adapter.numel(out) // len(parts)
            for r, part in enumerate(parts):
                adapter.copy_(part, flat[r * numel : (r + 1) * numel])

        if async_op:
            return ChainedWork(work if work is not None else _DONE, after)
        if work is not None:
            work.wait()
        after()
        return None

    def _warn_staging(self, device: str) -> None:
        if not self._warned_staging:
            self._warned_staging = True
            warnings.warn(
                f"backend {self.backend_name!r} moves CPU memory only: {device} tensors are "
                "copied through host memory (slower). HINT: use a GPU backend such as nccl.",
                DistcommWarning,
                stacklevel=4,
            )

    def _all_reduce_number(self, value: int | float, op: ReduceOp) -> int | float:
        if self._world_size == 1:
            return value / 1 if op is ReduceOp.AVG else value
        return objects.reduce_numbers(self.all_gather_object(value), op)

    def _check_rank(self, value: Any, name: str) -> None:
        self._check_usable()
        if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < self._world_size:
            raise InvalidArgumentError(
                f"{name}={value!r} is not a rank of {self.describe()}: valid ranks are 0.."
                f"{self._world_size - 1}. HINT: ranks are ranks of the communicator in use; map "
                "a world rank with comm.global_ranks.index(world_rank)."
            )

    @staticmethod
    def _check_tag(tag: Any) -> None:
        if not isinstance(tag, int) or isinstance(tag, bool) or tag < 0:
            raise InvalidArgumentError(f"tag={tag!r} must be a non-negative int")

    def _check_members(self, ranks: Sequence[int]) -> tuple[int, ...]:
        try:
            members = tuple(sorted(ranks))
        except TypeError:
            raise InvalidArgumentError(f"new_group: ranks {ranks!r} must be a sequence of ints") from None
        if not members or len(set(members)) != len(members) or not all(
            isinstance(r, int) and not isinstance(r, bool) and 0 <= r < self._world_size for r in members
        ):
            raise InvalidArgumentError(
                f"new_group: ranks {list(ranks)!r} must be distinct ranks of {self.describe()} "
                f"(0..{self._world_size - 1}), at least one. HINT: pass e.g. [0, 1]."
            )
        return members

    def _check_pair(self, x: Any, what: str, adapter: Adapter, dtype: str, numel: int | None) -> None:
        if adapter_for(x, what).kind != adapter.kind:
            raise InvalidArgumentError(f"{what} must be the same kind of array as the input ({adapter.kind})")
        other = adapter.dtype(x)
        if other != dtype:
            raise InvalidArgumentError(f"{what} has dtype {other!r} but the input has {dtype!r}. HINT: use one dtype.")
        if numel is not None and adapter.numel(x) != numel:
            raise self._size_error(what, adapter.numel(x), "", numel)

    def _check_list(self, parts: Any, what: str, adapter: Adapter, dtype: str, numel: int) -> None:
        if not isinstance(parts, (list, tuple)) or len(parts) != self._world_size:
            got = len(parts) if isinstance(parts, (list, tuple)) else type(parts).__name__
            raise InvalidArgumentError(
                f"{what} must be a list of {self._world_size} tensors (one per rank of "
                f"{self.describe()}), got {got!r}. HINT: [torch.empty_like(t) for _ in range(world_size)]."
            )
        for i, part in enumerate(parts):
            self._check_pair(part, f"{what}[{i}]", adapter, dtype, numel)

    def _check_root_list(
        self, parts: Any, what: str, root: int, root_name: str, adapter: Adapter, dtype: str, numel: int
    ) -> None:
        if self._rank == root:
            if parts is None:
                raise InvalidArgumentError(f"{what} is required on {root_name}={root} (this rank)")
            self._check_list(parts, what, adapter, dtype, numel)
        elif parts is not None:
            raise InvalidArgumentError(
                f"{what} must be None on rank {self._rank}: only {root_name}={root} passes it, as in "
                "torch.distributed. HINT: pass it only where rank == " + root_name + "."
            )

    def _size_error(self, what: str, got: int, rule: str, expected: int) -> InvalidArgumentError:
        rule = f" ({rule})" if rule else ""
        return InvalidArgumentError(
            f"{what} has {got} elements; expected {expected}{rule} on {self.describe()}."
        )


_ALL_TO_ALL_TAG = 2**30 + 7


def _wait(work: Work | None) -> None:
    if work is not None:
        work.wait()
